"""Every built-in object of every example (and of variants covering each code path) passes
kubernetes-validate --strict for Kubernetes 1.33; snapshots of the examples' objects.

Real: the planner and kubernetes-validate's 1.33 schemas. Snapshots are reviewed files under
tests/operator/snapshots/; regenerate deliberately with SHC_UPDATE_SNAPSHOTS=1 and review the diff.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from hicache_operator.api.config import AdminPolicy, OperatorConfig
from hicache_operator.plan import plan
from shc_testlib import EXAMPLES, load_example, validate_k8s

SNAPSHOTS = Path(__file__).parent / "snapshots"
POLICY = OperatorConfig(
    policy=AdminPolicy(
        allowed_host_path_prefixes=["/mnt", "/data/models"],
        allowHostIPC=True,
        allowed_capabilities=["IPC_LOCK", "SYS_NICE"],
    )
)


def _variant(example: str, spec_patch: dict[str, Any]) -> dict[str, Any]:
    cr = copy.deepcopy(load_example(example))
    cr["spec"].update(spec_patch)
    return cr


VARIANTS: dict[str, dict[str, Any]] = {
    "standalone-hostpath-dram-hugepages": _variant(
        "deepseek-r1-mi355x.yaml",
        {
            "l3": {
                "mode": "standalone",
                "dram": {"capacity": "256Gi", "hugePageSize": "2Mi"},
                "ssd": {
                    "enabled": True,
                    "capacity": "1Ti",
                    "volume": {"hostPath": {"path": "/mnt/nvme1", "size": "2Ti"}},
                },
            },
            "security": {"capabilities": ["SYS_NICE"], "hostIPC": True},
            "model": {"path": "/models/r1", "volume": {"hostPath": {"path": "/data/models/r1"}}},
        },
    ),
    "affinity-tolerations-env": _variant(
        "llama-3.1-70b-mi355x.yaml",
        {
            "placement": {
                "gpuModel": "MI325X",
                "nodeSelector": {"pool": "gpu"},
                "priorityClassName": "inference",
                "tolerations": [
                    {
                        "key": "dedicated",
                        "operator": "Equal",
                        "value": "llm",
                        "effect": "NoSchedule",
                    }
                ],
                "affinity": {
                    "podAntiAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": [
                            {
                                "weight": 50,
                                "podAffinityTerm": {
                                    "topologyKey": "kubernetes.io/hostname",
                                    "labelSelector": {"matchLabels": {"app": "x"}},
                                },
                            }
                        ]
                    }
                },
            },
            "engine": {
                "tensorParallelSize": 4,
                "env": [
                    {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "t"}}}
                ],
            },
            "imagePullPolicy": "Always",
            "image": "registry.local/engine:1",
        },
    ),
    "ratio-4k": _variant(
        "minimal-dram-only.yaml",
        {
            "hiCache": {"hostPoolRatio": 2.5, "hostAllocator": {"hugePageSize": "none"}},
            "resources": {"memory": "400Gi", "cpu": 16, "shmSize": "8Gi"},
            "replicas": 0,
        },
    ),
}


def _cases() -> list[tuple[str, dict[str, Any]]]:
    cases = [(p.stem, yaml.safe_load(p.read_text())) for p in EXAMPLES]
    return cases + sorted(VARIANTS.items())


@pytest.mark.parametrize(("name", "cr"), _cases(), ids=[n for n, _ in _cases()])
def test_every_object_validates_for_k8s_1_33(name: str, cr: dict[str, Any]) -> None:
    p = plan(cr, POLICY)
    # ConfigMap, 2 Services, StatefulSet, and a PodDisruptionBudget from 2 replicas on, with
    # the router's ServiceAccount, Role, RoleBinding, Deployment and (2 router pods by
    # default) PodDisruptionBudget (on from 2 replicas)
    assert len(p.objects) == (10 if p.spec.replicas > 1 else 4)
    for obj in p.objects:
        validate_k8s(obj)


def test_kubernetes_validate_catches_a_broken_object() -> None:
    """Guard: the validator really rejects what an API server would."""
    p = plan(load_example("minimal-dram-only.yaml"), POLICY)
    sts = copy.deepcopy(p.objects[-1])
    sts["spec"]["template"]["spec"]["containers"][0]["resource"] = {}
    with pytest.raises(Exception, match="resource"):
        validate_k8s(sts)
    sts = copy.deepcopy(p.objects[-1])
    sts["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] = "10 Gi"
    with pytest.raises(ValueError, match="quantity"):
        validate_k8s(sts)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_snapshot(example: Path) -> None:
    p = plan(yaml.safe_load(example.read_text()), OperatorConfig())
    rendered = p.manifests_yaml()
    snap = SNAPSHOTS / f"{example.stem}.yaml"
    if os.environ.get("SHC_UPDATE_SNAPSHOTS") == "1":
        SNAPSHOTS.mkdir(exist_ok=True)
        snap.write_text(rendered)
    assert snap.exists(), f"missing snapshot {snap}; run with SHC_UPDATE_SNAPSHOTS=1 and review"
    assert rendered == snap.read_text(), f"{snap.name} differs: review, then regenerate"
