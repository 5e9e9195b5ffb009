"""The L3 tier across an engine restart, in the generated pod (see test_serving_pod.py for
what is real). The kubelet restarts the engine container after its main process dies, exactly
as Kubernetes does (same pod, same volumes, same sidecars, CrashLoopBackOff delay, a fresh
writable layer).

The storage hit after the restart used to come and go: SGLang builds the C++ extension that
hashes a prefetch's pages on first use, inside the first request's prefetch timeout, and an
engine killed while building it left the restarted engine to build it from scratch within that
timeout (hicache_umbp.sglang.page_hash has the evidence). Now the image ships it built, each
scheduler loads it before the engine is ready, and the test waits, by counting, until every
token SGLang backed up to L2 reached L3 before it kills the engine: the whole prompt must then
come from storage, every run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .harness import load_cr, running_pod
from .test_serving_pod import PROMPT, assert_operator_reads, capture_metrics, fillers

pytestmark = pytest.mark.pod


def restart_engine(pod) -> None:
    engine = pod.container("engine")
    before = engine.restarts
    engine.kill(grace_s=30, reason="Killing")
    pod.wait(lambda: engine.restarts > before, 120, "engine restarted")
    pod.wait_ready(600)


def assert_nothing_compiled_at_run_time(pod: Any) -> None:
    """The restarted engine got a fresh writable layer (as from a kubelet) and served storage
    hits without JIT-compiling SGLang's page-hash extension into it: the image ships it built
    (TORCH_EXTENSIONS_DIR, images/engine/Dockerfile)."""
    engine = pod.container("engine")
    assert engine.restarts >= 1 and engine.layer is not None
    home = engine.layer / pod.image.home.strip("/").replace("/", "_")
    built = sorted(str(p.relative_to(home)) for p in home.rglob("torch_extensions/**/*.so"))
    assert not built, f"the engine compiled {built} into its writable layer at run time"
    # and the image's prebuilt extension was loaded as built, not rebuilt (ninja: up to date)
    (source,) = pod.image.files.values()
    so = "hicache_hash_cpp/hicache_hash_cpp.so"
    copy = engine.layer / "image-files" / "0" / so
    assert copy.stat().st_mtime_ns == (Path(source) / so).stat().st_mtime_ns


@pytest.mark.timeout(1200)
def test_standalone_l3_serves_storage_hits_after_an_engine_restart(
        node, image, workdir: Path, models_dir: Path) -> None:
    cr = load_cr("cpu/tiny-llama-standalone.yaml")
    with running_pod(cr, node, image, workdir, models_dir) as (pod, c):
        cold = c.generate(PROMPT)
        for text in fillers(4):
            c.generate(text)
        host = c.generate(PROMPT)
        assert host["meta_info"]["cached_tokens_details"]["host"] > 0, host["meta_info"]
        c.wait_backups_in_l3()
        sidecars = {s.name: s.proc and s.proc.pid for s in pod.containers if s.role == "sidecar"}
        restart_engine(pod)
        # the sidecars are the same processes: the L3 cache lived through the restart
        assert {s.name: s.proc and s.proc.pid for s in pod.containers
                if s.role == "sidecar"} == sidecars
        warm = c.generate(PROMPT)
        details = warm["meta_info"]["cached_tokens_details"]
        # Every full page of the prompt (the tokenizer gives 1681 tokens: 105 pages of 16).
        full_pages = warm["meta_info"]["prompt_tokens"] // 16 * 16
        print(f"storage-hit tokens after the restart: {(details or {}).get('storage')} of "
              f"{full_pages}")
        assert details and details["storage"] == full_pages, warm["meta_info"]
        assert details["device"] == details["host"] == 0, details
        assert warm["text"] == cold["text"]
        assert_nothing_compiled_at_run_time(pod)
        metrics = c.metrics()
        assert 'sglang:cached_tokens_total{cache_source="storage"' in metrics
        # the store's own families are on the engine's /metrics (hicache_umbp.store.metrics)
        assert "hicache_umbp_ssd_refused_keys_total" in metrics
        assert_operator_reads(30001, [warm])  # the restarted server counts from zero
        capture_metrics(metrics, "tp1-umbp-standalone-after-restart", [warm])


@pytest.mark.timeout(1200)
def test_embedded_mori_ssd_starts_cold_after_an_engine_restart(
        node, image, workdir: Path, models_dir: Path) -> None:
    """What mori's SSD node (``spec.l3.ssd.engine: mori``, still selectable) does with its
    directory on an engine restart: the emptyDir (same pod) still holds the segment files, and
    mori 1.2.4's SSD node discards them when it starts (docs/operations.md, "Warm cache across
    restarts"): no storage hit, said in the log. Our SSD tier keeps them: test_ssd_pod.py."""
    cr = load_cr("cpu/tiny-llama-embedded.yaml", **{"spec.l3.ssd.engine": "mori"})
    with running_pod(cr, node, image, workdir, models_dir) as (pod, c):
        c.generate(PROMPT)
        for text in fillers(4):
            c.generate(text)
        ssd_dir = pod.volume_host_path("umbp-ssd")
        written = sum(f.stat().st_size for f in ssd_dir.rglob("segment_*"))
        assert written > 0, "the write-back never reached the embedded SSD tier"
        restart_engine(pod)
        after = c.generate(PROMPT)
        assert after["meta_info"]["cached_tokens"] == 0, after["meta_info"]
        log = pod.container("engine").log_text(400000).rsplit("==== start", 1)[-1]
        assert "discards" in log and "bytes of SSD cache from an earlier process" in log
