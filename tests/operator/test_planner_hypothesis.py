"""Generated CRs: the planner returns objects that all validate, or raises SpecError with field
paths — never any other exception.

Real: the planner, the backend's env loader, kubernetes-validate (1.33). The CRs are generated
by hypothesis from value pools that mix valid, borderline and wrong values (wrong types too).
"""

from __future__ import annotations

from typing import Any

from hicache_operator.api.config import AdminPolicy, OperatorConfig
from hicache_operator.plan import SpecError, plan
from hicache_umbp.contract.load import load_launch_config
from hicache_umbp.contract.page_limits import page_size_problems
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from shc_testlib import all_containers, crd_cel_failures, crd_schema_errors, validate_k8s

CONFIG = OperatorConfig(
    policy=AdminPolicy(
        allowed_host_path_prefixes=["/mnt"], allowed_capabilities=["IPC_LOCK", "SYS_NICE"]
    )
)
GOOD_SIZES = ["1Gi", "10Gi", "64Gi", "200Gi", "1Ti", 2**34]
BAD_SIZES = ["0", "512Mi", "400Gi", "3Ti", "1.5Gi", "100m", "10 Gi", "-1Gi", 1, 2**45]
WEIRD = st.one_of(
    st.none(),
    st.integers(-5, 5),
    st.text(max_size=4),
    st.booleans(),
    st.lists(st.integers(), max_size=2),
)


def pick(draw: st.DrawFn, good: list[Any], bad: list[Any] | None, chaos: bool) -> Any:
    """A good value for a clean CR; in a chaotic CR now and then a bad or wrong-typed one, so
    a fair share of generated CRs plans successfully and every rejection path is still hit."""
    # sampled_from shrinks towards its first element: "good" first keeps the bias on valid CRs.
    if not chaos:
        return draw(st.sampled_from(good))
    kind = draw(st.sampled_from(["good"] * 10 + ["bad", "weird"]))
    if kind == "weird":
        return draw(WEIRD)
    if kind == "bad" and bad:
        return draw(st.sampled_from(bad))
    return draw(st.sampled_from(good))


@st.composite
def crs(draw: st.DrawFn) -> dict[str, Any]:
    chaos = draw(st.booleans())

    def p(good: list[Any], bad: list[Any] | None = None) -> Any:
        return pick(draw, good, bad, chaos)

    engine: dict[str, Any] = {
        "tensorParallelSize": p([1, 2, 4, 8], [16, 0]),
        "dataParallelSize": p([1, 1, 1, 2, 4], [8, 3]),
        "enableDpAttention": p([False], [True]),
        "pageSize": p([1, 16, 64, 128, 1024, 4096], [0, 5000]),
        "extraArgs": draw(
            st.lists(
                st.sampled_from(
                    ["--trust-remote-code"] + (["--tp-size=2", "--hicache-ratio"] if chaos else [])
                ),
                max_size=2,
            )
        ),
        "env": draw(
            st.lists(
                st.fixed_dictionaries(
                    {
                        "name": st.sampled_from(
                            ["A", "HF_HOME"]
                            + (["HICACHE_X", "UMBP_Y", "bad name"] if chaos else [])
                        ),
                        "value": st.text(max_size=3),
                    }
                ),
                max_size=2,
                unique_by=lambda e: e["name"],
            )
        ),
    }
    if chaos and draw(st.booleans()):
        engine["gpusPerPod"] = draw(st.integers(1, 16))
    hicache: dict[str, Any] = {
        "memLayout": p(["page_first", "page_first_direct"], ["layer_first"]),
        "writePolicy": p(["write_back"], ["write_through"]),
        "allowWriteThrough": draw(st.booleans()),
        "hostAllocator": {
            "hugePageSize": p(["2Mi", "1Gi", "none"], ["4Mi"]),
            "numa": p(["auto", "none"]),
        },
    }
    if draw(st.integers(0, 9)):
        hicache["hostPoolPerRank"] = p(GOOD_SIZES, BAD_SIZES)
    else:
        hicache["hostPoolRatio"] = p([2.0, 4.0], [0.5])
        hicache["hostAllocator"]["hugePageSize"] = "none"
    size = p(["2Ti", "4Ti", 2**42], BAD_SIZES)
    ssd: dict[str, Any] = {
        "enabled": draw(st.booleans()),
        "capacity": p(["100Gi", "1Ti"], BAD_SIZES),
        "headroomPercent": p([0, 5, 10], [60]),
    }
    kind = p(["claimTemplate", "emptyDir", "hostPath"], ["two", "none"])
    volume: dict[str, Any] = {}
    if kind in ("claimTemplate", "two"):
        volume["claimTemplate"] = {"size": size, "storageClassName": "local-nvme"}
    if kind in ("emptyDir", "two"):
        volume["emptyDir"] = {"sizeLimit": size}
    if kind == "hostPath":
        volume["hostPath"] = {"path": p(["/mnt/nvme0"], ["/etc", "/mnt/../x"]), "size": size}
    ssd["volume"] = volume
    model: dict[str, Any] = {
        "path": p(["m", "/models/x"], [""]),
        "attention": p(["auto", "mha", "mla"], ["gqa"]),
    }
    if draw(st.booleans()):  # page geometry: DeepSeek-R1, Llama-3.1-70B/405B, Qwen3-235B
        model["kvBytesPerToken"] = p([70272, 327680, 516096, 192512], [0, 2**25, 327681])
        model["attention"] = p(["mha", "mla"], ["auto"])
        if draw(st.booleans()):
            model["kvHeads"] = p([1, 4, 8, 64], [0, 12])
    spec: dict[str, Any] = {
        "model": model,
        "replicas": draw(st.integers(0, 3)),
        "engine": engine,
        "hiCache": hicache,
        "l3": {
            "mode": p(["embedded", "standalone"], ["distributed"]),
            "dram": {
                "capacity": p(["64Gi", "256Gi", 2**36], ["0", "3Ti", "-1"]),
                "hugePageSize": p(["none", "2Mi", "1Gi"]),
            },
            "ssd": ssd,
        },
        "placement": {"gpuModel": p(["MI355X", "MI300X", "MI350X", "MI325X"], ["H100"])},
        "resources": {
            "cpu": p(["auto", "auto", 8, 40], [300, "x"]),
            "memory": p(["auto"], ["64Gi", "4Ti"]),
        },
        "security": {
            "capabilities": draw(
                st.lists(st.sampled_from(["SYS_NICE"] * 4 + ["SYS_ADMIN"]), max_size=1)
            )
        },
    }
    if hicache.get("hostPoolRatio") is not None:
        spec["resources"]["memory"] = "600Gi"
    if chaos and draw(st.sampled_from([False] * 9 + [True])):
        spec["unknownField"] = 1
    name = p(["shc", "llama-70b"], ["Bad", "a" * 60])
    return {
        "apiVersion": "hicache.sglang.ai/v1alpha1",
        "kind": "SGLangHiCache",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": spec,
    }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(crs())
def test_plan_returns_valid_objects_or_a_spec_error(cr: dict[str, Any]) -> None:
    try:
        p = plan(cr, CONFIG)
    except SpecError as err:
        event("rejected")
        assert err.problems
        for path, message in err.problems:
            assert path.split(".")[0].split("[")[0] in {"spec", "metadata", "<root>"}, path
            assert message
        return
    event("planned")
    # What the planner accepts the API server accepts too: the CRD schema and its CEL rules.
    # (CEL runs only on schema-valid objects, as in the API server.)
    assert crd_schema_errors(cr) == []
    assert crd_cel_failures(cr) == []
    for obj in p.objects:
        validate_k8s(obj)
    for c in all_containers(p.objects):
        lim = c["resources"]["limits"]
        assert {
            k: v for k, v in c["resources"]["requests"].items() if k != "ephemeral-storage"
        } == lim
    cm = p.objects[0]
    store = load_launch_config(cm["data"]).store  # the pod accepts its env
    page = p.sizing.page
    if page is not None:  # ... and the page, when SGLang registers its host pool
        event("planned with page geometry")
        for r in range(store.umbp_local_ranks):
            assert page_size_problems(store.rank(r), page.part_bytes, page.parts) == []
