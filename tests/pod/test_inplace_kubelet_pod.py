"""The kubelet imitation on a pod update (tests of the imitation itself, no SGLang).

What a kubelet does when the API server stores an update of a running pod, and what the tier
now does too: a container whose image changed is killed and started anew, with its env resolved
again (``envFrom`` the ConfigMap as it is now, ``fieldRef`` annotations as they are now); the
other containers keep running; changed annotations rewrite the downward API volume's files
(atomically) and restart nothing; any other change of the spec is refused (the Pod update
rule). Real: the processes, their environment, the volume files. The container is the engine
image's Python.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from .podspec import PodMeta
from .runtime import Pod

pytestmark = pytest.mark.pod

SECURITY = {"capabilities": {"drop": ["ALL"]}, "allowPrivilegeEscalation": False,
            "seccompProfile": {"type": "RuntimeDefault"}}
APP = """
import json, os, time
out = {"pid": os.getpid(), "rev": os.environ.get("REV"), "x": os.environ.get("X"),
       "annotations": open("/podinfo/annotations").read()}
open(f"/out/app-{os.getpid()}.json", "w").write(json.dumps(out))
time.sleep(3600)
"""


def _container(name: str, code: str, image: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": image, "command": ["python", "-c", code],
            "securityContext": SECURITY,
            "resources": {"limits": {"cpu": "1", "memory": "512Mi"},
                          "requests": {"cpu": "1", "memory": "512Mi"}}, **extra}


def _spec(image: str) -> dict[str, Any]:
    sidecar = _container("side", "import time; time.sleep(3600)", "side:1",
                         restartPolicy="Always")
    app = _container("app", APP, image, envFrom=[{"configMapRef": {"name": "cm"}}],
                     env=[{"name": "REV", "valueFrom": {"fieldRef": {
                         "fieldPath": "metadata.annotations['rev']"}}}],
                     volumeMounts=[{"name": "out", "mountPath": "/out"},
                                   {"name": "podinfo", "mountPath": "/podinfo",
                                    "readOnly": True}])
    return {"securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "fsGroup": 10001},
            "terminationGracePeriodSeconds": 5, "initContainers": [sidecar],
            "containers": [app],
            "volumes": [{"name": "out", "emptyDir": {}},
                        {"name": "podinfo", "downwardAPI": {"items": [
                            {"path": "annotations",
                             "fieldRef": {"fieldPath": "metadata.annotations"}}]}}]}


def _reports(pod: Pod) -> list[dict[str, Any]]:
    out = pod.volume_host_path("out")
    return sorted((json.loads(p.read_text()) for p in out.glob("app-*.json")),
                  key=lambda r: r["pid"])


def test_an_image_change_restarts_that_container_only_and_annotations_restart_nothing(
        node, image, workdir: Path) -> None:
    meta = PodMeta(name="kubelet-0", namespace="hicache-test", labels={"app": "x"},
                   annotations={"rev": "a"})
    pod = Pod(meta, _spec("app:1"), {"cm": {"X": "1"}}, node, image, workdir / meta.name)
    try:
        pod.start()
        pod.wait(lambda: len(_reports(pod)) == 1, 60, "the app's first report")
        first = _reports(pod)[0]
        assert (first["rev"], first["x"]) == ("a", "1")
        assert first["annotations"] == 'rev="a"\n'
        side = pod.container("side").proc.pid  # type: ignore[union-attr]

        # New annotations and ConfigMap data: the volume file changes, nothing restarts.
        pod.configmaps["cm"] = {"X": "2"}
        assert pod.update({"app": "x"}, {"rev": "b"}, _spec("app:1")) == []
        podinfo = pod.volume_host_path("podinfo")
        assert (podinfo / "annotations").read_text() == 'rev="b"\n'
        assert (podinfo / "annotations").is_symlink()  # published through ..data
        time.sleep(2)
        assert len(_reports(pod)) == 1 and pod.container("app").restarts == 0

        # A new image: that container restarts, its env resolved again; the sidecar stays.
        assert pod.update({"app": "x"}, {"rev": "b"}, _spec("app:2")) == ["app"]
        pod.wait(lambda: len(_reports(pod)) == 2, 60, "the restarted app's report")
        second = _reports(pod)[1]
        assert second["pid"] != first["pid"]
        assert (second["rev"], second["x"]) == ("b", "2")
        assert pod.container("app").restarts == 1
        assert pod.container("side").proc.pid == side  # type: ignore[union-attr]
        assert pod.container("side").restarts == 0

        # Anything else a Pod update may not change is refused.
        changed = _spec("app:2")
        changed["containers"][0]["env"].append({"name": "Y", "value": "1"})
        with pytest.raises(ValueError, match="pod updates may not change"):
            pod.update({"app": "x"}, {"rev": "b"}, changed)
    finally:
        pod.close()
