"""SGLang's host-memory check in the generated pod, with the pod's real memory limit.

SGLang 0.5.23 refuses a host pool larger than (min(MemAvailable, cgroup limit - usage) - 10 GiB)
/ ranks. Real here: the engine container's memory cgroup at the spec's ``limits.memory`` (SGLang
reads it), the kernel's MemAvailable, hugepages reserved for the pod's request. The hugepage
case (a 2 GiB hugepage pool in a 12 GiB limit, which SGLang refused before the host-allocator
hook checked it against hugepages) is tests/pod/test_serving_pod.py; this file shows the check
still guards 4 KiB pools, and that the planner sizes memory so it passes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .harness import admin_config, load_cr, plan_pod, running_pod, start_pod

pytestmark = pytest.mark.pod

GIB = 1 << 30


def four_k_cr(memory: str) -> dict:
    cr = load_cr("cpu/tiny-llama-embedded.yaml")
    cr["spec"]["hiCache"]["hostAllocator"]["hugePageSize"] = "none"
    cr["spec"]["resources"]["memory"] = memory
    return cr


@pytest.mark.timeout(1200)
def test_a_4k_pool_starts_at_the_planned_memory_and_is_refused_below_it(
        node, image, workdir: Path, models_dir: Path) -> None:
    cr = four_k_cr("16Gi")  # 4 GiB process + 10 GiB SGLang reserve + 2 GiB pool
    with running_pod(cr, node, image, workdir / "fits", models_dir) as (_, c):
        assert c.generate("a short prompt")["meta_info"]["prompt_tokens"] > 0
    # The same pod with 3 GiB less memory: SGLang's own check must still refuse the 4 KiB pool.
    planned = plan_pod(cr, admin_config(node))
    limits = planned.statefulset["spec"]["template"]["spec"]["containers"][0]["resources"]
    limits["limits"]["memory"] = limits["requests"]["memory"] = "13Gi"
    pod = start_pod(planned, node, image, workdir / "short", {"tiny-models": models_dir})
    try:
        engine = pod.container("engine")
        pod.wait(lambda: engine.exit_codes != [], 300, "engine exit")
        assert "Not enough host memory available" in engine.log_text(20000)
        assert not engine.ready
    finally:
        pod.close()
