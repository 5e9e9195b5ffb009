"""Node selection for AMD Instinct GPUs: device-id affinity, tolerations, GPU requests.

The AMD node labeller writes ``amd.com/gpu.device-id=<id>`` on homogeneous nodes and
``amd.com/gpu.device-id.<id>=<count>`` (no plain key) on heterogeneous ones; older versions use the
``beta.amd.com/`` prefix. Node affinity terms are ORed, so one term per label form accepts every
node that carries the model, whichever form its labeller wrote.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from ..api.config import OperatorConfig
from ..api.spec import Placement

UNHEALTHY_TAINT = "amd-gpu-unhealthy"
DEVICE_ID_LABEL = "amd.com/gpu.device-id"
LEGACY_DEVICE_ID_LABEL = "beta.amd.com/gpu.device-id"


@dataclass(frozen=True)
class GpuModel:
    name: str
    device_ids: tuple[str, ...]  # physical function first, then SR-IOV virtual functions
    hbm_gib: int


# PCI device ids from the amdgpu driver / AMD node labeller. MI355X VF 75b3 is from DESIGN §6;
# VF ids of the older models are not listed (unverified), so only their PF ids select nodes.
GPU_MODELS: dict[str, GpuModel] = {
    "MI355X": GpuModel("MI355X", ("75a3", "75b3"), 288),
    "MI350X": GpuModel("MI350X", ("75a0",), 288),
    "MI325X": GpuModel("MI325X", ("74a5",), 256),
    "MI300X": GpuModel("MI300X", ("74a1",), 192),
}

Term = dict[str, Any]


def gpu_node_terms(model: GpuModel) -> list[Term]:
    """Node selector terms (ORed) matching a node with ``model`` GPUs under any label form."""
    ids = list(model.device_ids)
    terms: list[Term] = [
        {"matchExpressions": [{"key": DEVICE_ID_LABEL, "operator": "In", "values": ids}]},
        {"matchExpressions": [{"key": LEGACY_DEVICE_ID_LABEL, "operator": "In", "values": ids}]},
    ]
    for device_id in ids:
        terms.append(
            {
                "matchExpressions": [
                    {"key": f"{DEVICE_ID_LABEL}.{device_id}", "operator": "Gt", "values": ["0"]}
                ]
            }
        )
    return terms


def _and_terms(a: Term, b: Term) -> Term:
    out: Term = {}
    for key in ("matchExpressions", "matchFields"):
        merged = list(a.get(key, [])) + list(b.get(key, []))
        if merged:
            out[key] = copy.deepcopy(merged)
    return out


def pod_affinity(placement: Placement, model: GpuModel) -> dict[str, Any]:
    """The user's affinity with its required node terms ANDed with the GPU model terms.

    (U1 or U2) and (G1 or G2 or G3) becomes the cross product U1G1, U1G2, ... since a
    nodeSelectorTerm list is an OR of ANDs.
    """
    affinity = (
        placement.affinity.model_dump(by_alias=True, exclude_none=True)
        if placement.affinity is not None
        else {}
    )
    node_aff = affinity.setdefault("nodeAffinity", {})
    required = node_aff.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    user_terms: list[Term] = list(required.get("nodeSelectorTerms") or [{}])
    gpu_terms = gpu_node_terms(model)
    required["nodeSelectorTerms"] = [_and_terms(u, g) for u in user_terms for g in gpu_terms]
    return affinity


def pod_tolerations(placement: Placement, config: OperatorConfig) -> list[dict[str, Any]]:
    out = [t.as_k8s() for t in config.gpu_tolerations]
    out.extend(t.as_k8s() for t in placement.tolerations if t.as_k8s() not in out)
    return out


def tolerates_unhealthy(tolerations: list[dict[str, Any]]) -> bool:
    """Whether any toleration matches the ``amd-gpu-unhealthy`` taint."""
    for t in tolerations:
        key = t.get("key")
        if key == UNHEALTHY_TAINT or (not key and t.get("operator") == "Exists"):
            return True
    return False
