"""The operator/pod boundary: for every example CR, the env and resources the operator's planner
puts on the engine container, fed to the launcher on a node that matches the pod, give a
coherent SGLang command.

Real: the operator's planner (``hicache_operator.plan.orchestrate``) on examples/*.yaml, its
ConfigMap and StatefulSet, the launcher's CLI (``main --dry-run --json``) and every check it
runs. Faked: the node (an MI355X sysfs tree whose GPU count, cgroup hugetlb limits and free
hugepages are exactly what the pod requested), the standalone sidecars (listening UNIX
sockets), and the SSD filesystem's size (``statvfs`` reports the volume size the operator
planned, since the machine running the tests has no multi-TiB disk).
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml
from hicache_operator.api.config import OperatorConfig
from hicache_operator.api.quantity import parse_bytes
from hicache_operator.plan.orchestrate import plan
from hicache_umbp.contract.names import ADAPTER_MODULE
from hicache_umbp.launch import __main__ as cli
from hicache_umbp.launch.noderoot import NodeRoot

from .fakenode import MI355X_BDFS, FakeNode

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))
LAUNCHER_RESOLVED_KEYS = {"host_numa", "umbp_dram_numa"}


class SizedNodeRoot(NodeRoot):
    """A node root whose SSD mounts report their declared sizes as free space."""

    def __init__(self, root: Path, sizes: dict[str, int]) -> None:
        super().__init__(root)
        self.sizes = sizes

    def statvfs(self, node_path: str) -> os.statvfs_result:
        real = super().statvfs(node_path)
        mount = max((m for m in self.sizes if node_path == m or node_path.startswith(m + "/")),
                    key=len, default=None)
        if mount is None:
            return real
        blocks = self.sizes[mount] // 4096
        return os.statvfs_result((4096, 4096, blocks, blocks, blocks, real.f_files,
                                  real.f_ffree, real.f_favail, real.f_flag, real.f_namemax))


def _objects(p: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    by_kind = {o["kind"]: o for o in p.objects}
    return by_kind["ConfigMap"], by_kind["StatefulSet"]


def _resolved_env(configmap: dict[str, Any], sts: dict[str, Any],
                  engine: dict[str, Any]) -> dict[str, str]:
    """The engine container's environment as a kubelet resolves it at container start:
    ``envFrom`` the ConfigMap, then ``env`` (values, and fieldRefs to pod annotations)."""
    env = dict(configmap["data"])
    annotations = sts["spec"]["template"]["metadata"]["annotations"]
    for e in engine.get("env", []):
        path = ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath", "")
        if "value" in e:
            env[e["name"]] = e["value"]
        elif path.startswith("metadata.annotations['"):
            env[e["name"]] = annotations[path[len("metadata.annotations['"):-2]]
    return env


@pytest.mark.parametrize("strategy", ["RollingUpdate", "InPlaceIfPossible"])
@pytest.mark.parametrize("example", EXAMPLES, ids=[e.stem for e in EXAMPLES])
def test_planner_output_gives_a_coherent_launch(
    example: Path, strategy: str, tmp_path: Path, listeners: list[socket.socket],
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With InPlaceIfPossible the ConfigMap holds configuration revisions and the pod selects
    one by its annotation (``launch.revision``): the launch must be the very same."""
    cr = yaml.safe_load(example.read_text())
    cr["spec"]["updateStrategy"] = {"type": strategy}
    p = plan(cr, OperatorConfig())
    configmap, sts = _objects(p)
    pod = sts["spec"]["template"]["spec"]
    engine = next(c for c in pod["containers"] if c["name"] == "engine")
    assert engine["command"] == ["python", "-m", "hicache_umbp.launch"]
    env = _resolved_env(configmap, sts, engine)

    # The node as the pod sees it: its GPUs, its hugetlb limits, enough free pages.
    node = FakeNode(tmp_path / "node")
    limits = engine["resources"]["limits"]
    gpus = int(limits["amd.com/gpu"])
    node.cpu_kfd_nodes()
    for i, bdf in enumerate(MI355X_BDFS[:gpus]):
        node.add_gpu(bdf, i // 4, 128 + 8 * i)
    hugepages = {parse_bytes(k.removeprefix("hugepages-")): parse_bytes(v)
                 for k, v in limits.items() if k.startswith("hugepages-")}
    node.cgroup_v2(dict(hugepages))
    for page, limit in hugepages.items():
        node.hugepages(page, free=limit // page, per_numa={0: limit // page, 1: limit // page})
    root = NodeRoot(node.root)
    mounts = {m["mountPath"] for m in engine["volumeMounts"]}
    drives = {d.mount_path: d.volume_bytes or p.ssd.capacity for d in p.ssd.drives
              if d.mount_path in mounts}  # the engine holds these drives (else a sidecar)
    for mount in drives:
        node.ssd_mount(mount)
    if drives:
        root = SizedNodeRoot(node.root, drives)
    for c in pod.get("initContainers", []) + pod["containers"]:
        probe = c.get("startupProbe", {}).get("exec", {}).get("command", [])
        if probe[:2] == ["test", "-S"]:  # a sidecar: play it with a listening socket pair
            for path in (probe[2], probe[2] + ".fd.sock"):
                node.p(path).parent.mkdir(parents=True, exist_ok=True)
                s = socket.socket(socket.AF_UNIX)
                s.bind(str(node.p(path)))
                s.listen(1)
                listeners.append(s)

    monkeypatch.setattr(cli, "NodeRoot", lambda _: root)
    rc = cli.main(["--dry-run", "--json", "--node-root", str(node.root)], env)
    out = capsys.readouterr()
    assert rc == 0, out.err
    launched = json.loads(out.out)
    report = launched["report"]
    assert report["ok"] is True and report["warnings"] == []
    annotations = sts["spec"]["template"]["metadata"]["annotations"]
    assert report["config_revision"] == (annotations["hicache.sglang.ai/config-hash"]
                                         if strategy == "InPlaceIfPossible" else None)
    assert report["numa_per_rank"] == [i // 4 for i in range(gpus)]

    # The same SGLang command the operator shows, plus only what the node resolved.
    argv, planned = launched["argv"], list(p.engine.sglang_argv)
    flag = "--hicache-storage-backend-extra-config"
    i, j = argv.index(flag), planned.index(flag)
    assert argv[1:i] == planned[1:j] and argv[i + 2:] == planned[j + 2:]
    got, want = json.loads(argv[i + 1]), json.loads(planned[j + 1])
    assert got["module_path"] == ADAPTER_MODULE
    assert {k: v for k, v in got.items() if k not in LAUNCHER_RESOLVED_KEYS} == want
    assert set(got) - set(want) <= LAUNCHER_RESOLVED_KEYS
    numa = report["numa_per_rank"]
    assert got["host_numa"] == (numa[0] if len(set(numa)) == 1 else numa)
    if p.spec.l3.mode == "embedded":
        assert got["umbp_dram_numa"] == got["host_numa"]
        assert (report["ssd"] is not None) == p.ssd.enabled
    else:
        assert report["standalone"]["sockets"]
