"""SGLang's built-in ``mori`` backend (``spec.l3.backend: sglang-mori``) in the generated pod.

Real, as in test_serving_pod.py: the planner's objects, the launcher, SGLang 0.5.23 serving with
its own ``UMBPStore`` and host allocator over the real amd-mori 1.2.4, a real
``umbp_standalone_server`` sidecar, hugepages reserved in the kernel and the containers' memory
cgroup limits. Faked: the GPUs and the compute device (CPU).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .harness import Client, admin_config, load_cr, plan_pod, start_pod
from .test_restart_pod import restart_engine
from .test_serving_pod import PROMPT, assert_operator_reads, capture_metrics, fillers

pytestmark = pytest.mark.pod


def _metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"{re.escape(name)}\{{(.*)\}} (\S+)$", line)
        if m and all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            total += float(m.group(2))
    return total


def _memfd_mappings(pid: int) -> set[str]:
    """The memfd regions (address range and name) process ``pid`` has mapped."""
    with open(f"/proc/{pid}/maps") as f:
        return {f"{fields[0]} {fields[5].strip()}"
                for fields in (line.split(maxsplit=5) for line in f)
                if len(fields) == 6 and fields[5].startswith("/memfd:")}


def _hugetlb_bytes(pid: int) -> int:
    """Hugetlb memory mapped by ``pid`` and every process below it (the SGLang schedulers)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                total += sum(int(line.split()[1]) * 1024 for line in f
                             if line.startswith(("Private_Hugetlb:", "Shared_Hugetlb:")))
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


@pytest.mark.timeout(900)
def test_builtin_embedded_pod_serves_from_a_hugepage_pool_over_sglangs_memory_check(
        node, image, workdir: Path, models_dir: Path) -> None:
    """The 2 GiB host pool is on hugepages; the engine's 12 Gi memory limit leaves SGLang's own
    check (limit - usage - 10 GiB) short of it. Without the hook's hugepage budget the scheduler
    refuses the pool ("Not enough host memory available") and the pod never gets Ready."""
    planned = plan_pod(load_cr("cpu/tiny-llama-builtin.yaml"), admin_config(node))
    pod = start_pod(planned, node, image, workdir, {"tiny-models": models_dir})
    try:
        pod.wait_ready(600)
        engine = pod.container("engine")
        assert "--hicache-storage-backend mori" in engine.log_text(200_000)
        assert engine.proc is not None
        # the 2 GB pool (--hicache-size 2) is in hugepages: SGLang did not demote it
        assert _hugetlb_bytes(engine.proc.pid) >= 2 * 10**9
        c = Client(30012)
        cold = c.generate(PROMPT)
        again = c.generate(PROMPT)
        assert again["meta_info"]["cached_tokens_details"]["device"] > 0
        for text in fillers(4):
            c.generate(text)
        host = c.generate(PROMPT)
        assert host["meta_info"]["cached_tokens_details"]["host"] > 0, host["meta_info"]
        assert cold["text"] == again["text"] == host["text"]
        metrics = c.metrics()
        assert _metric(metrics, "sglang:backuped_tokens_total", storage_backend="mori") > 0
    finally:
        pod.close()


@pytest.mark.timeout(1200)
def test_builtin_standalone_serves_storage_hits_after_an_engine_restart(
        node, image, workdir: Path, models_dir: Path) -> None:
    planned = plan_pod(load_cr("cpu/tiny-llama-builtin-standalone.yaml"),
                       admin_config(node))
    pod = start_pod(planned, node, image, workdir, {"tiny-models": models_dir})
    try:
        pod.wait_ready(600)
        assert "mode=standalone-process" in pod.container("engine").log_text(200_000)
        c = Client(30013)
        cold = c.generate(PROMPT)
        for text in fillers(4):
            c.generate(text)
        host = c.generate(PROMPT)
        assert host["meta_info"]["cached_tokens_details"]["host"] > 0, host["meta_info"]
        sidecar = pod.container("umbp-dram")
        assert sidecar.proc is not None
        sidecar_pid = sidecar.proc.pid
        registered = _memfd_mappings(sidecar_pid)  # the engine's host pool, mapped zero-copy
        assert registered
        restart_engine(pod)
        assert sidecar.proc.pid == sidecar_pid  # the L3 cache lived through the restart
        warm = c.generate(PROMPT)
        details = warm["meta_info"]["cached_tokens_details"]
        assert details["storage"] > 0 and details["device"] == details["host"] == 0, details
        assert warm["text"] == cold["text"]
        metrics = c.metrics()
        assert _metric(metrics, "sglang:cached_tokens_total", cache_source="storage") > 0
        assert _metric(metrics, "sglang:storage_prefetch_hit_tokens_total") > 0
        # mori 1.2.4 would keep the dead engine's registration mapped (and its hugepages held):
        # the launcher released it, so the sidecar maps one pool, the new engine's (the restart
        # itself only succeeded because the hugepages came back).
        after = _memfd_mappings(sidecar_pid)
        assert len(after) == len(registered) == 1, (registered, after)
        assert "released the host pool registration" in pod.container("engine").log_text(200_000)
    finally:
        pod.close()


@pytest.mark.timeout(1200)
def test_builtin_sidecar_restart_leaves_l3_writes_failing_and_the_operator_reads_it(
        node, image, workdir: Path, models_dir: Path) -> None:
    """SGLang's built-in client never reconnects to a restarted standalone sidecar (mori 1.2.4):
    every later L3 write fails while SGLang keeps serving from the device and the host pool.
    The page SGLang then serves is the one the operator reads as ``l3Writes: Failing`` (its
    ``StorageWritesFailing`` Event): host backups, no L3 backup."""
    from hicache_operator.cachestats import scrape_cache_figures

    planned = plan_pod(load_cr("cpu/tiny-llama-builtin-standalone.yaml"), admin_config(node))
    pod = start_pod(planned, node, image, workdir, {"tiny-models": models_dir})
    try:
        pod.wait_ready(600)
        sidecar = pod.container("umbp-dram")
        before = sidecar.restarts
        sidecar.kill(grace_s=5, reason="Killing")
        pod.wait(lambda: sidecar.restarts > before and sidecar.started.is_set(), 120,
                 "the umbp-dram sidecar restarted")
        c = Client(30013)
        cold = c.generate(PROMPT)
        pushed = [c.generate(text) for text in fillers(4)]
        host = c.generate(PROMPT)
        assert host["meta_info"]["cached_tokens_details"]["host"] > 0, host["meta_info"]
        assert host["text"] == cold["text"]  # serving goes on without L3
        metrics = c.metrics()
        assert _metric(metrics, "sglang:backuped_tokens_total", storage_backend="mori") == 0
        told = [cold, *pushed, host]
        assert_operator_reads(30013, told)
        assert scrape_cache_figures("http://127.0.0.1:30013").l3_writes == "Failing"
        capture_metrics(metrics, "tp1-sglang-mori-sidecar-restarted", told)
    finally:
        pod.close()

