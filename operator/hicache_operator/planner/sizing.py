"""Pod sizing: hugepages, memory, /dev/shm, CPUs and the per-rank byte budgets (DESIGN §5).

Notation: R ranks per pod (= GPUs per pod), H host pool per rank, P_h its hugepage size (0 for
4 KiB pages), D the UMBP DRAM per pod, P_d its hugepage size, S the SSD tier per pod, Q the
write-back ring budget per rank (``spec.l3.tiering.queueSize``), N tokens per page
(``spec.engine.pageSize``), K the model's KV bytes per token (``spec.model.kvBytesPerToken``),
T the attention-TP ranks (TP, divided by DP under DP attention), h the KV heads
(``spec.model.kvHeads``, T when unset).

* Page geometry (K set, ``attention`` mha or mla): one rank's host pool registers pages of
  ``n`` parts of ``p`` bytes, which the L3 store stages part by part:

  - mha: ``n = 2`` (K and V), ``p = N * K / 2 / min(T, h)`` (SGLang gives every rank
    ``max(1, h / T)`` heads, so with fewer heads than ranks a rank holds one whole head);
    Llama-3.1-70B bf16, K = 327,680, T = 4, N = 64: ``p = 2,621,440 B``;
  - mla: ``n = 1``, ``p = N * K`` (the latent cache is the same on every rank);
    DeepSeek-R1 bf16, K = 70,272, N = 128: ``p = 8,994,816 B``.

  Without K the planner assumes 8 MiB parts (``SSD_SLOT_BYTES_DEFAULT``) and says so in a
  warning: the pod sizes its own staging from the real part, which can differ.
* Host pool per rank: ``H_r = roundup(H, P_h)``; the allocator maps whole hugepages.
* UMBP DRAM: embedded mode splits it per rank, ``D_r = floor(D / R / page) * page`` (page = P_d
  or 4 KiB), never more than asked; standalone mode runs one DRAM server with
  ``floor(D / page) * page``.
* hugepages-<P> of a container = sum of the pools it maps that are backed by P-sized pages
  (engine: ``R * H_r`` and, embedded, ``R * D_r``; standalone DRAM sidecar: its pool); always a
  multiple of P, requests == limits, not part of the memory limit.
* /dev/shm (auto) = ``max(16 GiB, 4 GiB * R)``; an emptyDir ``medium: Memory`` whose pages count
  against the engine's memory limit.
* host buffers of the L3 client in the engine process (memfd / shm / malloc, so in the memory
  limit, never in hugepages), per rank from
  ``hicache_umbp.contract.staging.staging_memory_per_rank``:

  - write-back ring, when both a DRAM and an SSD tier are on (either mode: the tiered client
    runs in the engine process): ``floor(Q / p) * p`` (whole parts, never more than Q); it must
    hold one page, ``n * p <= Q``. Without K: ``Q`` (and ``Q >= 2 * 8 MiB`` is required);
  - embedded SSD node staging, when the SSD tier is on in embedded mode: ``16 * p`` (16 slots
    of one part; standalone: in the sidecar). Without K: ``16 * 8 MiB``.

  The engine counts ``R *`` (ring + staging).
* umbp-ssd sidecar (standalone SSD tier): staging slot ``s = roundup(p, 4 KiB)``, rendered
  both to the engine's ``umbp_ssd_slot_bytes`` and to the sidecar's
  ``UMBP_DISTRIBUTED_DRAM_PAGE_SIZE`` (``hicache_umbp.contract.mori_env``), so one part takes one
  slot and one 16-slot batch of a rank holds ``16 // n`` pages (``staging.ssd_keys_per_call``);
  ``2 * 16 * R`` slots; staging ``= slots * s`` (``staging.sidecar_ssd_staging_bytes``), taken
  from the sidecar's own DRAM pool; memory ``= roundup_GiB(2 GiB + staging)``. Without K the
  sidecar stays as it always was, byte for byte (an operator upgrade restarts no pod): 16 slots
  of 8 MiB (both sides' default, not rendered), 4 GiB.

  Why the slots scale with R: the one sidecar serves every rank of the pod, each rank's client
  keeps one batch of up to 16 slots in flight (``client_guards.SerializedClient``), and mori
  1.2.4 fails the puts of a batch that finds no free slot. Measured on the real
  ``umbp_standalone_server`` with N client processes as ranks, 16-value batches of 1 MiB
  (``make bench-sidecar-slots``): 4 ranks sharing 16 slots lost 272-288 of 640 puts, 8 ranks
  592-640 of 1,280; with 16 slots per rank none. mori also keeps a read batch's slots leased
  for about 0.2 s even with ``UMBP_SSD_READ_LEASE_MS=1`` (a floor of the standalone server), so
  a put right after a read needs 16 more: 4 ranks issuing read-then-put back to back lost 576
  of 640 puts with 64 slots and none with 128. Hence 2 x 16 per rank; the cost is small
  (DeepSeek-R1 bf16, N = 64, R = 8: 256 x 4,497,408 B = 1.07 GiB).
* pageSize: every page the pod's store would refuse when SGLang registers its host pool
  (``hicache_umbp.build.page_size_problems`` run on the rendered env: an embedded DRAM or SSD
  tier per rank smaller than one page, a ring that cannot hold one page, a part one sidecar
  batch cannot stage) is refused at ``spec.engine.pageSize`` with the largest pageSize the
  tiers hold (``largest_page_size``).
* engine memory (auto) = ``roundup_GiB(1.1 * (16 GiB + 12 GiB * R) + shm + 4 KiB-backed pools
  + ring + SSD staging)``: process overhead per rank (Python, ROCm runtime, SGLang scheduler)
  with 10 % headroom, the tmpfs, and the host buffers not in hugepages (sized exactly, no
  headroom on them). An explicit memory must cover ``shm + 4 KiB-backed pools + ring + SSD
  staging + 4 GiB``.
* SGLang's own host-memory check (``pool_host/base.py``): before it allocates a host pool it
  requires ``limit - usage - 10 GiB >= R * H`` (``HICACHE_HOST_MEMORY_RESERVE_BYTES``), with
  ``usage`` about the process memory. For a 4 KiB-backed host pool the engine memory is therefore
  at least ``4 GiB + 10 GiB + R * H`` (auto sizing always is; an explicit memory below it is
  refused). A hugepage-backed pool is checked against hugepages instead (the backend's host
  allocator hook), so the reserve does not apply to it.
* engine CPUs (auto) = ``4 + 8 * R``; each standalone sidecar gets 2 CPUs; the DRAM sidecar
  2 GiB plus its 4 KiB-backed pool, the SSD sidecar as above. Every container has integer CPUs
  and requests == limits, so the pod is Guaranteed QoS and the static CPU / Memory Managers can
  align it.
* Node fit: ``sum(hugepages) + sum(memory) <= node memory``, ``sum(cpu) <= node cpus``,
  ``R <= node GPUs``, ``sum(hugepages) <= policy.maxHugepagesPerPod``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from hicache_umbp.contract.page_limits import MHA_PARTS, MLA_PARTS
from hicache_umbp.contract.settings import HUGEPAGE_SIZES, ConfigError
from hicache_umbp.contract.staging import (
    SSD_STAGING_SLOTS,
    SSD_VALUE_BYTES_DEFAULT,
    sidecar_ssd_staging_bytes,
    staging_memory_per_rank,
)
from hicache_umbp.contract.units import (
    GIB,
    KIB,
    PAGE_4K,
    fmt_bytes,
    k8s_hugepage_resource,
    round_up,
)

from ..api.config import OperatorConfig
from ..api.quantity import format_bytes, parse_bytes
from ..api.spec import SGLangHiCacheSpec
from .errors import Problems

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
#: Process memory of a standalone sidecar besides its pools (the SSD one adds its staging).
SIDECAR_MEMORY = {"dram": 2 * GIB, "ssd": 2 * GIB}
#: The umbp-ssd sidecar's memory without the model's geometry: the flat 4 GiB it always had
#: (2 GiB of process, 2 GiB for 16 slots of 8 MiB and more), kept so such pods do not change.
SIDECAR_SSD_MEMORY_ASSUMED = 4 * GIB
#: Staging slots of the umbp-ssd sidecar per rank it serves: one batch in flight plus one read
#: batch whose slots mori still holds leased (module docstring).
SIDECAR_SSD_SLOTS_PER_RANK = 2 * SSD_STAGING_SLOTS
#: The sidecar's staging slot is a whole number of these (the contract's minimum slot).
SLOT_ALIGN = 4 * KIB
#: Without the model's geometry: the smallest write-back ring that holds one page of any layout
#: (MHA: K and V parts of the assumed 8 MiB).
QUEUE_MIN_BYTES = len(MHA_PARTS) * SSD_VALUE_BYTES_DEFAULT


@dataclass(frozen=True)
class PageGeometry:
    """One KV page as one rank's host pool registers it: ``parts`` parts of ``part_bytes``."""

    page_size: int  # tokens (spec.engine.pageSize)
    token_part_bytes: int  # bytes of one token in one part, per rank
    parts: int  # 2 (K, V) for mha, 1 for mla
    formula: str  # how token_part_bytes follows from the spec (summary arithmetic)

    @property
    def part_bytes(self) -> int:
        return self.page_size * self.token_part_bytes

    @property
    def page_bytes(self) -> int:
        return self.parts * self.part_bytes

    def describe(self) -> str:
        return (
            f"{self.parts} part(s) x {self.part_bytes} B = {self.page_bytes} B per rank "
            f"(part = pageSize {self.page_size} x {self.formula})"
        )


def page_geometry(
    spec: SGLangHiCacheSpec, attention_tp: int, problems: Problems
) -> PageGeometry | None:
    """The page one rank registers (module docstring, "Page geometry"); ``None`` without
    ``model.kvBytesPerToken`` (or with attention auto, which the cross-field rules refuse)."""
    m = spec.model
    k = m.kv_bytes_per_token
    if k is None or m.attention == "auto":
        return None
    if m.attention == "mla":
        return PageGeometry(
            spec.engine.page_size, k, len(MLA_PARTS),
            f"kvBytesPerToken {k} B; mla: one latent part, the same on every rank",
        )
    heads = m.kv_heads
    if heads is not None and heads % attention_tp and attention_tp % heads:
        problems.add(
            "spec.model.kvHeads",
            f"{heads} KV heads cannot be sharded over {attention_tp} attention-TP ranks: "
            f"SGLang needs one of the two to divide the other",
        )
        return None
    shards = attention_tp if heads is None else min(attention_tp, heads)
    divisor = len(MHA_PARTS) * shards
    if k % divisor:
        problems.add(
            "spec.model.kvBytesPerToken",
            f"{k} B is not a multiple of {len(MHA_PARTS)} (K and V) x {shards} "
            f"(the KV heads' shards over the attention-TP ranks) = {divisor}: an mha cache is "
            f"layers x KV heads x head dim x dtype bytes x 2, check the arithmetic"
            + ("" if heads is not None else " (or set model.kvHeads if the model has fewer "
               f"KV heads than the {attention_tp} ranks)"),
        )
        return None
    why = (f"{shards} attention-TP ranks" if heads is None or heads >= attention_tp
           else f"{heads} KV heads (one per rank: fewer than the {attention_tp} attention-TP "
           f"ranks)")
    return PageGeometry(
        spec.engine.page_size, k // divisor, len(MHA_PARTS),
        f"kvBytesPerToken {k} B / {len(MHA_PARTS)} (K, V) / {why}",
    )


def largest_page_size(page: PageGeometry, fits: Callable[[int], bool]) -> int:
    """The largest pageSize up to ``page.page_size`` whose part (``pageSize x token part``)
    ``fits`` accepts, 0 if none; every limit grows with the part, so a bisection finds it."""
    lo, hi = 0, page.page_size
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid * page.token_part_bytes):
            lo = mid
        else:
            hi = mid - 1
    return lo


def page_size_refusal(page: PageGeometry, reason: str, raise_: str, largest: int) -> str:
    """The message of a pageSize the pod would refuse: the page, the backend's reason (which
    names the limit) and what to change."""
    lower = (
        f"lower spec.engine.pageSize to at most {largest}" if largest
        else "no pageSize fits (even 1 token)"
    )
    return (
        f"a page of {page.describe()}: the pod would refuse it when SGLang registers the host "
        f"pool: {reason}; {lower}" + (f", or raise {raise_}" if raise_ else "")
    )


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

    @property
    def engine(self) -> ContainerSizing:
        return self.containers[0]

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

    ``page``: the model's page geometry (:func:`page_geometry`); ``None`` sizes the L3 staging
    for 8 MiB page parts."""
    lines: list[str] = []
    hc, l3, res = spec.hi_cache, spec.l3, spec.resources
    standalone = l3.mode == "standalone"

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
    ssd_r = 0 if standalone else ssd_bytes // ranks

    queue_r = parse_bytes(l3.tiering.queue_size, field="l3.tiering.queueSize")
    if page is None:
        ring_total, staging_total = _staging_assumed(
            ranks, queue_r, l3.tiering.queue_size, bool(ssd_bytes) and bool(dram_total),
            bool(ssd_bytes) and not standalone, problems, lines,
        )
    else:
        ring_total, staging_total = _staging_of_page(
            spec, page, ranks, queue_r, bool(dram_total), bool(ssd_bytes), lines
        )
    slot, slots, sidecar_staging, sidecar_memory = _ssd_sidecar(
        page, ranks, standalone and bool(ssd_bytes), lines
    )

    shm = _shm(spec, ranks, lines)

    engine_hp: dict[int, int] = {}
    _add(engine_hp, host_page, host_r * ranks)
    four_k_pools = 0 if host_page else host_r * ranks
    if not standalone:
        _add(engine_hp, dram_page, dram_total)
        four_k_pools += 0 if dram_page else dram_total
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

    engine_mem = _engine_memory(
        spec, ranks, shm, four_k_pools, ring_total + staging_total, problems, lines,
        sglang_checked_pool=None if host_page else host_r * ranks,
    )
    engine_cpu = (
        ENGINE_BASE_CPU + ENGINE_CPU_PER_RANK * ranks if res.cpu == "auto" else int(res.cpu)
    )
    if res.cpu == "auto":
        lines.append(
            f"engine cpu = {ENGINE_BASE_CPU} + {ENGINE_CPU_PER_RANK} x {ranks} ranks = {engine_cpu}"
        )
    containers = [ContainerSizing("engine", engine_cpu, engine_mem, engine_hp, gpus=ranks)]

    if standalone and dram_total:
        hp: dict[int, int] = {}
        _add(hp, dram_page, dram_total)
        mem = SIDECAR_MEMORY["dram"] + (0 if dram_page else dram_total)
        containers.append(ContainerSizing("umbp-dram", SIDECAR_CPU, mem, hp))
    if standalone and ssd_bytes:
        containers.append(ContainerSizing("umbp-ssd", SIDECAR_CPU, sidecar_memory))

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
    )
    _check_fit(sizing, config, problems)
    return sizing


def _staging_assumed(
    ranks: int, queue_r: int, queue_size: int | str, tiered: bool, embedded_ssd: bool,
    problems: Problems, lines: list[str],
) -> tuple[int, int]:
    """Ring and embedded SSD staging of the pod without the model's geometry: 8 MiB parts."""
    if queue_r < QUEUE_MIN_BYTES:
        problems.add(
            "spec.l3.tiering.queueSize",
            f"{queue_size} ({queue_r} B) cannot hold one page: "
            f"{len(MHA_PARTS)} parts x {SSD_VALUE_BYTES_DEFAULT} B slots = {QUEUE_MIN_BYTES} B",
        )
    ring_total = ranks * queue_r if tiered else 0
    if ring_total:
        lines.append(
            f"write-back ring = {ranks} ranks x queueSize {queue_r} B = {ring_total} B (memory)"
        )
    staging_total = ranks * SSD_STAGING_SLOTS * SSD_VALUE_BYTES_DEFAULT if embedded_ssd else 0
    if staging_total:
        lines.append(
            f"SSD staging = {ranks} ranks x {SSD_STAGING_SLOTS} slots x "
            f"{SSD_VALUE_BYTES_DEFAULT} B (assumed page part) = {staging_total} B (memory)"
        )
    return ring_total, staging_total


def _staging_of_page(
    spec: SGLangHiCacheSpec, page: PageGeometry, ranks: int, queue_r: int, dram: bool,
    ssd: bool, lines: list[str],
) -> tuple[int, int]:
    """Ring and embedded SSD staging of the pod from the real page part (the backend's own
    :func:`~hicache_umbp.contract.staging.staging_memory_per_rank`)."""
    part = page.part_bytes
    lines.append(f"page = {page.describe()}")
    try:
        st = staging_memory_per_rank(
            page_part_bytes=part, parts_per_page=page.parts, mode=spec.l3.mode,
            dram=dram, ssd=ssd, queue_bytes=queue_r,
        )
    except ConfigError:
        # The ring cannot hold one page: engine.check_page_size refuses the pageSize with the
        # backend's page_size_problems, which names this and every other limit it breaks.
        return 0, 0
    if st.ring_bytes:
        lines.append(
            f"write-back ring = {ranks} ranks x floor(queueSize {queue_r} B / part {part} B) x "
            f"{part} B = {ranks} x {st.ring_bytes} B = {ranks * st.ring_bytes} B (memory)"
        )
    if st.ssd_staging_bytes:
        lines.append(
            f"SSD staging = {ranks} ranks x {SSD_STAGING_SLOTS} slots x part {part} B = "
            f"{ranks * st.ssd_staging_bytes} B (memory)"
        )
    return ranks * st.ring_bytes, ranks * st.ssd_staging_bytes


def _ssd_sidecar(
    page: PageGeometry | None, ranks: int, on: bool, lines: list[str]
) -> tuple[int, int, int, int]:
    """(slot bytes, slots, staging bytes, memory) of the umbp-ssd sidecar (module docstring);
    without the geometry today's sidecar (16 slots of 8 MiB, 4 GiB), byte for byte."""
    if page is None:
        slot, slots = SSD_VALUE_BYTES_DEFAULT, SSD_STAGING_SLOTS
        staging = sidecar_ssd_staging_bytes(slot, slots)
        if on:
            lines.append(
                f"umbp-ssd staging = {slots} slots x {slot} B (8 MiB page parts assumed; the "
                f"{ranks} ranks share them) = {staging} B; memory "
                f"{format_bytes(SIDECAR_SSD_MEMORY_ASSUMED)}"
            )
        return slot, slots, staging if on else 0, SIDECAR_SSD_MEMORY_ASSUMED
    slot = round_up(page.part_bytes, SLOT_ALIGN)
    slots = SIDECAR_SSD_SLOTS_PER_RANK * ranks
    staging = sidecar_ssd_staging_bytes(slot, slots)
    memory = round_up(SIDECAR_MEMORY["ssd"] + staging, GIB)
    if on:
        lines.append(
            f"umbp-ssd staging = {SIDECAR_SSD_SLOTS_PER_RANK} slots x {ranks} ranks x slot "
            f"roundup(part {page.part_bytes} B, {format_bytes(SLOT_ALIGN)}) = {slots} x "
            f"{slot} B = {staging} B"
        )
        lines.append(
            f"umbp-ssd memory = roundup_GiB({format_bytes(SIDECAR_MEMORY['ssd'])} + staging "
            f"{staging} B) = {format_bytes(memory)}"
        )
    return slot, slots, staging if on else 0, memory


def staging_warnings(spec: SGLangHiCacheSpec, s: PodSizing) -> list[str]:
    """An SSD tier sized without the model's geometry says what was assumed."""
    if s.page is not None or not s.ssd_total:
        return []
    where = (
        f"the umbp-ssd sidecar's staging slots (16, shared by the {s.ranks} ranks; 32 per rank "
        f"with the geometry) are" if spec.l3.mode == "standalone"
        else "the engine's SSD staging is"
    )
    return [
        f"model.kvBytesPerToken is not set: {where} sized, and queueSize checked, for "
        f"page parts of {SSD_VALUE_BYTES_DEFAULT} B (8 MiB), while the pod stages the real "
        f"page part (a DeepSeek-R1 bf16 page of 128 tokens is 8994816 B) and refuses a "
        f"pageSize its L3 tiers cannot hold only when SGLang registers its host pool; set "
        f"model.kvBytesPerToken (with model.attention mha or mla) to size the staging exactly "
        f"and check pageSize at admission"
    ]


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
                f"L3 ring and SSD staging {l3_buffers} B + "
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
        f"4 KiB-backed pools {four_k_pools} B + L3 ring and SSD staging {l3_buffers} B) = "
        f"{format_bytes(mem)}"
    )
    return mem


def _check_fit(s: PodSizing, config: OperatorConfig, problems: Problems) -> None:
    facts, policy = config.node_facts, config.policy
    hp_total = sum(s.hugepages_total.values())
    node_mem = facts.memory_bytes
    if hp_total + s.memory_total > node_mem:
        # Point at the biggest contributor: the host pool, the UMBP DRAM or explicit memory.
        host = s.host_pool_per_rank * s.ranks
        path = "spec.hiCache.hostPoolPerRank" if host >= s.dram_total else "spec.l3.dram.capacity"
        problems.add(
            path,
            f"the pod needs hugepages {hp_total} B ({fmt_bytes(hp_total)}) + memory "
            f"{s.memory_total} B ({fmt_bytes(s.memory_total)}) = "
            f"{hp_total + s.memory_total} B, more than the node's {node_mem} B "
            f"({fmt_bytes(node_mem)}, {facts.gpu_model} node facts)",
        )
    max_hp = policy.max_hugepages_bytes
    if hp_total > max_hp:
        problems.add(
            "spec.hiCache.hostPoolPerRank",
            f"hugepages per pod {hp_total} B ({fmt_bytes(hp_total)}) exceed the admin policy "
            f"maxHugepagesPerPod {policy.max_hugepages_per_pod} ({max_hp} B)",
        )
    if s.cpu_total > facts.cpus:
        problems.add(
            "spec.resources.cpu",
            f"the pod needs {s.cpu_total} CPUs (all containers), the node has {facts.cpus}",
        )
    if s.ranks > facts.gpus_per_node:
        problems.add(
            "spec.engine",
            f"{s.ranks} GPUs per pod > {facts.gpus_per_node} GPUs on a {facts.gpu_model} node",
        )
