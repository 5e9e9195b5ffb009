"""Pod sizing: hugepages, memory, /dev/shm, CPUs and the per-rank byte budgets (DESIGN §5).

How big is the hugepage request? Here: ``hugepages-<P>`` below, :func:`size_pod`.

Notation: R ranks per pod (= GPUs per pod), H host pool per rank, P_h its hugepage size (0 for
4 KiB pages), D the UMBP DRAM per pod, P_d its hugepage size, S the SSD tier per pod, Q the
write-back ring budget per rank (``spec.l3.tiering.queueSize``), N tokens per page
(``spec.engine.pageSize``), K the model's KV bytes per token (``spec.model.kvBytesPerToken``),
T the attention-TP ranks (TP, divided by DP under DP attention), h the KV heads
(``spec.model.kvHeads``, T when unset).

* Page geometry ``n`` parts of ``p`` bytes per page and rank, and the pageSize the tiers hold:
  :mod:`.page_geometry`. The L3 client's host buffers (write-back ring, SSD staging) and the
  umbp-ssd sidecar, and the hicache SSD tier's index and I/O threads: :mod:`.l3_staging`;
  their totals enter the memory formulas below.
* Host pool per rank: ``H_r = roundup(H, P_h)``; the allocator maps whole hugepages.
* UMBP DRAM: embedded mode splits it per rank, ``D_r = floor(D / R / page) * page`` (page = P_d
  or 4 KiB), never more than asked; standalone mode runs one DRAM server with
  ``floor(D / page) * page``.
* hugepages-<P> of a container = sum of the pools it maps that are backed by P-sized pages
  (engine: ``R * H_r`` and, embedded, ``R * D_r``; standalone DRAM sidecar: its pool); always a
  multiple of P, requests == limits, not part of the memory limit.
* /dev/shm (auto) = ``max(16 GiB, 4 GiB * R)``; an emptyDir ``medium: Memory`` whose pages count
  against the engine's memory limit.
* SSD tier per rank ``S_r = floor(S / R)``: embedded mode, and the hicache engine in either mode
  (``spec.l3.ssd.engine``; it holds ``R * S_r`` for the pod on M drives, T I/O threads each);
  the mori engine's standalone sidecar holds S.
* hicache SSD tier memory ``X = M * roundup(4096 + 64 * n, 4 KiB) + R * M * T * 8 MiB``, n the
  slots per drive ``floor(floor(R * S_r / M) / roundup(p, 4 KiB))`` in whole sets of 16
  (p = 4 KiB without K): its shared index mappings and I/O thread stacks
  (:func:`.l3_staging.disk_tier_memory`); no staging buffer.
* engine memory (auto) = ``roundup_GiB(1.1 * (16 GiB + 12 GiB * R) + shm + 4 KiB-backed pools
  + ring + SSD staging + X)`` (ring and staging from :mod:`.l3_staging`): process overhead per
  rank (Python,
  ROCm runtime, SGLang scheduler) with 10 % headroom, the tmpfs, and the host buffers not in
  hugepages (sized exactly, no headroom on them). An explicit memory must cover ``shm + 4 KiB-backed
  pools + ring + SSD staging + X + 4 GiB``.
* SGLang's own host-memory check (``pool_host/base.py``): before it allocates a host pool it
  requires ``limit - usage - 10 GiB >= R * H`` (``HICACHE_HOST_MEMORY_RESERVE_BYTES``), with
  ``usage`` about the process memory. For a 4 KiB-backed host pool the engine memory is therefore
  at least ``4 GiB + 10 GiB + R * H`` (auto sizing always is; an explicit memory below it is
  refused). A hugepage-backed pool is checked against hugepages instead (the backend's host
  allocator hook), so the reserve does not apply to it.
* engine CPUs (auto) = ``4 + 8 * R``; each standalone sidecar gets 2 CPUs; the DRAM sidecar 2 GiB
  plus its 4 KiB-backed pool and the page tables :mod:`.pod_overhead` counts, the SSD sidecar as
  :mod:`.l3_staging` sizes it plus those page tables. Every container has
  integer CPUs and requests == limits, so the pod is Guaranteed QoS and the static CPU / Memory
  Managers can align it.
* Router (``spec.router``): the cache_aware prefix tree is the pods' capacity in tokens per tier
  (host pool + L3) in characters, and the router's memory follows it
  (:mod:`.router_sizing`).
* Node fit: ``sum(hugepages) + sum(memory) <= node memory``, ``sum(cpu) <= node cpus``,
  ``R <= node GPUs``, ``sum(hugepages) <= policy.maxHugepagesPerPod``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hicache_umbp.contract.settings import HUGEPAGE_SIZES
from hicache_umbp.contract.staging import (
    SSD_STAGING_SLOTS,
    SSD_VALUE_BYTES_DEFAULT,
)
from hicache_umbp.contract.units import (
    GIB,
    PAGE_4K,
    k8s_hugepage_resource,
    round_up,
)

from ..api.config import OperatorConfig
from ..api.quantity import format_bytes, parse_bytes
from ..api.spec import SGLangHiCacheSpec
from .errors import Problems
from .l3_staging import disk_tier_memory, ssd_sidecar, staging_assumed, staging_of_page
from .node_fit import check_node_fit
from .page_geometry import PageGeometry
from .pod_overhead import MIB, mapped_page_tables, sidecar_dram_memory

ENGINE_BASE_MEMORY = 16 * GIB
ENGINE_MEMORY_PER_RANK = 12 * GIB
ENGINE_MIN_PROCESS_MEMORY = 4 * GIB
#: SGLang 0.5.23's HICACHE_HOST_MEMORY_RESERVE_BYTES: headroom its host-pool check keeps free.
SGLANG_HOST_MEMORY_RESERVE = 10 * GIB
MEMORY_HEADROOM = (11, 10)  # x 1.1
ENGINE_BASE_CPU = 4
ENGINE_CPU_PER_RANK = 8
SHM_MIN = 16 * GIB
SHM_PER_RANK = 4 * GIB
SIDECAR_CPU = 2


@dataclass(frozen=True)
class ContainerSizing:
    name: str
    cpu: int
    memory_bytes: int
    hugepages: dict[int, int] = field(default_factory=dict)  # page size -> bytes
    gpus: int = 0

    def resources(self, gpu_resource: str) -> dict[str, str]:
        """requests == limits for every resource (Guaranteed QoS)."""
        res = {"cpu": str(self.cpu), "memory": format_bytes(self.memory_bytes)}
        for page, amount in sorted(self.hugepages.items()):
            if amount:
                res[k8s_hugepage_resource(page)] = format_bytes(amount)
        if self.gpus:
            res[gpu_resource] = str(self.gpus)
        return res


@dataclass(frozen=True)
class PodSizing:
    ranks: int
    host_pool_per_rank: int
    host_page: int
    dram_total: int
    dram_per_rank: int
    dram_page: int
    dram_requested: int  # spec.l3.dram.capacity before whole-page rounding
    ssd_total: int
    ssd_per_rank: int
    queue_bytes_per_rank: int  # write-back ring budget (rendered even when unused)
    ring_total: int  # write-back rings in the engine's memory (0 unless DRAM and SSD tiers)
    ssd_staging_total: int  # embedded SSD node staging in the engine's memory
    shm_bytes: int
    containers: tuple[ContainerSizing, ...]
    arithmetic: tuple[str, ...]
    page: PageGeometry | None = None  # None: model.kvBytesPerToken unset (8 MiB parts assumed)
    ssd_slot_bytes: int = SSD_VALUE_BYTES_DEFAULT  # umbp-ssd sidecar slot (umbp_ssd_slot_bytes)
    ssd_sidecar_slots: int = SSD_STAGING_SLOTS  # its staging slots (all ranks share them)
    ssd_sidecar_staging: int = 0  # their bytes, in the umbp-ssd container's memory
    ssd_disk_memory: int = 0  # the hicache SSD tier's index and I/O thread stacks (engine)

    @property
    def engine(self) -> ContainerSizing:
        return self.containers[0]

    @property
    def engine_pool_bytes(self) -> int:
        """What the engine releases when it stops: its host pools and, embedded, the UMBP DRAM
        (``dram_per_rank`` is 0 standalone); the stop budgets of ``pod_overhead`` scale with it."""
        return (self.host_pool_per_rank + self.dram_per_rank) * self.ranks

    @property
    def cpu_total(self) -> int:
        return sum(c.cpu for c in self.containers)

    @property
    def memory_total(self) -> int:
        return sum(c.memory_bytes for c in self.containers)

    @property
    def hugepages_total(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for c in self.containers:
            for page, amount in c.hugepages.items():
                out[page] = out.get(page, 0) + amount
        return {p: a for p, a in out.items() if a}

    def hugepages_display(self) -> str:
        pages = self.hugepages_total
        if not pages:
            return "0"
        return " + ".join(
            f"{format_bytes(a)} ({format_bytes(p)})" for p, a in sorted(pages.items())
        )


def _add(hp: dict[int, int], page: int, amount: int) -> None:
    if page and amount:
        hp[page] = hp.get(page, 0) + amount


def size_pod(
    spec: SGLangHiCacheSpec,
    ranks: int,
    ssd_bytes: int,
    config: OperatorConfig,
    problems: Problems,
    *,
    page: PageGeometry | None = None,
) -> PodSizing:
    """Compute every container's resources; impossible combinations become problems.

    ``page``: the model's page geometry (:func:`.page_geometry.page_geometry`); ``None`` sizes the
    L3 staging for 8 MiB page parts."""
    lines: list[str] = []
    l3 = spec.l3
    standalone = l3.mode == "standalone"
    host_page, host_r = _host_pool(spec, lines)
    dram_page, dram_r, dram_total, dram_raw = _umbp_dram(spec, ranks, problems, lines)
    # The hicache SSD tier runs in the engine in either mode; mori's standalone in its sidecar.
    ours = bool(ssd_bytes) and l3.ssd.engine == "hicache"
    ssd_r = ssd_bytes // ranks if ours or not standalone else 0

    queue_r = parse_bytes(l3.tiering.queue_size, field="l3.tiering.queueSize")
    if page is None:
        ring_total, staging_total = staging_assumed(
            ranks, queue_r, l3.tiering.queue_size,
            bool(ssd_bytes) and bool(dram_total),
            bool(ssd_bytes) and not standalone and not ours, problems, lines,
        )
    else:
        ring_total, staging_total = staging_of_page(
            spec, page, ranks, queue_r, bool(dram_total), bool(ssd_bytes), lines,
            ssd_staging=not ours,
        )
    slot, slots, sidecar_staging, sidecar_memory = ssd_sidecar(
        page, ranks, standalone and bool(ssd_bytes) and not ours, lines
    )
    disk_memory = disk_tier_memory(
        page, ranks, ssd_r * ranks, len(l3.ssd.drive_volumes()), l3.ssd.io_threads, lines
    ) if ours else 0

    shm = _shm(spec, ranks, lines)
    engine_hp, four_k_pools = plan_hugepages(
        ranks, host_page, host_r, dram_page, 0 if standalone else dram_total, lines)
    engine_mem = _engine_memory(
        spec, ranks, shm, four_k_pools, ring_total + staging_total + disk_memory, problems,
        lines, l3_label="L3 ring and SSD index and threads" if ours else "L3 ring and SSD staging",
        sglang_checked_pool=None if host_page else host_r * ranks,
    )
    containers = [ContainerSizing("engine", _engine_cpu(spec, ranks, lines), engine_mem,
                                  engine_hp, gpus=ranks)]
    # The engine registers its host pools with each standalone sidecar, which maps them.
    registered = {host_page or PAGE_4K: host_r * ranks} if host_r else {}
    if standalone and dram_total:
        hp: dict[int, int] = {}
        _add(hp, dram_page, dram_total)
        mem = sidecar_dram_memory(dram_total, dram_page, registered)
        lines.append(
            f"umbp-dram memory = roundup_MiB(2 GiB + {0 if dram_page else dram_total} B pool + "
            f"page tables {mapped_page_tables({dram_page: dram_total})} B + engine pools' "
            f"{mapped_page_tables(registered)} B) = {mem} B")
        containers.append(ContainerSizing("umbp-dram", SIDECAR_CPU, mem, hp))
    if standalone and ssd_bytes and not ours:
        mapped = -(-(sidecar_memory + mapped_page_tables(registered)) // MIB) * MIB
        containers.append(ContainerSizing("umbp-ssd", SIDECAR_CPU, mapped))

    sizing = PodSizing(
        ranks=ranks,
        host_pool_per_rank=host_r,
        host_page=host_page,
        dram_total=dram_total,
        dram_per_rank=dram_r,
        dram_page=dram_page,
        dram_requested=dram_raw,
        ssd_total=ssd_bytes,
        ssd_per_rank=ssd_r,
        queue_bytes_per_rank=queue_r,
        ring_total=ring_total,
        ssd_staging_total=staging_total,
        shm_bytes=shm,
        containers=tuple(containers),
        arithmetic=tuple(lines),
        page=page,
        ssd_slot_bytes=slot,
        ssd_sidecar_slots=slots,
        ssd_sidecar_staging=sidecar_staging,
        ssd_disk_memory=disk_memory,
    )
    check_node_fit(sizing, config, problems)
    return sizing


def _host_pool(spec: SGLangHiCacheSpec, lines: list[str]) -> tuple[int, int]:
    """(P_h, H_r): the host pool's page size and bytes per rank, whole pages."""
    hc = spec.hi_cache
    host_page = HUGEPAGE_SIZES[hc.host_allocator.huge_page_size]
    host_raw = (
        parse_bytes(hc.host_pool_per_rank, field="hostPoolPerRank")
        if hc.host_pool_per_rank is not None
        else 0
    )
    host_r = round_up(host_raw, host_page)
    if host_r != host_raw:
        lines.append(
            f"host pool per rank {host_raw} B rounded up to {host_r} B "
            f"(multiple of {format_bytes(host_page)} pages)"
        )
    return host_page, host_r


def _umbp_dram(
    spec: SGLangHiCacheSpec, ranks: int, problems: Problems, lines: list[str]
) -> tuple[int, int, int, int]:
    """(P_d, D_r, the DRAM tier in whole pages, D as asked): embedded splits it per rank,
    standalone runs one DRAM server."""
    l3 = spec.l3
    standalone = l3.mode == "standalone"
    dram_page = HUGEPAGE_SIZES[l3.dram.huge_page_size]
    dram_unit = dram_page or PAGE_4K
    dram_raw = parse_bytes(l3.dram.capacity, field="l3.dram.capacity")
    if standalone:
        dram_total = dram_raw // dram_unit * dram_unit
        dram_r = 0
    else:
        dram_r = dram_raw // ranks // dram_unit * dram_unit
        dram_total = dram_r * ranks
        if dram_raw and not dram_r:
            problems.add(
                "spec.l3.dram.capacity",
                f"{dram_raw} B / {ranks} ranks is less than one "
                f"{format_bytes(dram_unit)} page per rank",
            )
    if dram_total != dram_raw:
        lines.append(
            f"UMBP DRAM {dram_raw} B -> {dram_total} B (whole "
            f"{format_bytes(dram_unit)} pages{'' if standalone else ' per rank'})"
        )
    return dram_page, dram_r, dram_total, dram_raw


def plan_hugepages(
    ranks: int, host_page: int, host_r: int, dram_page: int, engine_dram: int,
    lines: list[str],
) -> tuple[dict[int, int], int]:
    """The engine's ``hugepages-<P>`` request (page size -> bytes) and the 4 KiB-backed pools
    that count against its memory instead: the host pool ``R * H_r`` and the embedded DRAM tier
    ``R * D_r`` (``engine_dram``, 0 in standalone mode), each on its own page size."""
    engine_hp: dict[int, int] = {}
    _add(engine_hp, host_page, host_r * ranks)
    four_k_pools = 0 if host_page else host_r * ranks
    _add(engine_hp, dram_page, engine_dram)
    four_k_pools += 0 if dram_page else engine_dram
    if engine_hp:
        lines.append(
            "engine hugepages = "
            + " + ".join(f"{format_bytes(p)}: {a} B" for p, a in sorted(engine_hp.items()))
        )
        if host_r:
            lines.append(
                f"  host pool {ranks} ranks x {host_r} B = {ranks * host_r} B"
                + (" (hugepages)" if host_page else " (4 KiB pages, in memory)")
            )
    return engine_hp, four_k_pools


def _engine_cpu(spec: SGLangHiCacheSpec, ranks: int, lines: list[str]) -> int:
    cpu = spec.resources.cpu
    if cpu != "auto":
        return int(cpu)
    engine_cpu = ENGINE_BASE_CPU + ENGINE_CPU_PER_RANK * ranks
    lines.append(
        f"engine cpu = {ENGINE_BASE_CPU} + {ENGINE_CPU_PER_RANK} x {ranks} ranks = {engine_cpu}"
    )
    return engine_cpu


def _shm(spec: SGLangHiCacheSpec, ranks: int, lines: list[str]) -> int:
    if spec.resources.shm_size != "auto":
        return parse_bytes(spec.resources.shm_size, field="resources.shmSize")
    shm = max(SHM_MIN, SHM_PER_RANK * ranks)
    lines.append(
        f"/dev/shm = max({format_bytes(SHM_MIN)}, {format_bytes(SHM_PER_RANK)} x "
        f"{ranks} ranks) = {format_bytes(shm)}"
    )
    return shm


def _engine_memory(
    spec: SGLangHiCacheSpec,
    ranks: int,
    shm: int,
    four_k_pools: int,
    l3_buffers: int,
    problems: Problems,
    lines: list[str],
    *,
    sglang_checked_pool: int | None = None,
    l3_label: str = "L3 ring and SSD staging",
) -> int:
    """``l3_buffers``: the write-back ring plus the embedded SSD staging; ``sglang_checked_pool``:
    the 4 KiB-backed host pools SGLang checks against the memory limit (0 when sized by ratio;
    ``None`` for a hugepage pool, which is checked against hugepages), module docstring."""
    runtime = shm + four_k_pools + l3_buffers + ENGINE_MIN_PROCESS_MEMORY
    check = (0 if sglang_checked_pool is None else
             ENGINE_MIN_PROCESS_MEMORY + SGLANG_HOST_MEMORY_RESERVE + sglang_checked_pool)
    minimum = max(runtime, check)
    if spec.resources.memory != "auto":
        mem = parse_bytes(spec.resources.memory, field="resources.memory")
        if mem < runtime:
            problems.add(
                "spec.resources.memory",
                f"{spec.resources.memory} ({mem} B) is below what the engine needs outside "
                f"hugepages: /dev/shm {shm} B + 4 KiB-backed pools {four_k_pools} B + "
                f"{l3_label} {l3_buffers} B + "
                f"{ENGINE_MIN_PROCESS_MEMORY} B process = {runtime} B",
            )
        elif mem < check:
            problems.add(
                "spec.resources.memory",
                f"{spec.resources.memory} ({mem} B) is below what SGLang's host-memory check "
                f"requires before it allocates the 4 KiB-backed host pool: "
                f"{ENGINE_MIN_PROCESS_MEMORY} B process + {SGLANG_HOST_MEMORY_RESERVE} B "
                f"SGLang reserve + {sglang_checked_pool or 0} B pool = {check} B (SGLang would "
                f"refuse with 'Not enough host memory available'); raise it, or back the host "
                f"pool with hugepages (spec.hiCache.hostAllocator.hugePageSize)",
            )
        return mem
    if spec.hi_cache.host_pool_ratio is not None:
        problems.add(
            "spec.resources.memory",
            "hostPoolRatio leaves the host pool size to "
            "SGLang, so the operator cannot size memory: set resources.memory "
            "explicitly (it must hold the whole host pool)",
        )
    overhead = ENGINE_BASE_MEMORY + ENGINE_MEMORY_PER_RANK * ranks
    num, den = MEMORY_HEADROOM
    mem = round_up(max(-(-overhead * num // den) + shm + four_k_pools + l3_buffers, minimum),
                   GIB)
    lines.append(
        f"engine memory = roundup_GiB(1.1 x ({format_bytes(ENGINE_BASE_MEMORY)} + "
        f"{format_bytes(ENGINE_MEMORY_PER_RANK)} x {ranks} ranks) + shm {format_bytes(shm)} + "
        f"4 KiB-backed pools {four_k_pools} B + {l3_label} {l3_buffers} B) = "
        f"{format_bytes(mem)}"
    )
    return mem
