"""The host pool against the GPU's KV pool: HiCache's L2 should hold at least what L1 holds.

SGLang 0.5.23 sizes each rank's device KV pool from the GPU memory its static fraction leaves
after the weights::

    D = HBM * f - W / TP

``HBM``: the GPU model's memory (``placement.GPU_MODELS``); ``f``: ``--mem-fraction-static`` from
``spec.engine.extraArgs``, else 0.9 (SGLang 0.5.23 derives its default from the GPU's capacity
minus activation and graph reserves, about 0.9 of a 288 GiB GPU); ``W``:
``spec.model.weightsSize``, split over the tensor-parallel ranks. The host pool per rank is
``--hicache-size`` whole GB (``H`` rounded down to 10^9 B). Both pools store the same bytes per
token on a rank, so ``H >= D`` is the comparison in tokens too. SGLang only warns when the host
pool is smaller (``pool_host/base.py``), and then the host tier holds less than the device tier
it backs up: host hits collapse once the device pool is full. The size that fits is
``ceil(D / 10^9)`` GB, given in whole GiB. A host pool sized by ratio (``hostPoolRatio``) is that
multiple of the device pool: below 1 it is smaller.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..api.quantity import parse_bytes
from ..api.spec import SGLangHiCacheSpec
from .placement import GpuModel

GIB = 1024**3
GB = 10**9
DEFAULT_MEM_FRACTION = 0.9
MEM_FRACTION_FLAG = "--mem-fraction-static"


@dataclass(frozen=True)
class KvPools:
    device_per_rank: int  # bytes of the GPU's KV pool on one rank (estimate)
    host_per_rank: int  # bytes SGLang allocates (--hicache-size whole GB)
    mem_fraction: float
    fits: bool
    fitting_gib: int  # smallest hostPoolPerRank in GiB that holds the device pool

    def warning(self, spec: SGLangHiCacheSpec, model: GpuModel) -> str:
        return (
            f"the host pool is smaller than the GPU's KV pool: hostPoolPerRank "
            f"{spec.hi_cache.host_pool_per_rank} gives --hicache-size "
            f"{self.host_per_rank // GB} ({self.host_per_rank / GIB:.1f} GiB) per rank, while "
            f"each {model.name} rank's KV pool holds about {self.device_per_rank / GIB:.1f} GiB "
            f"({model.hbm_gib} GiB x {self.mem_fraction:g} - weightsSize "
            f"{spec.model.weights_size} / {spec.engine.tensor_parallel_size}); SGLang only "
            f"warns and host hits collapse once the device pool is full: use hostPoolPerRank "
            f">= {self.fitting_gib}Gi"
        )


def mem_fraction(extra_args: list[str]) -> float:
    for i, arg in enumerate(extra_args):
        if arg == MEM_FRACTION_FLAG and i + 1 < len(extra_args):
            return float(extra_args[i + 1])
        if arg.startswith(MEM_FRACTION_FLAG + "="):
            return float(arg.split("=", 1)[1])
    return DEFAULT_MEM_FRACTION


def compare_kv_pools(spec: SGLangHiCacheSpec, model: GpuModel) -> KvPools | None:
    """None when the weights or an absolute host pool size are unknown."""
    weights = spec.model.weights_size
    host = spec.hi_cache.host_pool_per_rank
    if weights is None or host is None or spec.model.kv_bytes_per_token is None:
        return None
    try:
        f = mem_fraction(list(spec.engine.extra_args))
    except ValueError:
        return None  # SGLang refuses the flag itself
    w = parse_bytes(weights, field="model.weightsSize")
    device = int(model.hbm_gib * GIB * f) - w // spec.engine.tensor_parallel_size
    if device <= 0:
        return None
    rendered = parse_bytes(host, field="hostPoolPerRank") // GB * GB
    fitting = -(-(-(-device // GB) * GB) // GIB)
    return KvPools(device, rendered, f, rendered >= device, fitting)


def device_tokens(pools: KvPools, token_bytes: int, groups: int) -> int:
    """Tokens the GPUs' KV pools of one pod hold: ``T_d = G * floor(D / b)``.

    ``D`` the device KV pool per rank (:func:`compare_kv_pools`), ``b`` one token's bytes in one
    rank's pool (``page_bytes / pageSize``, as :func:`.router_sizing.pod_tokens` uses), ``G``
    the data-parallel groups (every rank of a group holds the same tokens). DeepSeek-R1 on
    MI355X (``examples/deepseek-r1-mi355x.yaml``): ``D = 288 GiB x 0.85 - 642 GiB / 8``,
    ``b = 70,272`` B, ``G = 1``: ``T_d = 2,514,290`` tokens.
    """
    return groups * (pools.device_per_rank // token_bytes)
