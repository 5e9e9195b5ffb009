"""mori's own ``UMBP_*`` environment for one ``umbp_standalone_server`` sidecar.

These are mori's variable names, not our ``HICACHE_*`` contract: the operator renders them into
the sidecar containers, and the tests start real servers with them. Measured on amd-mori 1.2.4
(tests/backend/test_client_contract_mori.py).
"""

from __future__ import annotations

from .media import Medium
from .settings import SSD_SLOT_BYTES_DEFAULT, ConfigError
from .staging import SSD_STAGING_SLOTS

#: The standalone server binary of the amd-mori wheel (on PATH in the engine image).
STANDALONE_SERVER_BINARY = "umbp_standalone_server"
# mori's variables for a client of a standalone server (UMBPConfig.from_environment and SGLang's
# built-in backend read them): the server address (``unix:<socket>``), and whether the client
# may start a server itself (the operator's sidecar owns it: never).
STANDALONE_ADDRESS = "UMBP_STANDALONE_ADDRESS"
STANDALONE_AUTO_START = "UMBP_STANDALONE_AUTO_START"
# mori's DRAM tier (a server's, or an in-process client's: UMBPConfig.from_environment()).
DRAM_USE_HUGEPAGES = "UMBP_DRAM_USE_HUGEPAGES"
DRAM_HUGEPAGE_SIZE = "UMBP_DRAM_HUGEPAGE_SIZE"
DRAM_NUMA_NODE = "UMBP_DRAM_NUMA_NODE"
DRAM_PREFAULT = "UMBP_DRAM_PREFAULT"
#: An SSD server's tier: its directory and capacity, and its staging slot (the largest value).
SSD_DIR = "UMBP_SSD_DIR"
SSD_CAPACITY = "UMBP_SSD_CAPACITY"
DISTRIBUTED_DRAM_PAGE_SIZE = "UMBP_DISTRIBUTED_DRAM_PAGE_SIZE"
#: A standalone server's DRAM pool (the umbp-dram sidecar's capacity; an SSD server stages in it).
DRAM_CAPACITY = "UMBP_DRAM_CAPACITY"
#: mori 1.2.4's SSD node keeps a staging slot leased for ``UMBP_SSD_READ_LEASE_MS`` (~3 s by
#: default) after each read, for a remote reader to pull it; with 16 slots every read batch
#: after the first then stalls ~3 s. Our reads copy out of the slot inside the call (embedded
#: and standalone alike), so a 1 ms lease is enough; mori reads the variable once per process,
#: so it must be set before the first SSD client exists (measured: ~7 ms instead of ~3 s per
#: 16-key read batch; tests/backend/test_tiers_mori.py).
SSD_READ_LEASE_ENV = "UMBP_SSD_READ_LEASE_MS"
SSD_READ_LEASE_MS = 1


def standalone_client_env(socket_path: str) -> dict[str, str]:
    """A mori client of the server at ``unix:<socket_path>`` that never spawns one itself."""
    return {STANDALONE_ADDRESS: f"unix:{socket_path}", STANDALONE_AUTO_START: "0"}


def dram_tier_env(*, hugepage_bytes: int, numa_node: int, prefault: bool) -> dict[str, str]:
    """mori's DRAM tier backing: hugepages of ``hugepage_bytes`` (0: 4 KiB pages), one NUMA
    node (-1: unbound), prefault. One value per process: mori reads one of each."""
    env = {DRAM_USE_HUGEPAGES: "1" if hugepage_bytes else "0",
           DRAM_PREFAULT: "1" if prefault else "0"}
    if hugepage_bytes:
        env[DRAM_HUGEPAGE_SIZE] = str(int(hugepage_bytes))
    if numa_node >= 0:
        env[DRAM_NUMA_NODE] = str(int(numa_node))
    return env


def standalone_server_env(
    medium: Medium,
    *,
    capacity_bytes: int,
    ssd_dir: str = "",
    io_backend: str = "io_uring",
    durability: str = "relaxed",
    hugepage_bytes: int = 0,
    numa_node: int = -1,
    value_bytes: int = SSD_SLOT_BYTES_DEFAULT,
    staging_slots: int = SSD_STAGING_SLOTS,
) -> dict[str, str]:
    """mori's own ``UMBP_*`` variables for one ``umbp_standalone_server`` (one medium each).

    mori reads sizes with ``std::stoull``: they are rendered as plain byte integers.
    ``UMBP_ROLE`` is pinned: unset, mori derives it from ``LOCAL_RANK`` (non-zero: follower).
    An SSD server is an SSD *node* (``UMBP_DISTRIBUTED_MEDIUM=SSD``): it stages each put batch
    in ``staging_slots`` slots of ``UMBP_DISTRIBUTED_DRAM_PAGE_SIZE`` bytes carved from its DRAM
    pool, so ``value_bytes`` must cover the largest page part and the DRAM pool is sized to the
    staging (mori refuses a 0-byte pool). ``UMBP_SSD_BACKEND`` is the store kind (``file``); the
    1.2.4 server reads no variable for the I/O engine: it uses io_uring and falls back to posix
    by itself, so ``io_backend="posix"`` cannot be honoured and is rejected.
    Measured on amd-mori 1.2.4 (tests/backend/test_client_contract_mori.py).
    """
    if capacity_bytes <= 0:
        raise ConfigError([f"standalone {medium} server needs a capacity > 0 bytes"])
    if medium == "dram":
        env = {
            "UMBP_ROLE": "standalone",
            DRAM_CAPACITY: str(int(capacity_bytes)),
            "UMBP_SSD_ENABLED": "0",
        }
        if hugepage_bytes:
            env[DRAM_USE_HUGEPAGES] = "1"
            env[DRAM_HUGEPAGE_SIZE] = str(int(hugepage_bytes))
        if numa_node >= 0:
            env[DRAM_NUMA_NODE] = str(int(numa_node))
        return env
    problems = []
    if not ssd_dir:
        problems.append("standalone ssd server needs ssd_dir")
    if io_backend != "io_uring":
        problems.append(
            f"standalone ssd server: io_backend={io_backend!r} cannot be set (mori 1.2.4 reads "
            "no env for it; it uses io_uring and falls back to posix itself); use io_uring"
        )
    if durability not in ("relaxed", "strict"):
        problems.append(f"durability={durability!r}; allowed: relaxed, strict")
    if value_bytes <= 0 or staging_slots <= 0:
        problems.append("value_bytes and staging_slots must be > 0")
    if problems:
        raise ConfigError(problems)
    staging = int(value_bytes) * int(staging_slots)
    return {
        "UMBP_ROLE": "standalone",
        "UMBP_SSD_ENABLED": "1",
        SSD_DIR: ssd_dir,
        SSD_CAPACITY: str(int(capacity_bytes)),
        "UMBP_SSD_BACKEND": "file",
        "UMBP_SSD_DURABILITY": durability,
        "UMBP_DISTRIBUTED_MEDIUM": "SSD",
        DISTRIBUTED_DRAM_PAGE_SIZE: str(int(value_bytes)),
        "UMBP_DISTRIBUTED_SSD_STAGING_BUFFER_SLOTS": str(int(staging_slots)),
        "UMBP_DISTRIBUTED_SSD_STAGING_BUFFER_SIZE": str(staging),
        DRAM_CAPACITY: str(staging),
        # The server copies reads out of its staging slots inside the call; the ~3 s default
        # lease would stall every read batch after the first.
        SSD_READ_LEASE_ENV: str(SSD_READ_LEASE_MS),
    }
