"""What a node charges a pod beyond its pools: sidecar page tables, and the time to stop.

* umbp-dram sidecar memory = ``roundup_MiB(2 GiB + D_4K + PT(D) + PT(R * H))``: the process
  (``umbp_standalone_server`` in its own memory cgroup, tests/backend/test_sidecar_memory_mori.py:
  charged 775 MiB idle with a 768 MiB pool, which it faults in at start, and 777 MiB with the pool
  full; its page tables grew from 1.72 to 2.75 MiB reading a 512 MiB registered engine pool, 8 B
  per 4 KiB page; 2 GiB keeps room for its gRPC threads), its pool when 4 KiB-backed, and the page
  tables the container is charged for: its own pool's and those of the engine's host pools it maps
  zero-copy (the engine registers them with both sidecars).
  ``PT(b) = ceil(b / page) * 8 B * 513/512`` (x86-64: one 8-byte entry per mapped page at the
  level that maps it, plus the level above), so a 4 KiB-backed 512 GiB pool costs 1 GiB of page
  tables (the old ``2 GiB + pool`` left ~1 GiB for a pool that fills: an OOM kill loses the DRAM
  tier). Only 4 KiB-backed mappings are counted: a hugepage mapping costs 1/512 (2 MiB pages) or
  less of that, inside the process allowance (the DeepSeek-R1 example's 1.6 TiB engine pool on
  2 MiB pages: 6.4 MiB). The umbp-ssd sidecar adds ``PT(R * H)`` of a 4 KiB-backed engine pool.
* terminationGracePeriodSeconds = ``5 + 300 [+ 60] + ceil(0.2 s/GiB * engine pools) + 30``: the
  ``preStop`` drain (``hicache_umbp.drain``: 5 s for the endpoints to drop the pod, then up to
  300 s for in-flight requests, long generations of large models; standalone, up to 60 s more
  for L3 to take what is still queued from the host pool: the kubelet runs the same hook before
  an in-place image change restarts the engine, and the sidecars keep L3 for the new one), then
  SIGTERM and the release
  of the engine's host pools (munmap and unpinning; bounded by the 0.174 s/GiB measured to
  allocate and prefault hugetlb memory, DESIGN §7), plus 30 s for the rest of the exit. The
  DeepSeek-R1 example (standalone, 8 x 200 GiB): 5 + 300 + 60 + 320 + 30 = 715 s, where 120 s
  cut long generations and the release.
* the engine's stop after SIGTERM = ``ceil(0.2 s/GiB * engine pools) + 30`` (the grace period's
  last part): the launcher's configuration watcher (``hicache_umbp.launch.revision``) drains
  (300 s [+ 60 s]) and then allows this long before SIGKILL, so an in-place configuration
  change stops the engine within the same budget as the kubelet's stop (DeepSeek-R1: 350 s; a
  fixed 110 s SIGKILLed it in the middle of unpinning 1.6 TiB). The planner renders it to the
  env contract (``HICACHE_ENGINE_STOP_GRACE_SECONDS``).
* in-place restart timeout = ``terminationGracePeriodSeconds + 120``: an in-place update fails
  when the engine container is still the old one this long after the update. The kubelet may
  legitimately take the whole grace period to stop the old container (drain, then release),
  then creates the new one (the image is pulled ahead, ``builders.prepull``); 120 s covers that
  creation. DeepSeek-R1: 835 s (the former fixed 600 s reported its slow, legitimate restarts
  as failed).
"""

from __future__ import annotations

MIB = 1024**2
GIB = 1024**3
PAGE_4K = 4096
#: Process memory of the umbp-dram sidecar besides its pool and page tables.
SIDECAR_PROCESS_MEMORY = 2 * GIB
#: x86-64 page tables: one 8-byte entry per mapped page (PTE per 4 KiB, PMD entry per 2 MiB).
PAGE_TABLE_BYTES_PER_PAGE = 8
#: preStop drain (hicache_umbp.drain): endpoint propagation, then in-flight requests.
DRAIN_ENDPOINT_DELAY_S = 5
DRAIN_TIMEOUT_S = 300
#: Standalone: then up to this long for L3 to catch up with the host pool (the same bound as the
#: launcher's configuration watcher, ``hicache_umbp.drain.L3_CATCH_UP_TIMEOUT_S``).
DRAIN_L3_TIMEOUT_S = 60
#: Seconds per GiB of engine pool to release at stop (0.2: upper bound, allocate + prefault).
RELEASE_S_PER_GIB = (1, 5)
GRACE_MARGIN_S = 30
#: After the old engine container stopped: the kubelet creates the new one (image present).
RESTART_START_MARGIN_S = 120


def page_table_bytes(nbytes: int, page_size: int) -> int:
    """Page-table bytes to map ``nbytes`` with ``page_size`` pages (0: 4 KiB), upper level
    included."""
    pages = -(-nbytes // (page_size or PAGE_4K))
    return -(-pages * PAGE_TABLE_BYTES_PER_PAGE * 513 // 512)


def mapped_page_tables(mappings: dict[int, int]) -> int:
    """Page tables of the 4 KiB-backed mappings (page size -> bytes; 0 or 4 KiB)."""
    return sum(page_table_bytes(b, p) for p, b in mappings.items() if p in (0, PAGE_4K))


def sidecar_dram_memory(pool_bytes: int, pool_page: int, registered: dict[int, int]) -> int:
    """The umbp-dram sidecar's memory: process, its pool when 4 KiB-backed, and the page tables
    of its pool and of the engine pools it maps (``registered``: page size -> bytes)."""
    total = SIDECAR_PROCESS_MEMORY + (0 if pool_page else pool_bytes)
    total += mapped_page_tables({pool_page: pool_bytes}) + mapped_page_tables(registered)
    return -(-total // MIB) * MIB


def termination_grace_seconds(engine_pool_bytes: int, l3_wait: bool = False) -> int:
    """terminationGracePeriodSeconds for an engine holding ``engine_pool_bytes`` of host pools
    (and embedded UMBP DRAM): drain (``l3_wait``: and let L3 catch up), then release them
    (module docstring)."""
    drain = DRAIN_ENDPOINT_DELAY_S + DRAIN_TIMEOUT_S + (DRAIN_L3_TIMEOUT_S if l3_wait else 0)
    return drain + engine_stop_grace_seconds(engine_pool_bytes)


def engine_stop_grace_seconds(engine_pool_bytes: int) -> int:
    """Seconds from SIGTERM to SIGKILL of an engine holding ``engine_pool_bytes``: the release
    of its pools plus the rest of the exit (module docstring)."""
    num, den = RELEASE_S_PER_GIB
    return -(-engine_pool_bytes * num // (den * GIB)) + GRACE_MARGIN_S


def in_place_restart_timeout_seconds(termination_grace_s: int) -> int:
    """How long after an in-place update the engine container may still be the old one
    (module docstring)."""
    return termination_grace_s + RESTART_START_MARGIN_S
