"""GPU discovery and per-rank NUMA on fake node trees (real launcher code, fake sysfs only)."""

from __future__ import annotations

import pytest
from hicache_umbp.launch.errors import LaunchError
from hicache_umbp.launch.gpus import numa_per_rank, probe_gpus
from hicache_umbp.launch.noderoot import NodeRoot
from hicache_umbp.launch.run import plan_launch

from .conftest import io_uring_ok, launch_env
from .fakenode import GIB, MI355X_BDFS, MIB, FakeNode


def _numa(node: FakeNode, env: dict[str, str] | None = None, ranks: int = 8) -> tuple[int, ...]:
    probe = probe_gpus(NodeRoot(node.root), env or {})
    return numa_per_rank(probe, ranks, "auto")[0]


@pytest.mark.parametrize("kfd", [True, False], ids=["kfd-topology", "render-links-only"])
def test_eight_gpus_on_two_numa_nodes(node: FakeNode, kfd: bool) -> None:
    node.mi355x(kfd=kfd)
    probe = probe_gpus(NodeRoot(node.root), {})
    assert [g.bdf for g in probe.gpus] == list(MI355X_BDFS)
    assert [g.render_node for g in probe.gpus] == [f"renderD{128 + 8 * i}" for i in range(8)]
    assert probe.source == ("KFD topology" if kfd else "render nodes")
    assert probe.physical_count == 8
    assert numa_per_rank(probe, 8, "auto") == ((0, 0, 0, 0, 1, 1, 1, 1), [])
    assert numa_per_rank(probe, 8, "none") == ((-1,) * 8, [])


def test_four_gpus_on_one_numa_node_bind_every_rank_to_it(node: FakeNode) -> None:
    node.cpu_kfd_nodes()
    for i, bdf in enumerate(MI355X_BDFS[:4]):
        node.add_gpu(bdf, 0, 128 + 8 * i)
    node.cgroup_v2({2 * MIB: 800 * GIB})
    node.hugepages(2 * MIB, free=409600)
    env = launch_env(tp_size=4, umbp_local_ranks=4)
    plan = plan_launch(env, NodeRoot(node.root), io_uring_probe=io_uring_ok)
    assert plan.report["numa_per_rank"] == [0, 0, 0, 0]
    assert plan.command.env_overrides["HICACHE_HOST_NUMA"] == "0,0,0,0"
    assert plan.command.extra_config["host_numa"] == 0  # one value for every rank


def test_gpu_without_numa_node_is_not_bound_and_warned(node: FakeNode) -> None:
    node.mi355x(numa=(0, 0, -1, 0, 1, 1, 1, 1))
    node.cgroup_v2({2 * MIB: 1600 * GIB})
    node.hugepages(2 * MIB, free=819200)
    plan = plan_launch(launch_env(), NodeRoot(node.root), io_uring_probe=io_uring_ok)
    assert plan.report["numa_per_rank"] == [0, 0, -1, 0, 1, 1, 1, 1]
    assert plan.command.env_overrides["HICACHE_HOST_NUMA"] == "0,0,-1,0,1,1,1,1"
    assert plan.report["warnings"] == [
        "rank 2: GPU 2 (0000:65:00.0) reports numa_node=-1; this rank's host pool and UMBP "
        "DRAM are not NUMA-bound"
    ]


def test_missing_numa_file_counts_as_unknown(node: FakeNode) -> None:
    node.add_gpu("0000:05:00.0", None, 128)
    probe = probe_gpus(NodeRoot(node.root), {})
    assert probe.gpus[0].numa_node == -1
    assert probe.warnings == (
        "GPU 0 (0000:05:00.0): no /sys/bus/pci/devices/0000:05:00.0/numa_node",)


def test_cpx_partitions_from_kfd_share_one_pci_address(node: FakeNode) -> None:
    """One physical GPU in CPX mode: 8 KFD nodes and render nodes, secondary partitions' render
    nodes hang off platform devices (amdgpu_xcp_*), so the PCI address comes from KFD."""
    node.cpu_kfd_nodes()
    for part in range(8):
        node.add_gpu("0000:85:00.0", 1, 128 + part, pci_link=part == 0)
    probe = probe_gpus(NodeRoot(node.root), {})
    assert [g.bdf for g in probe.gpus] == ["0000:85:00.0"] * 8
    assert [g.partition for g in probe.gpus] == list(range(8))
    assert probe.physical_count == 1
    assert numa_per_rank(probe, 8, "auto")[0] == (1,) * 8


def test_cpx_partitions_without_kfd_follow_render_links(node: FakeNode) -> None:
    for part in range(4):
        node.add_gpu("0000:05:00.0", 0, 128 + part, kfd=False)
    for part in range(4):
        node.add_gpu("0000:85:00.0", 1, 136 + part, kfd=False)
    probe = probe_gpus(NodeRoot(node.root), {})
    assert probe.physical_count == 2
    assert [g.partition for g in probe.gpus] == [0, 1, 2, 3] * 2
    assert numa_per_rank(probe, 8, "auto")[0] == (0, 0, 0, 0, 1, 1, 1, 1)


def test_partition_on_platform_device_without_kfd_is_a_clear_error(node: FakeNode) -> None:
    node.add_gpu("0000:05:00.0", 0, 128, kfd=False)
    node.add_gpu("0000:05:00.0", 0, 129, kfd=False, pci_link=False)
    with pytest.raises(LaunchError) as e:
        probe_gpus(NodeRoot(node.root), {})
    assert str(e.value) == (
        "cannot find the PCI address of /dev/dri/renderD129: /sys/class/drm/renderD129/device "
        "resolves to '/sys/devices/platform/amdgpu_xcp_129', not a PCI device, and there is no "
        "KFD topology (/sys/class/kfd/kfd/topology/nodes) to read it from"
    )


def test_kfd_gpus_of_other_containers_are_skipped(node: FakeNode) -> None:
    """KFD topology lists every GPU of the node; only those with a render node here count."""
    node.mi355x()
    for i in (0, 1, 2, 3):
        node.p(f"/dev/dri/renderD{128 + 8 * i}").unlink()
    assert [g.bdf for g in probe_gpus(NodeRoot(node.root), {}).gpus] == list(MI355X_BDFS[4:])


def test_visibility_variables_filter_in_rocr_then_hip_order(node: FakeNode) -> None:
    node.mi355x()
    root = NodeRoot(node.root)
    rocr = probe_gpus(root, {"ROCR_VISIBLE_DEVICES": "4,5,6,7"})
    assert [g.bdf for g in rocr.gpus] == list(MI355X_BDFS[4:])
    both = probe_gpus(root, {"ROCR_VISIBLE_DEVICES": "4,5,6,7", "HIP_VISIBLE_DEVICES": "1"})
    assert [(g.index, g.bdf, g.numa_node) for g in both.gpus] == [(0, "0000:95:00.0", 1)]
    assert both.filters == ("ROCR_VISIBLE_DEVICES=4,5,6,7", "HIP_VISIBLE_DEVICES=1")
    uuid = probe_gpus(root, {"ROCR_VISIBLE_DEVICES": "GPU-0000000000001006"})
    assert [g.bdf for g in uuid.gpus] == ["0000:e5:00.0"]
    cuda = probe_gpus(root, {"CUDA_VISIBLE_DEVICES": "7"})
    assert [g.bdf for g in cuda.gpus] == ["0000:f5:00.0"]
    hip_wins = probe_gpus(root, {"CUDA_VISIBLE_DEVICES": "7", "HIP_VISIBLE_DEVICES": "0"})
    assert [g.bdf for g in hip_wins.gpus] == ["0000:05:00.0"]


def test_bad_visibility_entry_names_variable_and_allowed_values(node: FakeNode) -> None:
    node.mi355x()
    with pytest.raises(LaunchError) as e:
        probe_gpus(NodeRoot(node.root), {"ROCR_VISIBLE_DEVICES": "0,1", "HIP_VISIBLE_DEVICES": "2"})
    assert str(e.value) == (
        "HIP_VISIBLE_DEVICES='2': entry '2' is not a visible GPU; allowed: indices 0..1")
    with pytest.raises(LaunchError) as e:
        probe_gpus(NodeRoot(node.root), {"ROCR_VISIBLE_DEVICES": "GPU-00000000deadbeef"})
    assert "no visible GPU has UUID 'GPU-00000000deadbeef'" in str(e.value)


def test_no_render_nodes_is_gpu_discovery_failure(node: FakeNode) -> None:
    with pytest.raises(LaunchError) as e:
        plan_launch(launch_env(), NodeRoot(node.root))
    assert e.value.reason == "GpuDiscoveryFailed"
    assert str(e.value) == (
        "no GPU render nodes in /dev/dri (expected renderD128, ...): the pod has no amd.com/gpu "
        "resources, or the device plugin did not mount them")


def test_fewer_gpus_than_ranks_names_both_numbers(node: FakeNode) -> None:
    node.mi355x()
    env = {**launch_env(), "HIP_VISIBLE_DEVICES": "0,1,2,3"}
    with pytest.raises(LaunchError) as e:
        plan_launch(env, NodeRoot(node.root))
    assert str(e.value) == (
        "HICACHE_UMBP_LOCAL_RANKS=8 needs 8 GPUs (rank i uses GPU i); 4 visible via KFD topology "
        "after HIP_VISIBLE_DEVICES=0,1,2,3: the pod's amd.com/gpu request or the visibility "
        "variables are short")
