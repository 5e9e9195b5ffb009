"""The env contract between the operator, the launcher and the UMBP store: one table, one parser.

Every variable the pod reads is declared once in :data:`SETTINGS`: its extra-config key, its
environment variable, its type, default, the modes it applies to and what it means. The operator
imports this module to render env (never retyping a name), the launcher and the store import it to
read it back.

Sources, highest precedence first:

1. the explicit extra-config dict (SGLang's ``--hicache-storage-backend-extra-config`` JSON, or a
   dict handed to :func:`load_store_config`);
2. environment variables (``HICACHE_*``);
3. the defaults below.

Parsing is strict, because a silent misread costs a production pod:

* booleans accept ``true/false``, ``1/0``, ``yes/no``, ``on/off`` (any case) and nothing else;
  ``"false"`` is never true;
* integers and byte sizes are plain base-10 integers. ``"10Gi"`` is rejected: mori parses sizes
  with ``std::stoull``, which would read it as 10 bytes;
* enums list their allowed values in the error;
* per-rank values are a list (JSON) or a comma-separated string with exactly one entry per local
  rank, or a scalar that applies to every rank; ports given as a scalar auto-increment per rank;
* unknown keys and unknown ``HICACHE_*`` variables are errors naming the closest valid key;
* keys that only apply to another mode (e.g. ``socket_dir`` outside standalone) are errors.

Every problem found is reported at once in one :class:`ConfigError` (a ``ValueError``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from .builtin import L3_BACKENDS
from .media import Medium, l3_media, no_l3_tier
from .paths import REPORT_PATH, SOCKET_DIR, rank_ssd_dir
from .units import GIB, MIB

ENV_PREFIX = "HICACHE_"

MODES = ("embedded", "standalone", "distributed")
ALL_MODES = frozenset(MODES)

HUGEPAGE_SIZES = {"none": 0, "2Mi": 2 * MIB, "1Gi": GIB}
HUGEPAGE_BYTES_ALLOWED = tuple(sorted(HUGEPAGE_SIZES.values()))
#: Largest byte size any setting accepts (1 EiB): far above any host or SSD, far below what
#: mori's ``size_t`` / ``std::stoull`` overflow on, so a typo fails here naming its key.
MAX_BYTES = 1 << 60
#: Largest size of anything the pod maps in memory (a host pool, a UMBP DRAM tier, the
#: write-back ring, the sidecar's SSD staging): 128 TiB, the x86-64 user address space (47
#: bits), which no mapping can exceed. Measured on amd-mori 1.2.4: a DRAM tier of 2**60 bytes
#: failed ``PoolClient::Init()``, a ring of 2**60 bytes ``ENOMEM``, neither naming its key.
MAX_MEMORY_BYTES = 1 << 47
#: Largest NUMA node id (Linux MAX_NUMNODES is at most 1024).
MAX_NUMA_NODE = 1023
#: mori's ``UMBPStandaloneProcessConfig.startup_timeout_ms`` is a 32-bit int: a longer wait
#: fails at connect time with "incompatible function arguments".
MAX_STANDALONE_WAIT_S = (2**31 - 1) // 1000
#: A warning of each failure kind at least once a day: a longer interval would hide a failing
#: tier for longer than anyone reads a log.
MAX_LOG_INTERVAL_S = 86400.0
#: Ranks (GPUs) one SGLang server drives in one pod, the CRD's tensorParallelSize and
#: dataParallelSize bounds: no node has more GPUs.
MAX_RANKS = 64
#: Largest --page-size in tokens (the CRD's spec.engine.pageSize bound).
MAX_PAGE_TOKENS = 4096
#: Largest --hicache-ratio (the CRD's spec.hiCache.hostPoolRatio bound): the host pool is this
#: many times the GPU KV pool.
MAX_HOST_POOL_RATIO = 100.0
#: Lowest port a non-root engine (uid 10001, no CAP_NET_BIND_SERVICE) can listen on.
MIN_UNPRIVILEGED_PORT = 1024
#: Default staging slot (largest page part) of an SSD node / the umbp-ssd sidecar.
SSD_SLOT_BYTES_DEFAULT = 8 * MIB

Kind = Literal[
    "bool", "int", "bytes", "float", "str", "enum", "rank_int", "rank_bytes", "rank_port"
]

# Keys SGLang itself writes into or reads from the extra-config of a storage backend. They are
# accepted (and ignored by the store) so the same JSON can be handed to SGLang and to us.
# Verified against SGLang 0.5.23: StorageBackendFactory._create_dynamic_backend (backend_name,
# module_path, class_name), HiCacheController.attach_storage_backend (interface_v1) and
# _generate_storage_config (tp_lcm_size), HybridCacheController.parse_storage_backend_extra_config
# (the prefetch_* and pass-prefix keys), pool_host.common.get_allocator_type (allocator) and
# UnifiedRadixCache (file_storage_path, injected from --file-storage-path); extra_backend_tag is
# the key prefix SGLang's SiMM backend reads from the same extra-config.
SGLANG_EXTRA_CONFIG_KEYS = frozenset(
    {
        "backend_name",
        "module_path",
        "class_name",
        "interface_v1",
        "prefetch_threshold",
        "prefetch_timeout_base",
        "prefetch_timeout_per_ki_token",
        "hicache_storage_pass_prefix_keys",
        "tp_lcm_size",
        "allocator",
        "file_storage_path",
        # SGLang's SiMM backend prefixes its keys with it; we put it into our key scheme
        # (hicache_umbp.store.keys), so two tags never share pages.
        "extra_backend_tag",
    }
)


class ConfigError(ValueError):
    """All problems found in one configuration, each naming its key or variable."""

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid HiCache UMBP configuration:\n  - " + "\n  - ".join(self.problems))


@dataclass(frozen=True)
class Setting:
    """One configuration entry: extra-config ``key`` and environment variable ``env``."""

    key: str
    env: str
    kind: Kind
    default: Any
    doc: str
    modes: frozenset[str] = ALL_MODES
    choices: tuple[Any, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    scope: Literal["store", "launch"] = "store"
    #: why ``maximum`` is what it is (quoted in the error)
    why_maximum: str = ""


def _s(key: str, kind: Kind, default: Any, doc: str, **kw: Any) -> Setting:
    if kind in ("bytes", "rank_bytes"):
        kw.setdefault("maximum", MAX_BYTES)
        if kw["maximum"] == MAX_MEMORY_BYTES:
            kw.setdefault("why_maximum", "128 TiB, the x86-64 user address space: no host "
                          "mapping is larger")
    return Setting(key=key, env=ENV_PREFIX + key.upper(), kind=kind, default=default, doc=doc, **kw)


_EMB = frozenset({"embedded"})
_STA = frozenset({"standalone"})
_DIS = frozenset({"distributed"})
_EMB_STA = frozenset({"embedded", "standalone"})
#: The SSD tier's engines: ours (hicache.disk) and mori 1.2.4's SSD node.
SSD_ENGINES = ("hicache", "mori")

SETTINGS: tuple[Setting, ...] = (
    # --- identity and layout -------------------------------------------------------------------
    _s("umbp_mode", "enum", "embedded", "Where the L3 store runs: embedded (in the SGLang "
       "process), standalone (umbp_standalone_server sidecars, one per medium, over a UNIX "
       "socket; the cache survives engine restarts) or distributed (needs an RDMA NIC).",
       choices=MODES),
    _s("umbp_namespace", "str", "", "Key namespace shared by every pod of one deployment "
       "(the operator sets <namespace>/<name>); two deployments sharing a store never collide."),
    _s("umbp_model_id", "str", "", "Model identity in keys; empty means SGLang's model name."),
    _s("umbp_local_ranks", "int", 1, "Ranks (SGLang TP/DP workers) in this pod; per-rank lists "
       "must have exactly this many entries.", minimum=1, maximum=64),
    # --- DRAM tier (embedded) ------------------------------------------------------------------
    _s("umbp_dram_bytes", "rank_bytes", 0, "UMBP DRAM tier capacity per rank in bytes "
       "(0 disables the DRAM tier).", modes=_EMB, minimum=0, maximum=MAX_MEMORY_BYTES),
    _s("umbp_dram_numa", "rank_int", -1, "NUMA node per rank for the UMBP DRAM tier "
       "(-1: no binding).", modes=_EMB, minimum=-1, maximum=MAX_NUMA_NODE),
    _s("umbp_dram_hugepage_bytes", "enum", 0, "Hugepage size backing the UMBP DRAM tier "
       "(0: 4 KiB pages).", modes=_EMB, choices=HUGEPAGE_BYTES_ALLOWED),
    _s("umbp_dram_prefault", "bool", True, "Touch the UMBP DRAM tier at start so the first "
       "requests do not pay page faults.", modes=_EMB),
    # --- SSD tier ------------------------------------------------------------------------------
    _s("umbp_ssd_enabled", "bool", False, "Put an SSD tier behind (or instead of) DRAM."),
    _s("umbp_ssd_engine", "enum", "mori", "What stores the SSD tier: hicache (ours: slot "
       "files per drive, O_DIRECT preadv/pwritev from a thread pool, shared by the pod's ranks, "
       "kept across restarts; what the operator renders by default) or mori (mori 1.2.4's SSD "
       "node: embedded per rank, or the umbp-ssd sidecar in standalone mode; its files are "
       "discarded at start; the default here, so a pod rendered before the choice existed "
       "starts as it did).", modes=_EMB_STA,
       choices=SSD_ENGINES),
    _s("umbp_ssd_dir", "str", "", "SSD directories, comma-separated, one per drive. hicache: "
       "every rank of the pod opens all of them and pages are striped over them by key; mori "
       "(embedded only): one directory, rank i stores under <dir>/rank-<i>.", modes=_EMB_STA),
    _s("umbp_ssd_bytes", "rank_bytes", 0, "SSD tier capacity per rank in bytes; the hicache "
       "engine holds the ranks' sum for the pod, split evenly over the drives.",
       modes=_EMB_STA, minimum=0),
    _s("umbp_ssd_io_threads", "int", 8, "I/O threads per drive (hicache engine): the queue "
       "depth each drive sees.", modes=_EMB_STA, minimum=1, maximum=256,
       why_maximum="a drive's queue is saturated long before; each thread is a stack"),
    _s("umbp_ssd_direct_io", "bool", True, "hicache engine: move 4 KiB-aligned pages between "
       "the host pool and the drive with O_DIRECT (no page cache, no copy); false, or a "
       "filesystem without O_DIRECT, goes through the page cache.", modes=_EMB_STA),
    _s("umbp_ssd_io_backend", "enum", "io_uring", "SSD I/O engine of the mori engine (the "
       "hicache engine always uses preadv/pwritev from threads).", modes=_EMB,
       choices=("io_uring", "posix")),
    _s("umbp_ssd_durability", "enum", "relaxed", "relaxed: the page cache may hold recent "
       "writes (a pod or engine restart keeps them, a node crash may not); strict: every batch "
       "is durable before it is acknowledged (fdatasync + msync).", modes=_EMB_STA,
       choices=("relaxed", "strict")),
    # --- composition of DRAM in front of SSD -----------------------------------------------------
    _s("umbp_tier_write_policy", "enum", "write_back", "How pages written to DRAM reach the SSD "
       "tier: write_back (the set copies the page into a staging ring and a background thread "
       "writes it to SSD; 2-3x the set throughput of write_through in bench/l3_store.py) or "
       "write_through (the set returns after both tiers hold the page).",
       choices=("write_back", "write_through")),
    _s("umbp_tier_queue_bytes", "bytes", GIB, "Byte budget of the write-back staging ring "
       "(host memory per rank, memfd- or mori-shm-backed, so it counts against the container "
       "memory limit; the operator adds it to the pod memory). The ring holds "
       "floor(budget / value bytes) page parts and must hold at least one whole page; a full "
       "ring makes the set wait briefly, then write to SSD synchronously.", minimum=1,
       maximum=MAX_MEMORY_BYTES),
    _s("umbp_promote_on_hit", "bool", True, "Copy pages read from SSD into DRAM."),
    # --- standalone ----------------------------------------------------------------------------
    _s("umbp_socket_dir", "str", SOCKET_DIR, "Directory holding the standalone servers' "
       "UNIX sockets (dram.sock, ssd.sock), shared with the sidecars.", modes=_STA),
    _s("umbp_standalone_wait_s", "float", 120.0, "How long to wait for the sidecar sockets.",
       modes=_STA, minimum=0, maximum=MAX_STANDALONE_WAIT_S,
       why_maximum="mori's startup_timeout_ms is a 32-bit int of milliseconds"),
    _s("umbp_ssd_slot_bytes", "bytes", SSD_SLOT_BYTES_DEFAULT, "Staging slot of the umbp-ssd "
       "sidecar (its UMBP_DISTRIBUTED_DRAM_PAGE_SIZE): the largest page part it can store. "
       "Render it and the sidecar's env from the same number (>= the model's page part "
       "bytes); the store refuses, when SGLang registers the host pool, a pool whose page "
       "part is larger.", modes=_STA, minimum=4096, maximum=MAX_MEMORY_BYTES // 16,
       why_maximum="the sidecar stages 16 slots in its DRAM, and no mapping is larger than "
       "the 128 TiB x86-64 user address space"),
    # --- distributed ---------------------------------------------------------------------------
    _s("umbp_master_address", "str", "", "host:port of umbp_master.", modes=_DIS),
    _s("umbp_peer_port", "rank_port", 18500, "Peer service port; a scalar auto-increments per "
       "rank.", modes=_DIS, minimum=MIN_UNPRIVILEGED_PORT, maximum=65535),
    _s("umbp_rdma_devices", "str", "", "RDMA devices to use (comma list; empty: discover).",
       modes=_DIS),
    # --- logging -------------------------------------------------------------------------------
    _s("umbp_log_interval_s", "float", 30.0, "At most one warning per failure kind per interval "
       "on the data path.", minimum=0, maximum=MAX_LOG_INTERVAL_S,
       why_maximum="a failing tier must be logged at least once a day"),
    # --- host (L2) pool allocator --------------------------------------------------------------
    _s("host_hugepage_bytes", "enum", 2 * MIB, "Hugepage size of SGLang's host KV pool "
       "(0: 4 KiB pages).", choices=HUGEPAGE_BYTES_ALLOWED),
    _s("host_numa", "rank_int", -1, "NUMA node per rank for the host KV pool (-1: none).",
       minimum=-1, maximum=MAX_NUMA_NODE),
    _s("host_prefault", "bool", True, "Prefault the host pool before serving."),
    _s("host_prefault_threads", "int", 0, "Threads touching the host pool (0: one per CPU "
       "of the pod).", minimum=0, maximum=1024),
    _s("host_allow_4k_fallback", "bool", False, "Start on 4 KiB pages when hugepages are short "
       "(logged and reported) instead of failing."),
    # --- launcher (env only: read by `python -m hicache_umbp.launch`) --------------------------
    _s("l3_backend", "enum", "umbp", "L3 backend: umbp (ours) or sglang-mori (SGLang's built-in "
       "mori backend; on mori 1.2.4 only a DRAM tier, embedded or in the standalone DRAM "
       "sidecar).", choices=L3_BACKENDS, scope="launch"),
    _s("model_path", "str", "", "Model path or id passed to SGLang --model-path.", scope="launch"),
    _s("tp_size", "int", 1, "SGLang --tp-size.", minimum=1, maximum=MAX_RANKS, scope="launch",
       why_maximum="the GPUs of one node, spec.engine.tensorParallelSize's bound"),
    _s("dp_size", "int", 1, "SGLang --dp-size.", minimum=1, maximum=MAX_RANKS, scope="launch",
       why_maximum="the GPUs of one node, spec.engine.dataParallelSize's bound"),
    _s("enable_dp_attention", "bool", False, "SGLang --enable-dp-attention; the launcher then "
       "sets SGLANG_DP_RANK/SGLANG_DP_SIZE.", scope="launch"),
    _s("page_size", "int", 64, "SGLang --page-size (tokens per KV page).", minimum=1,
       maximum=MAX_PAGE_TOKENS, scope="launch", why_maximum="spec.engine.pageSize's bound"),
    _s("port", "int", 30000, "SGLang HTTP port (the engine runs as a non-root user: 1024 and "
       "up).", minimum=MIN_UNPRIVILEGED_PORT, maximum=65535, scope="launch"),
    _s("mem_layout", "enum", "page_first", "SGLang --hicache-mem-layout (UMBP needs page-first "
       "layouts).", choices=("page_first", "page_first_direct"), scope="launch"),
    _s("write_policy", "enum", "write_back", "SGLang --hicache-write-policy.",
       choices=("write_back", "write_through", "write_through_selective"), scope="launch"),
    _s("io_backend", "enum", "kernel", "SGLang --hicache-io-backend.",
       choices=("kernel", "direct"), scope="launch"),
    _s("host_pool_bytes", "rank_bytes", 0, "Host KV pool per rank in bytes (rendered to "
       "--hicache-size); 0 uses host_pool_ratio.", minimum=0, maximum=MAX_MEMORY_BYTES,
       scope="launch"),
    _s("host_pool_ratio", "float", 2.0, "SGLang --hicache-ratio when host_pool_bytes is 0.",
       minimum=1.0, maximum=MAX_HOST_POOL_RATIO, scope="launch",
       why_maximum="spec.hiCache.hostPoolRatio's bound"),
    _s("numa_policy", "enum", "auto", "auto: bind each rank's host pool and UMBP DRAM to its "
       "GPU's NUMA node; none: no binding.", choices=("auto", "none"), scope="launch"),
    _s("ssd_allow_posix_fallback", "bool", False, "Use posix I/O when io_uring is unavailable "
       "instead of failing.", scope="launch"),
    _s("engine_stop_grace_s", "int", 110, "Seconds from the SIGTERM the launcher's configuration "
       "watcher sends (updateStrategy InPlaceIfPossible, after the drain) to its SIGKILL: the "
       "release of the engine's host pools plus the rest of the exit, the same share of "
       "terminationGracePeriodSeconds the kubelet allows after its own drain (the operator "
       "renders it from the pools, planner.pod_overhead).", minimum=1, maximum=86400,
       scope="launch"),
    _s("extra_args", "str", "[]", "JSON list of extra SGLang arguments (operator-owned flags "
       "are rejected before they get here).", scope="launch"),
    _s("report_path", "str", REPORT_PATH, "Where the launcher writes "
       "what it resolved.", scope="launch"),
)

BY_KEY: dict[str, Setting] = {s.key: s for s in SETTINGS}
BY_ENV: dict[str, Setting] = {s.env: s for s in SETTINGS}
STORE_KEYS = frozenset(s.key for s in SETTINGS if s.scope == "store")


@dataclass(frozen=True)
class StoreConfig:
    """Resolved store configuration for one pod; per-rank fields hold one entry per local rank."""

    umbp_mode: str
    umbp_namespace: str
    umbp_model_id: str
    umbp_local_ranks: int
    umbp_dram_bytes: tuple[int, ...]
    umbp_dram_numa: tuple[int, ...]
    umbp_dram_hugepage_bytes: int
    umbp_dram_prefault: bool
    umbp_ssd_enabled: bool
    umbp_ssd_engine: str
    umbp_ssd_dir: str
    umbp_ssd_bytes: tuple[int, ...]
    umbp_ssd_io_threads: int
    umbp_ssd_direct_io: bool
    umbp_ssd_io_backend: str
    umbp_ssd_durability: str
    umbp_tier_write_policy: str
    umbp_tier_queue_bytes: int
    umbp_promote_on_hit: bool
    umbp_socket_dir: str
    umbp_standalone_wait_s: float
    umbp_ssd_slot_bytes: int
    umbp_master_address: str
    umbp_peer_port: tuple[int, ...]
    umbp_rdma_devices: str
    umbp_log_interval_s: float
    host_hugepage_bytes: int
    host_numa: tuple[int, ...]
    host_prefault: bool
    host_prefault_threads: int
    host_allow_4k_fallback: bool
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    def ssd_dirs(self) -> tuple[str, ...]:
        """The SSD tier's drive directories (``umbp_ssd_dir``, comma-separated)."""
        return ssd_dirs_of(self.umbp_ssd_dir)

    def ssd_pod_bytes(self) -> int:
        """The hicache engine's capacity for the whole pod: the ranks' sum."""
        return sum(self.umbp_ssd_bytes)

    def rank(self, local_rank: int) -> RankConfig:
        """The scalar view one rank's store uses."""
        if not 0 <= local_rank < self.umbp_local_ranks:
            raise ConfigError(
                [f"local rank {local_rank} is outside 0..{self.umbp_local_ranks - 1} "
                 f"(umbp_local_ranks={self.umbp_local_ranks})"]
            )
        r = local_rank
        dirs = self.ssd_dirs()
        ssd_dir = rank_ssd_dir(dirs[0], r) if dirs else ""
        return RankConfig(
            config=self,
            local_rank=r,
            dram_bytes=self.umbp_dram_bytes[r],
            dram_numa=self.umbp_dram_numa[r],
            ssd_dir=ssd_dir,
            ssd_bytes=self.umbp_ssd_bytes[r],
            peer_port=self.umbp_peer_port[r],
            host_numa=self.host_numa[r],
        )


def ssd_dirs_of(raw: str) -> tuple[str, ...]:
    return tuple(d.strip() for d in raw.split(",") if d.strip())


@dataclass(frozen=True)
class RankConfig:
    config: StoreConfig
    local_rank: int
    dram_bytes: int
    dram_numa: int
    ssd_dir: str
    ssd_bytes: int
    peer_port: int
    host_numa: int

    def media(self) -> tuple[Medium, ...]:
        """The L3 media this rank uses, DRAM first (:func:`~.media.l3_media`): embedded, DRAM
        when ``umbp_dram_bytes`` > 0; standalone, the DRAM server always; SSD when
        ``umbp_ssd_enabled``."""
        cfg = self.config
        media = l3_media(cfg.umbp_mode, dram=self.dram_bytes > 0, ssd=cfg.umbp_ssd_enabled)
        if not media:
            raise ConfigError([f"rank {self.local_rank}: " + no_l3_tier(
                dram="umbp_dram_bytes", ssd="umbp_ssd_enabled")])
        return media


@dataclass(frozen=True)
class LaunchConfig:
    """The launcher's view: the store config plus the engine intent the operator passed."""

    store: StoreConfig
    model_path: str
    tp_size: int
    dp_size: int
    enable_dp_attention: bool
    page_size: int
    port: int
    mem_layout: str
    write_policy: str
    io_backend: str
    host_pool_bytes: tuple[int, ...]
    host_pool_ratio: float
    numa_policy: str
    ssd_allow_posix_fallback: bool
    engine_stop_grace_s: int
    extra_args: tuple[str, ...]
    report_path: str
    l3_backend: str
