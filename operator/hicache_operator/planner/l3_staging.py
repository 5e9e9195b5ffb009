"""The L3 client's host buffers, sized from the page part: the write-back ring and the SSD
staging in the engine, the hicache SSD tier's index and I/O threads, and the umbp-ssd sidecar's
staging slots.

Notation as in :mod:`.sizing` (R ranks, Q the ring budget per rank) and :mod:`.page_geometry`
(``n`` parts of ``p`` bytes per page).

Host buffers of the L3 client in the engine process (memfd / shm / malloc, so in the memory
limit, never in hugepages), per rank from
``hicache_umbp.contract.staging.staging_memory_per_rank``:

- write-back ring, when both a DRAM and an SSD tier are on (either mode: the tiered client
  runs in the engine process): ``floor(Q / p) * p`` (whole parts, never more than Q); it must
  hold one page, ``n * p <= Q``. Without K: ``Q`` (and ``Q >= 2 * 8 MiB`` is required);
- embedded SSD node staging, when the SSD tier is on in embedded mode: ``16 * p`` (16 slots
  of one part; standalone: in the sidecar). Without K: ``16 * 8 MiB``.

The engine counts ``R *`` (ring + staging).

hicache SSD tier (``spec.l3.ssd.engine: hicache``, the backend's ``hicache_umbp.disk``; in the
engine, either mode), M drives, T I/O threads per drive, the pod's tier ``S_p = R * S_r``:

- no staging buffer: pages move between the host pool and the drive with ``O_DIRECT``;
- slot ``s = roundup(p, 4 KiB)``; without K, ``s = 4 KiB`` (the smallest slot: the most slots,
  so the largest index, conservative); slots per drive ``n = floor(floor(S_p / M) / s)`` in
  whole sets of 16 (``hicache_umbp.disk.layout.slots_for``);
- index per drive ``roundup(4096 + 64 * n, 4 KiB)`` (``index.hcx``, ``layout.index_bytes_for``):
  a shared file mapping every rank maps, whose pages are charged once to the pod's memory
  cgroup (they are touched, not reclaimable while mapped and in use): counted once per drive;
- I/O thread stacks ``R * M * T * 8 MiB``: each rank's process runs T threads per drive, each
  with glibc's default 8 MiB stack (RLIMIT_STACK), an upper bound of what a thread is charged.

With ``directIO: false`` the data goes through the page cache, which the kernel reclaims under
the limit: not counted. DeepSeek-R1 (p = 4,497,408 B, s = 4,497,408 B, R = 8) with 3 TiB on one
drive: n = 733,424, index 44.8 MiB, stacks 512 MiB; on 8 drives: 8 x 5.6 MiB, stacks 4 GiB.

umbp-ssd sidecar (standalone SSD tier, engine mori): staging slot ``s = roundup(p, 4 KiB)``,
rendered both to the engine's ``umbp_ssd_slot_bytes`` and to the sidecar's
``UMBP_DISTRIBUTED_DRAM_PAGE_SIZE`` (``hicache_umbp.contract.mori_env``), so one part takes one
slot and one 16-slot batch of a rank holds ``16 // n`` pages (``staging.ssd_keys_per_call``);
``2 * 16 * R`` slots; staging ``= slots * s`` (``staging.sidecar_ssd_staging_bytes``), taken
from the sidecar's own DRAM pool; memory ``= roundup_GiB(2 GiB + staging)``. Without K the
sidecar stays as it always was, byte for byte (an operator upgrade restarts no pod): 16 slots
of 8 MiB (both sides' default, not rendered), 4 GiB.

Why the slots scale with R: the one sidecar serves every rank of the pod, each rank's client keeps
one batch of up to 16 slots in flight (``hicache_umbp.clients.guards.SerializedClient``), and mori
1.2.4 fails the puts of a batch that finds no free slot. Measured on the real
``umbp_standalone_server`` with N client processes as ranks, 16-value batches of 1 MiB (``make
bench-sidecar-slots``): 4 ranks sharing 16 slots lost 272-288 of 640 puts, 8 ranks 592-640 of 1,280;
with 16 slots per rank none. mori also keeps a read batch's slots leased for about 0.2 s even with
``UMBP_SSD_READ_LEASE_MS=1`` (a floor of the standalone server), so a put right after a read needs
16 more: 4 ranks issuing read-then-put back to back lost 576 of 640 puts with 64 slots and none with
128. Hence 2 x 16 per rank; the cost is small (DeepSeek-R1 bf16, N = 64, R = 8: 256 x 4,497,408 B =
1.07 GiB).
"""

from __future__ import annotations

from hicache_umbp.contract.page_limits import MHA_PARTS
from hicache_umbp.contract.settings import ConfigError
from hicache_umbp.contract.staging import (
    SSD_STAGING_SLOTS,
    SSD_VALUE_BYTES_DEFAULT,
    sidecar_ssd_staging_bytes,
    staging_memory_per_rank,
)
from hicache_umbp.contract.units import GIB, KIB, round_up

from ..api.quantity import format_bytes
from ..api.spec import SGLangHiCacheSpec
from .errors import Problems
from .page_geometry import PageGeometry

#: Process memory of the umbp-ssd sidecar besides its staging.
SIDECAR_SSD_PROCESS_MEMORY = 2 * GIB
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


def staging_assumed(
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


def staging_of_page(
    spec: SGLangHiCacheSpec, page: PageGeometry, ranks: int, queue_r: int, dram: bool,
    ssd: bool, lines: list[str], *, ssd_staging: bool = True,
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
    staged = st.ssd_staging_bytes if ssd_staging else 0
    if staged:
        lines.append(
            f"SSD staging = {ranks} ranks x {SSD_STAGING_SLOTS} slots x part {part} B = "
            f"{ranks * st.ssd_staging_bytes} B (memory)"
        )
    return ranks * st.ring_bytes, ranks * staged


#: Smallest slot of the hicache SSD tier (``hicache_umbp.disk.layout.ALIGN``), assumed without
#: the model's geometry.
DISK_SLOT_ALIGN = 4 * KIB
DISK_SUPERBLOCK_BYTES = 4 * KIB
DISK_ENTRY_BYTES = 64
DISK_WAYS = 16
#: glibc's default thread stack (RLIMIT_STACK, 8 MiB in containerd's and Docker's defaults).
IO_THREAD_STACK_BYTES = 8 * 1024 * KIB


def disk_slots(share_bytes: int, slot_bytes: int) -> int:
    """Slots one drive of ``share_bytes`` holds: whole sets of 16 (module docstring)."""
    n = share_bytes // slot_bytes
    return n - n % DISK_WAYS if n >= DISK_WAYS else n


def disk_index_bytes(nslots: int) -> int:
    """``index.hcx`` of one drive: superblock plus 64 B per slot, whole 4 KiB pages."""
    return round_up(DISK_SUPERBLOCK_BYTES + nslots * DISK_ENTRY_BYTES, DISK_SLOT_ALIGN)


def disk_tier_memory(
    page: PageGeometry | None, ranks: int, pod_bytes: int, drives: int, io_threads: int,
    lines: list[str],
) -> int:
    """The hicache SSD tier's memory in the engine container: index mappings plus I/O thread
    stacks (module docstring)."""
    slot = DISK_SLOT_ALIGN if page is None else round_up(page.part_bytes, DISK_SLOT_ALIGN)
    share = pod_bytes // max(drives, 1)
    nslots = disk_slots(share, slot)
    index = disk_index_bytes(nslots)
    stacks = ranks * drives * io_threads * IO_THREAD_STACK_BYTES
    total = drives * index + stacks
    how = ("4 KiB assumed: model.kvBytesPerToken unset" if page is None else
           f"roundup(part {page.part_bytes} B, 4 KiB)")
    lines.append(
        f"SSD index = {drives} drive(s) x roundup(4096 + 64 x floor({pod_bytes} B / {drives} / "
        f"slot {slot} B ({how})) = {nslots} slots, 4 KiB) = {drives} x {index} B (memory, "
        f"shared by the ranks)")
    lines.append(
        f"SSD I/O threads = {ranks} ranks x {drives} drive(s) x {io_threads} threads x "
        f"{format_bytes(IO_THREAD_STACK_BYTES)} stack = {stacks} B (memory)")
    return total


def ssd_sidecar(
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
    memory = round_up(SIDECAR_SSD_PROCESS_MEMORY + staging, GIB)
    if on:
        lines.append(
            f"umbp-ssd staging = {SIDECAR_SSD_SLOTS_PER_RANK} slots x {ranks} ranks x slot "
            f"roundup(part {page.part_bytes} B, {format_bytes(SLOT_ALIGN)}) = {slots} x "
            f"{slot} B = {staging} B"
        )
        lines.append(
            f"umbp-ssd memory = roundup_GiB({format_bytes(SIDECAR_SSD_PROCESS_MEMORY)} + staging "
            f"{staging} B) = {format_bytes(memory)}"
        )
    return slot, slots, staging if on else 0, memory


def staging_warnings(spec: SGLangHiCacheSpec, page: PageGeometry | None, ssd_total: int,
                     ranks: int) -> list[str]:
    """An SSD tier sized without the model's geometry says what was assumed."""
    if page is not None or not ssd_total:
        return []
    if spec.l3.ssd.engine == "hicache":
        return [
            "model.kvBytesPerToken is not set: the SSD tier's index is sized for 4 KiB slots "
            "(the smallest page part, so the most slots: 64 B of memory per 4 KiB of SSD), "
            f"and queueSize checked for page parts of {SSD_VALUE_BYTES_DEFAULT} B (8 MiB); set "
            "model.kvBytesPerToken (with model.attention mha or mla) to size both from the "
            "real page and check pageSize at admission"
        ]
    where = (
        f"the umbp-ssd sidecar's staging slots (16, shared by the {ranks} ranks; 32 per rank "
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
