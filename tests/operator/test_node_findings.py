"""What a real MI355X node needs from the plan (issue: findings 5, 6, 7, 9 and 10).

Pure planner tests on the examples a user applies. What they cannot show here (no cluster, no
GPU): a download repeated into a fresh writable layer, an OOM kill of a sidecar whose pool
fills, a SIGTERM cutting a generation. The nearest real checks: the pod tier runs the drain hook
and the fresh layer (tests/pod/test_strict_node_pod.py, test_restart_pod.py), the mori tier
measures the sidecar's charge (tests/backend/test_sidecar_memory_mori.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hicache_operator.api.config import OperatorConfig
from hicache_operator.plan import plan
from hicache_operator.planner.pod_overhead import (
    DRAIN_TIMEOUT_S,
    SIDECAR_PROCESS_MEMORY,
    page_table_bytes,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
GIB = 1 << 30
START_WARNINGS = ("Hugging Face id and there is no model volume", "kubelet's root disk",
                  "host pool is smaller than the GPU's KV pool", "NUMA placement degraded",
                  "rejects the engine container")


def _cr(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load((ROOT / "examples" / name).read_text()))


def _plan(cr: dict[str, Any], **config: Any) -> Any:
    return plan(cr, OperatorConfig.from_mapping(config) if config else OperatorConfig())


def _pod(p: Any) -> dict[str, Any]:
    sts = next(o for o in p.objects if o["kind"] == "StatefulSet")
    return dict(sts["spec"]["template"]["spec"])


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_can_start_as_written(example: Path) -> None:
    """Finding 5 (and the other findings' warnings): no example downloads its weights into the
    writable layer, keeps its SSD tier on the root disk, starves its host pool, loses NUMA
    placement or is refused by the recommended topology policy."""
    p = _plan(dict(yaml.safe_load(example.read_text())))
    found = [w for w in p.warnings if any(s in w for s in START_WARNINGS)]
    assert not found, found
    assert p.spec.model.volume is not None


def test_a_hub_model_without_a_volume_and_a_root_disk_ssd_are_warned() -> None:
    cr = _cr("llama-3.1-70b-mi355x.yaml")
    cr["spec"]["model"] = {"path": "meta-llama/Llama-3.1-70B-Instruct", "attention": "mha"}
    cr["spec"]["l3"]["ssd"]["volume"] = {"emptyDir": {"sizeLimit": "900Gi"}}
    warnings = _plan(cr).warnings
    assert any("downloads the weights into the container's writable layer" in w
               for w in warnings)
    assert any("kubelet's root disk" in w and "local-NVMe StorageClass" in w for w in warnings)


def test_a_host_pool_below_the_gpus_kv_pool_is_warned_with_the_size_that_fits() -> None:
    """Finding 6: the old Llama example, 64Gi per rank (--hicache-size 68) against ~226 GiB of
    KV pool per rank on a MI355X."""
    cr = _cr("llama-3.1-70b-mi355x.yaml")
    cr["spec"]["hiCache"]["hostPoolPerRank"] = "64Gi"
    (warning,) = [w for w in _plan(cr).warnings if "smaller than the GPU's KV pool" in w]
    assert "--hicache-size 68" in warning and "hostPoolPerRank >= 227Gi" in warning
    cr["spec"]["hiCache"]["hostPoolPerRank"] = "227Gi"
    assert not [w for w in _plan(cr).warnings if "KV pool" in w]


def test_sys_nice_is_requested_for_numa_binding_where_the_policy_allows_it() -> None:
    """Finding 7: RuntimeDefault seccomp admits mbind only for containers configured with
    SYS_NICE. Default policy: requested; a policy without it: the plan says placement is
    degraded; numa: none: not requested."""
    cr = _cr("deepseek-r1-mi355x.yaml")
    engine = _pod(_plan(cr))["containers"][0]
    assert engine["securityContext"]["capabilities"]["add"] == ["IPC_LOCK", "SYS_NICE"]
    p = _plan(cr, policy={"allowedCapabilities": ["IPC_LOCK"]})
    assert any(w.startswith("NUMA placement degraded") for w in p.warnings)
    cr["spec"]["hiCache"]["hostAllocator"]["numa"] = "none"
    engine = _pod(_plan(cr))["containers"][0]
    assert engine["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]


def test_the_dram_sidecar_is_sized_for_its_page_tables() -> None:
    """Finding 9: 512 GiB on 4 KiB pages needs 1 GiB of page tables on top of the pool and the
    process (the engine's 1.6 TiB host pool it maps is on 2 MiB pages: 6.4 MiB of tables,
    inside the process allowance)."""
    cr = _cr("deepseek-r1-mi355x.yaml")
    containers = {c["name"]: c for c in _pod(_plan(cr))["initContainers"]}
    from hicache_operator.api.quantity import parse_bytes

    mem = parse_bytes(containers["umbp-dram"]["resources"]["limits"]["memory"])
    pool = 512 * GIB
    assert page_table_bytes(pool, 0) >= GIB
    assert mem >= SIDECAR_PROCESS_MEMORY + pool + page_table_bytes(pool, 0)


def test_the_grace_period_covers_the_drain_and_the_pool_release() -> None:
    """Finding 10: 120 s cut long generations and the release of a 1.6 TiB pinned pool."""
    small = _pod(_plan(_cr("minimal-dram-only.yaml")))
    big = _pod(_plan(_cr("deepseek-r1-mi355x.yaml")))
    assert small["terminationGracePeriodSeconds"] > DRAIN_TIMEOUT_S
    assert big["terminationGracePeriodSeconds"] >= DRAIN_TIMEOUT_S + 0.2 * 1600
    hook = big["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert hook[:3] == ["python", "-m", "hicache_umbp.drain"]
    assert float(hook[hook.index("--timeout") + 1]) == DRAIN_TIMEOUT_S
    # the engine's port, also where configuration revisions hide HICACHE_PORT from the hook
    assert hook[hook.index("--port") + 1] == str(big["containers"][0]["ports"][0]["containerPort"])


def test_a_standalone_pods_drain_lets_l3_catch_up_within_the_grace_period() -> None:
    """The sidecars keep L3 for an engine restarted in place (the kubelet runs preStop before
    an in-place image change too), so the standalone hook waits for L3; embedded, L3 ends with
    the engine and the hook does not wait."""
    from hicache_operator.planner.pod_overhead import DRAIN_L3_TIMEOUT_S
    from hicache_umbp.drain import L3_CATCH_UP_TIMEOUT_S

    standalone = _pod(_plan(_cr("deepseek-r1-mi355x.yaml")))
    embedded = _pod(_plan(_cr("minimal-dram-only.yaml")))
    hook = standalone["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert float(hook[hook.index("--l3-timeout") + 1]) == DRAIN_L3_TIMEOUT_S
    assert DRAIN_L3_TIMEOUT_S == L3_CATCH_UP_TIMEOUT_S  # the watcher's bound, the same
    assert "--l3-timeout" not in embedded["containers"][0]["lifecycle"]["preStop"]["exec"][
        "command"]
    assert standalone["terminationGracePeriodSeconds"] >= (
        DRAIN_TIMEOUT_S + DRAIN_L3_TIMEOUT_S + 0.2 * 1600)
