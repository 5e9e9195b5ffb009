"""The hicache SSD engine (``spec.l3.ssd.engine: hicache``, the default) and several drives
(``spec.l3.ssd.volumes``) in the plan: mounts, claims, the env the pod reads, the sidecars, the
memory of the tier, and the refusals.

Everything is real: the planner, the builders, the backend's env contract it renders and parses
back, and the disk room's own layout formulas the memory is checked against. No fakes. Numbers
are worked out by hand in the docstrings.
"""

from __future__ import annotations

from typing import Any

import pytest
from hicache_operator.api.config import AdminPolicy, OperatorConfig
from hicache_operator.plan import plan
from hicache_umbp.contract.load import load_store_config
from hicache_umbp.disk.layout import index_bytes_for, slot_bytes_for, slots_for
from shc_testlib import (
    CONFIG,
    GI,
    all_containers,
    configmap_env,
    engine_container,
    example_cr,
    has_problem,
    plan_problems,
    pod_spec,
)

R1 = "deepseek-r1-mi355x.yaml"  # MLA, TP8, standalone, 3 TiB SSD on one 3500Gi claim
L405 = "llama-3.1-405b-mi355x.yaml"  # MHA, TP8, embedded, SSD on one claim
MI = 1024**2


def drives(n: int, size: str = "500Gi", **extra: Any) -> Any:
    def mutate(s: dict[str, Any]) -> None:
        ssd = s["l3"]["ssd"]
        ssd.pop("volume", None)
        ssd.update(capacity=f"{n * 400}Gi", **extra, volumes=[
            {"claimTemplate": {"storageClassName": "local-nvme", "size": size}}
            for _ in range(n)])

    return mutate


def test_standalone_hicache_runs_the_ssd_tier_in_the_engine() -> None:
    """No umbp-ssd sidecar and no SSD socket: the engine mounts the drive and the env names the
    engine, the drive, the per-rank share (3 TiB / 8), its threads, direct I/O, durability."""
    p = plan(example_cr(R1), CONFIG)
    names = {c["name"] for c in all_containers(p.objects)}
    assert names == {"engine", "umbp-dram"}
    assert {"name": "umbp-ssd", "mountPath": "/mnt/umbp-ssd"} in engine_container(
        p.objects)["volumeMounts"]
    env = configmap_env(p.objects)
    assert env["HICACHE_UMBP_SSD_ENGINE"] == "hicache"
    assert env["HICACHE_UMBP_SSD_DIR"] == "/mnt/umbp-ssd"
    assert env["HICACHE_UMBP_SSD_BYTES"] == str(3 * 1024 * GI // 8)
    assert env["HICACHE_UMBP_SSD_IO_THREADS"] == "8"
    assert env["HICACHE_UMBP_SSD_DIRECT_IO"] == "true"
    assert env["HICACHE_UMBP_SSD_DURABILITY"] == "relaxed"
    for mori_only in ("HICACHE_UMBP_SSD_SLOT_BYTES", "HICACHE_UMBP_SSD_IO_BACKEND",
                      "HICACHE_SSD_ALLOW_POSIX_FALLBACK"):
        assert mori_only not in env
    store = load_store_config({}, env)  # the pod's own loader accepts it
    assert store.ssd_dirs() == ("/mnt/umbp-ssd",) and store.ssd_pod_bytes() == 3 * 1024 * GI
    assert not any("io_uring" in w for w in p.warnings)


def test_eight_drives_mount_at_their_own_paths_with_their_own_claims() -> None:
    p = plan(example_cr(R1, drives(8, ioThreads=16, directIO=False)), CONFIG)
    sts = p.objects[-1]
    claims = sts["spec"]["volumeClaimTemplates"]
    assert [c["metadata"]["name"] for c in claims] == ["umbp-ssd"] + [
        f"umbp-ssd-{i}" for i in range(1, 8)]
    assert {c["spec"]["resources"]["requests"]["storage"] for c in claims} == {"500Gi"}
    mounts = [m for m in engine_container(p.objects)["volumeMounts"]
              if m["name"].startswith("umbp-ssd")]
    paths = ["/mnt/umbp-ssd"] + [f"/mnt/umbp-ssd-{i}" for i in range(1, 8)]
    assert [m["mountPath"] for m in mounts] == paths
    env = configmap_env(p.objects)
    assert env["HICACHE_UMBP_SSD_DIR"] == ",".join(paths)
    assert env["HICACHE_UMBP_SSD_IO_THREADS"] == "16"
    assert env["HICACHE_UMBP_SSD_DIRECT_IO"] == "false"
    assert p.ssd_claim_sizes == {c["metadata"]["name"]: 500 * GI for c in claims}


def test_each_drive_must_hold_its_share() -> None:
    """3200Gi over 2 drives of 1000Gi: 1600Gi per drive > 1000Gi - 5% = 950Gi."""
    problems = plan_problems(example_cr(R1, drives(2, "1000Gi"),
                                        lambda s: s["l3"]["ssd"].update(capacity="3200Gi")))
    assert has_problem(problems, "spec.l3.ssd.capacity", "3200Gi", "/ 2 drives",
                       "drive 0's claimTemplate volume", "= 1020054732800 B")


def test_mori_takes_one_volume() -> None:
    problems = plan_problems(example_cr(R1, drives(2, engine="mori")))
    assert has_problem(problems, "spec.l3.ssd.volumes", "engine mori stores in one directory")


def test_volume_and_volumes_are_exclusive() -> None:
    def both(s: dict[str, Any]) -> None:
        s["l3"]["ssd"]["volumes"] = [{"emptyDir": {"sizeLimit": "100Gi"}}]

    assert has_problem(plan_problems(example_cr(R1, both)), "spec.l3.ssd",
                       "set exactly one of volume or volumes")


def test_delete_with_resource_on_any_drive_deletes_the_claims() -> None:
    def delete_second(s: dict[str, Any]) -> None:
        s["l3"]["ssd"]["volumes"][1]["claimTemplate"]["deleteWithResource"] = True

    kept = plan(example_cr(R1, drives(2)), CONFIG).objects[-1]["spec"]
    gone = plan(example_cr(R1, drives(2), delete_second), CONFIG).objects[-1]["spec"]
    assert kept["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Retain"
    assert gone["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Delete"


def test_embedded_hicache_has_no_io_uring_warning_mori_does() -> None:
    ours = plan(example_cr(L405), CONFIG)
    mori = plan(example_cr(L405, lambda s: s["l3"]["ssd"].update(engine="mori")), CONFIG)
    assert not any("io_uring" in w for w in ours.warnings)
    assert any("SSD io_uring" in w for w in mori.warnings)
    assert configmap_env(ours.objects)["HICACHE_UMBP_SSD_DIR"] == "/mnt/umbp-ssd"
    assert configmap_env(mori.objects)["HICACHE_UMBP_SSD_DIR"] == "/mnt/umbp-ssd"
    assert "HICACHE_UMBP_SSD_ENGINE" not in configmap_env(mori.objects)  # env default: mori


def test_memory_counts_the_index_and_the_io_threads_by_hand() -> None:
    """DeepSeek-R1, 3 TiB, one drive: slot = 4,497,408 B (the page part, already 4 KiB-aligned),
    n = floor(3,298,534,883,328 / 4,497,408) = 733,425 -> 733,424 (whole sets of 16); index
    4096 + 64 x 733,424 = 46,943,232 -> 46,944,256 B; stacks 8 ranks x 1 drive x 8 threads x
    8 MiB = 512 MiB. No staging. Engine memory roundup_GiB(1.1 x 112 GiB + 32 GiB + ring
    8,563,064,832 + 46,944,256 + 536,870,912) = 163.7 -> 164 GiB."""
    p = plan(example_cr(R1), CONFIG)
    slot = slot_bytes_for(4_497_408)
    n = slots_for(3 * 1024 * GI, slot)
    assert (slot, n, index_bytes_for(n)) == (4_497_408, 733_424, 46_944_256)  # the disk's own
    assert p.sizing.ssd_disk_memory == 46_944_256 + 512 * MI
    assert p.sizing.ssd_staging_total == 0 and p.sizing.ssd_sidecar_staging == 0
    assert engine_container(p.objects)["resources"]["limits"]["memory"] == "164Gi"


def test_memory_with_eight_drives_and_without_the_geometry() -> None:
    """8 drives x 400Gi share, 16 threads: stacks 8 x 8 x 16 x 8 MiB = 8 GiB; each drive's index
    from its share. Without kvBytesPerToken the slot is 4 KiB: 400Gi / 4 KiB = 104,857,600
    slots, an index of 6.25 GiB + 4 KiB per drive (the plan warns)."""
    p = plan(example_cr(R1, drives(8, ioThreads=16)), CONFIG)
    n = slots_for(400 * GI, slot_bytes_for(4_497_408))  # 3200Gi over 8 ranks, 8 drives
    assert p.sizing.ssd_disk_memory == 8 * index_bytes_for(n) + 8 * GI

    def no_geometry(s: dict[str, Any]) -> None:
        s["model"].pop("kvBytesPerToken")

    bare = plan(example_cr(R1, drives(8), no_geometry), CONFIG)
    assert slots_for(400 * GI, 4096) == 104_857_600
    assert bare.sizing.ssd_disk_memory == 8 * index_bytes_for(104_857_600) + 4 * GI
    assert index_bytes_for(104_857_600) == 400 * GI // 64 + 4096
    assert any("the SSD tier's index is sized for 4 KiB slots" in w for w in bare.warnings)


@pytest.mark.parametrize("kind", ["emptyDir", "hostPath"])
def test_other_volume_kinds_as_drives(kind: str) -> None:
    vol = ({"emptyDir": {"sizeLimit": "100Gi"}} if kind == "emptyDir"
           else {"hostPath": {"path": "/mnt/nvme1", "size": "100Gi"}})

    def two(s: dict[str, Any]) -> None:
        s["l3"]["ssd"].pop("volume")
        s["l3"]["ssd"].update(capacity="150Gi", volumes=[vol, dict(vol)])

    config = OperatorConfig(policy=AdminPolicy(allowed_host_path_prefixes=["/mnt"]))
    p = plan(example_cr(L405, two), config)
    vols = {v["name"]: v for v in pod_spec(p.objects)["volumes"]}
    assert {"umbp-ssd", "umbp-ssd-1"} <= set(vols)
    assert "volumeClaimTemplates" not in p.objects[-1]["spec"]
    if kind == "emptyDir":
        res = engine_container(p.objects)["resources"]["requests"]
        assert res["ephemeral-storage"] == "200Gi"  # both drives


def test_an_explicit_memory_must_cover_the_index_and_the_threads() -> None:
    """R1 with an explicit memory: /dev/shm 32 GiB + ring 8,563,064,832 + index 46,944,256 +
    stacks 536,870,912 + 4 GiB process = 47,801,585,664 B (44.5 GiB): 44Gi is refused naming
    the SSD tier's part, 45Gi is taken as given."""
    def memory(size: str) -> Any:
        return lambda s: s.setdefault("resources", {}).update(memory=size)

    problems = plan_problems(example_cr(R1, memory("44Gi")))
    assert has_problem(problems, "spec.resources.memory",
                       "L3 ring and SSD index and threads 9146880000 B", "= 47801585664 B")
    p = plan(example_cr(R1, memory("45Gi")), CONFIG)
    assert engine_container(p.objects)["resources"]["limits"]["memory"] == "45Gi"
