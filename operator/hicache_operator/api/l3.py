"""``spec.l3``: the UMBP tiers (DRAM, SSD and its volume, their composition), typed models the
CRD is generated from; cross-field rules as CEL on the models, re-checked by the planner."""

from __future__ import annotations

from typing import Literal

from hicache_umbp.contract.builtin import BUILTIN_BACKEND, PREFAULT_THREADS_REFUSAL, SSD_REFUSAL
from pydantic import Field

from .types import ApiModel, HugePageSize, Quantity, cel_rules


class DramTier(ApiModel):
    """UMBP DRAM tier (L3), per pod."""

    capacity: Quantity = Field(
        default="0",
        description="DRAM tier per pod (split evenly across ranks in embedded mode; one "
        "server in standalone mode); 0 disables it.",
    )
    huge_page_size: HugePageSize = Field(
        default="none",
        description="Hugepages backing the DRAM tier (counted in hugepages-<size>); "
        "none uses 4 KiB pages counted in the memory limit.",
    )
    prefault: bool = Field(default=True, description="Touch the tier at start.")


class ClaimTemplate(ApiModel):
    """A per-pod PersistentVolumeClaim (StatefulSet volumeClaimTemplates)."""

    storage_class_name: str | None = Field(
        default=None, description="StorageClass (e.g. local-nvme); empty uses the cluster default."
    )
    size: Quantity = Field(description="Requested volume size.")
    delete_with_resource: bool = Field(
        default=False,
        description="Delete the per-pod SSD PVCs when the SGLangHiCache is deleted. By default "
        "they are kept, with their data and binding (with engine hicache a pod of the same "
        "name, model and layout serves their pages again; mori 1.2.4's SSD tier discards the "
        "segment files it finds when it starts); a scale-down follows whenScaled.",
    )
    when_scaled: Literal["Delete", "Retain"] = Field(
        default="Delete",
        description="persistentVolumeClaimRetentionPolicy.whenScaled: Delete (default) removes "
        "the claim of a pod a scale-down removes, so a later scale-up binds a new claim where "
        "the scheduler places the pod, not on the old pod's node (a local-NVMe claim pins the "
        "pod to it even when its GPUs are taken). "
        "Retain keeps it.",
    )
    rebind_after_seconds: int = Field(
        default=300,
        ge=0,
        le=604800,
        description="A pod Pending this long because its claim's volume is bound to a node "
        "that is gone, cordoned or not Ready (the PersistentVolume's nodeAffinity matches no "
        "Ready schedulable node) has its claim and itself deleted by the operator, so the "
        "StatefulSet recreates both and the pod starts elsewhere, with a cold SSD tier (an "
        "Event and the Degraded reason SsdVolumeLost say so). 0 never deletes.",
    )


class EmptyDirVolume(ApiModel):
    """An emptyDir on the node's ephemeral storage (lost with the pod)."""

    size_limit: Quantity = Field(
        description="emptyDir sizeLimit; also requested as ephemeral-storage."
    )


class HostPathVolume(ApiModel):
    """A host directory; only under a prefix the admin policy allows."""

    path: str = Field(pattern=r"^/[^:]*$", max_length=512, description="Absolute host path.")
    size: Quantity | None = Field(
        default=None,
        description="Usable size of the host filesystem, for the capacity check; the "
        "launcher checks free space in the pod either way.",
    )


class SsdVolume(ApiModel):
    """Where the SSD tier lives: exactly one volume kind."""

    model_config = cel_rules(
        (
            "(has(self.claimTemplate) ? 1 : 0) + (has(self.emptyDir) ? 1 : 0) + "
            "(has(self.hostPath) ? 1 : 0) == 1",
            "set exactly one of claimTemplate, emptyDir or hostPath",
        ),
    )

    claim_template: ClaimTemplate | None = Field(default=None, description="Per-pod PVC.")
    empty_dir: EmptyDirVolume | None = Field(default=None, description="Node ephemeral storage.")
    host_path: HostPathVolume | None = Field(
        default=None, description="Host directory (admin allow-listed prefixes only)."
    )


#: Drive volumes one pod's SSD tier may span (spec.l3.ssd.volumes): 8 NVMe drives per MI355X
#: server is usual; 16 leaves room without letting a CR mount hundreds of volumes.
MAX_SSD_VOLUMES = 16
#: SpecValid message of the mori engine given several drives (its SSD node takes one directory).
MORI_ONE_VOLUME_MESSAGE = (
    "engine mori stores in one directory (mori 1.2.4's SSD node takes one storage directory): "
    "give it one volume, or use engine hicache to stripe pages over several drives"
)


class SsdTier(ApiModel):
    """UMBP SSD tier (L3), per pod."""

    model_config = cel_rules(
        (
            "!has(self.enabled) || !self.enabled || (has(self.capacity) && "
            "(has(self.volume) || has(self.volumes)))",
            "an enabled SSD tier needs capacity and volume (or volumes)",
        ),
        (
            "!(has(self.volume) && has(self.volumes))",
            "set exactly one of volume or volumes",
        ),
        (
            "!has(self.volumes) || !has(self.engine) || self.engine != 'mori' || "
            "size(self.volumes) <= 1",
            MORI_ONE_VOLUME_MESSAGE,
        ),
    )

    enabled: bool = Field(default=False, description="Enable the SSD tier.")
    engine: Literal["hicache", "mori"] = Field(
        default="hicache",
        description="What stores the SSD tier. hicache: this project's store (slot files per "
        "drive read and written with O_DIRECT preadv/pwritev from a thread pool, one copy per "
        "pod shared by its ranks, pages striped over the drives, kept across engine and pod "
        "restarts on the same node and volume; no io_uring, so it runs under the "
        "RuntimeDefault seccomp profile). mori: mori 1.2.4's SSD node (embedded per rank, or "
        "the umbp-ssd sidecar in standalone mode; one volume; its files are discarded at "
        "start; reads are bounded by its staging, docs/performance.md).",
    )
    capacity: Quantity | None = Field(
        default=None,
        description="SSD tier per pod (engine hicache: one copy per pod, split evenly over "
        "the volumes; engine mori: split across ranks in embedded mode); must fit each "
        "volume's share minus headroomPercent.",
    )
    volume: SsdVolume | None = Field(
        default=None, description="The SSD volume (one drive); or use volumes.")
    volumes: list[SsdVolume] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_SSD_VOLUMES,
        description="The SSD tier's drives, one volume per NVMe drive (engine hicache; engine "
        "mori takes one). Drive 0 is mounted at /mnt/umbp-ssd, drive i at /mnt/umbp-ssd-<i>; "
        "per-pod claims are named umbp-ssd, umbp-ssd-1, ... The capacity is split evenly over "
        "them, so give them the same size. Exactly one of volume or volumes.",
    )
    headroom_percent: int = Field(
        default=5,
        ge=0,
        le=50,
        description="Part of the volume kept free (filesystem metadata, fragmentation).",
    )
    io_threads: int = Field(
        default=8,
        ge=1,
        le=256,
        description="Engine hicache: I/O threads per drive, the queue depth each drive sees "
        "(each thread is a stack in the engine's memory).",
    )
    direct_io: bool = Field(
        default=True,
        alias="directIO",
        description="Engine hicache: move 4 KiB-aligned pages between the host pool and the "
        "drive with O_DIRECT (no page cache, no copy); false, or a filesystem without "
        "O_DIRECT, goes through the page cache.",
    )
    io_backend: Literal["io_uring", "posix"] = Field(
        default="io_uring",
        description="Engine mori only: its SSD I/O engine (engine hicache always uses "
        "preadv/pwritev from threads and ignores this).",
    )
    allow_posix_fallback: bool = Field(
        default=False,
        description="Engine mori only: use posix I/O when io_uring is unavailable (e.g. "
        "blocked by the runtime's seccomp profile) instead of failing.",
    )
    durability: Literal["relaxed", "strict"] = Field(
        default="relaxed",
        description="relaxed: the page cache may hold recent writes; strict: each "
        "batch is durable before it is acknowledged.",
    )

    def drive_volumes(self) -> list[SsdVolume]:
        """The drives: ``volumes``, or the one ``volume``."""
        if self.volumes:
            return list(self.volumes)
        return [self.volume] if self.volume is not None else []


class Tiering(ApiModel):
    """How the DRAM and SSD tiers compose."""

    write_policy: Literal["write_back", "write_through"] = Field(
        default="write_back",
        description="DRAM -> SSD: write_back copies in the background through "
        "a bounded queue; write_through returns after both tiers hold the page.",
    )
    queue_size: Quantity = Field(
        default="1Gi",
        description="Write-back staging ring per rank: host memory (memfd/shm) the DRAM+SSD "
        "composition copies pages into before a background thread writes them to SSD. "
        "Counted in the engine container's memory (ranks x queueSize, rounded down to whole "
        "page parts when model.kvBytesPerToken is set); must hold at least "
        "one whole page of a rank (with model.kvBytesPerToken its real size, else 2 x 8 MiB "
        "page parts are assumed).",
    )
    promote_on_hit: bool = Field(default=True, description="Copy pages read from SSD into DRAM.")


class Eviction(ApiModel):
    """Eviction of the L3 tiers."""

    policy: Literal["lru"] = Field(
        default="lru",
        description="mori 1.2.4 evicts least-recently-used pages per tier; the only "
        "policy it implements.",
    )


#: SpecValid messages of what SGLang's built-in backend cannot do (planner and CEL alike), in
#: the backend contract's words (:mod:`hicache_umbp.contract.builtin`).
BUILTIN_SSD_MESSAGE = SSD_REFUSAL
BUILTIN_PREFAULT_THREADS_MESSAGE = (
    f"prefaultThreads cannot be honoured with l3.backend {BUILTIN_BACKEND}: "
    f"{PREFAULT_THREADS_REFUSAL}"
)


class L3(ApiModel):
    """HiCache L3 on AMD MORI UMBP."""

    model_config = cel_rules(
        (
            "!has(self.backend) || self.backend != 'sglang-mori' || !has(self.ssd) || "
            "!has(self.ssd.enabled) || !self.ssd.enabled",
            BUILTIN_SSD_MESSAGE,
        ),
        (
            "!has(self.mode) || self.mode != 'standalone' || !has(self.ssd) || "
            "!has(self.ssd.enabled) || !self.ssd.enabled || !has(self.ssd.engine) || "
            "self.ssd.engine != 'mori' || !has(self.ssd.ioBackend) || "
            "self.ssd.ioBackend == 'io_uring'",
            "ssd.ioBackend posix cannot be honoured in standalone mode with engine mori: the "
            "umbp_standalone_server of mori 1.2.4 always uses io_uring (and falls back to "
            "posix by itself); use io_uring or mode embedded",
        ),
    )

    backend: Literal["umbp", "sglang-mori"] = Field(
        default="umbp",
        description="Which L3 store SGLang runs. umbp: this project's UMBP backend (DRAM and "
        "SSD tiers, keys scoped to the deployment, model and page format, reconnects to a "
        "restarted sidecar). sglang-mori: SGLang's built-in mori backend "
        "(--hicache-storage-backend mori); on mori 1.2.4 only a DRAM tier (embedded or the "
        "standalone DRAM sidecar), no SSD tier. docs/architecture.md compares them.",
    )
    mode: Literal["embedded", "standalone"] = Field(
        default="embedded",
        description="embedded: UMBP in the SGLang process; standalone: one "
        "umbp_standalone_server sidecar per medium sharing a socket directory, so the cache "
        "survives engine restarts.",
    )
    image: str = Field(
        default="",
        max_length=512,
        description="Image of the standalone UMBP sidecars (umbp_standalone_server, from the "
        "amd-mori the engine image carries); empty: the engine image. A change of the "
        "sidecars' image restarts them, and their cache with them, so with updateStrategy "
        "InPlaceIfPossible set it to the image they run to roll out a new spec.image in "
        "place (the sidecar and the engine talk mori's standalone protocol: keep their "
        "amd-mori versions compatible). Standalone mode only.",
    )
    dram: DramTier = Field(default_factory=DramTier, description="DRAM tier.")
    ssd: SsdTier = Field(default_factory=SsdTier, description="SSD tier.")
    tiering: Tiering = Field(default_factory=Tiering, description="DRAM/SSD composition.")
    eviction: Eviction = Field(default_factory=Eviction, description="Eviction policy.")
