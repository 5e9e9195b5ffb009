"""Configuration revisions in the engine container (``hicache_umbp.launch.revision``).

Real: the selection from the container's variables, the downward API file format (as the
kubelet writes it: ``key="value"`` lines, Go-quoted), and the watcher as a forked process that
signals its parent, which here is a stand-in engine (a Python process with SIGTERM handling, as
SGLang's HTTP server has) instead of SGLang. The file is rewritten the way the kubelet's atomic
writer does (a new file renamed over the old).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hicache_umbp.launch.errors import LaunchError
from hicache_umbp.launch.noderoot import NodeRoot
from hicache_umbp.launch.revision import (
    CONFIG_ANNOTATION,
    CONFIG_REVISION_ENV,
    annotated_revision,
    config_key,
    parse_annotations,
    select_revision,
    watch_revision,
)

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[2]


def test_the_pods_revision_is_selected_and_the_others_removed() -> None:
    env = {"PATH": "/bin", CONFIG_REVISION_ENV: "b2",
           config_key("a1"): json.dumps({"HICACHE_TP_SIZE": "1", "X": "old"}),
           config_key("b2"): json.dumps({"HICACHE_TP_SIZE": "2", "X": "new"})}
    plain, revision = select_revision(env)
    assert revision == "b2"
    assert plain == {"PATH": "/bin", "HICACHE_TP_SIZE": "2", "X": "new"}
    # Without a revision variable (every other update strategy) nothing changes.
    assert select_revision({"HICACHE_TP_SIZE": "1"}) == ({"HICACHE_TP_SIZE": "1"}, None)


@pytest.mark.parametrize(("env", "message"), [
    ({CONFIG_REVISION_ENV: "zz", config_key("a1"): "{}"}, "has no HICACHE_CONFIG_zz; it holds "
                                                          "['a1']"),
    ({CONFIG_REVISION_ENV: ""}, "the pod has no hicache.sglang.ai/config-hash annotation"),
    ({CONFIG_REVISION_ENV: "a1", config_key("a1"): "[1]"}, "must be a JSON object of strings"),
    ({CONFIG_REVISION_ENV: "a1", config_key("a1"): json.dumps({CONFIG_REVISION_ENV: "b"})},
     "may not set"),
])
def test_a_missing_or_bad_revision_is_a_clear_launch_error(
        env: dict[str, str], message: str) -> None:
    with pytest.raises(LaunchError) as err:
        select_revision(env)
    assert err.value.reason == "InvalidConfig" and message in str(err.value)


def test_annotations_file_as_the_kubelet_writes_it(tmp_path: Path) -> None:
    text = ('kubectl.kubernetes.io/default-container="engine"\n'
            f'{CONFIG_ANNOTATION}="9f4400c5812b4e50"\n'
            'note="a \\"quoted\\" value\\nwith a newline"\n')
    assert parse_annotations(text) == {
        "kubectl.kubernetes.io/default-container": "engine",
        CONFIG_ANNOTATION: "9f4400c5812b4e50", "note": 'a "quoted" value\nwith a newline'}
    (tmp_path / "var/run/hicache-pod").mkdir(parents=True)
    assert annotated_revision(NodeRoot(tmp_path)) is None
    (tmp_path / "var/run/hicache-pod/annotations").write_text(text)
    assert annotated_revision(NodeRoot(tmp_path)) == "9f4400c5812b4e50"


def test_the_watcher_stops_the_engine_only_on_another_revision(tmp_path: Path) -> None:
    file = tmp_path / "annotations"
    file.write_text(f'{CONFIG_ANNOTATION}="a1"\n')
    signals: list[int] = []
    reads = iter(["a1", None, "a1", "b2"])

    def sleep(_: float) -> None:
        value = next(reads, "b2")
        file.write_text("" if value is None else f'{CONFIG_ANNOTATION}="{value}"\n')

    new = watch_revision(NodeRoot("/"), "a1", 4242, path=str(file), alive=lambda _: not signals,
                         kill=lambda pid, sig: signals.append(sig), sleep=sleep)
    assert new == "b2" and signals == [15]  # SIGTERM once; the engine ended within the grace
    assert next(reads, "done") == "done"  # it read a1, nothing, a1, then b2


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def test_the_forked_watcher_stops_its_engine_for_a_new_revision(tmp_path: Path) -> None:
    """The launcher forks the watcher and becomes the engine (exec); the engine here is the
    same process going on in Python. A new revision in the file: SIGTERM to the engine, which
    exits; the same revision rewritten changes nothing."""
    pod_info = tmp_path / "var/run/hicache-pod"
    pod_info.mkdir(parents=True)
    annotations = pod_info / "annotations"
    _atomic_write(annotations, f'{CONFIG_ANNOTATION}="a1"\n')
    marker = tmp_path / "stopped"
    script = textwrap.dedent(f"""
        import signal, sys, time
        from hicache_umbp.launch.noderoot import NodeRoot
        from hicache_umbp.launch.revision import start_watcher
        def stop(*_):
            open({str(marker)!r}, "w").write("SIGTERM")
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
        watcher = start_watcher(NodeRoot({str(tmp_path)!r}), "a1")
        print(watcher, flush=True)
        time.sleep(60)
    """)
    engine = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert engine.stdout is not None
        watcher = int(engine.stdout.readline())
        _atomic_write(annotations, f'{CONFIG_ANNOTATION}="a1"\nother="x"\n')
        time.sleep(2.5)  # two reads of the same revision: nothing happens
        assert engine.poll() is None and not marker.exists()
        _atomic_write(annotations, f'{CONFIG_ANNOTATION}="b2"\n')
        assert engine.wait(30) == 0
        assert marker.read_text() == "SIGTERM"
        _, stderr = engine.communicate(timeout=10)
        assert "configuration revision changed from a1 to b2" in stderr
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and Path(f"/proc/{watcher}").exists() and \
                "Z" not in Path(f"/proc/{watcher}/stat").read_text().split()[2]:
            time.sleep(0.1)  # the watcher leaves once its engine is gone
        assert not Path(f"/proc/{watcher}").exists() or \
            Path(f"/proc/{watcher}/stat").read_text().split()[2] == "Z"
    finally:
        engine.kill()
        engine.wait(10)


def test_the_watcher_restarts_the_engine_on_kubectls_restart_request(tmp_path: Path) -> None:
    """``kubectl rollout restart`` under InPlaceIfPossible: the operator carries the template's
    ``restartedAt`` to each pod (same revision); a new value stops the engine, the same one
    (or none) does not. The watcher's SIGKILL waits ``grace_s`` (the planner's stop grace)."""
    file = tmp_path / "annotations"
    stamp = 'kubectl.kubernetes.io/restartedAt="2027-01-15T08:00:00Z"\n'
    file.write_text(f'{CONFIG_ANNOTATION}="a1"\n{stamp}')
    signals: list[int] = []
    slept: list[float] = []
    later = f'{CONFIG_ANNOTATION}="a1"\nkubectl.kubernetes.io/restartedAt="2027-01-15T09:00:00Z"\n'
    reads = iter([f'{CONFIG_ANNOTATION}="a1"\n{stamp}', f'{CONFIG_ANNOTATION}="a1"\n', later])

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        file.write_text(next(reads, later))

    got = watch_revision(NodeRoot("/"), "a1", 4242, path=str(file), grace_s=3.0,
                         alive=lambda _: True, kill=lambda pid, sig: signals.append(sig),
                         sleep=sleep, restarted_at="2027-01-15T08:00:00Z")
    assert got == "a1" and signals == [15, 9]  # never ended: SIGKILL after the grace
    assert len(slept) == 3 + 3  # three reads before the change, then 3 s of grace
