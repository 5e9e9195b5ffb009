"""Hugepage checks against fake cgroup v1/v2, sysfs and /proc/meminfo trees (real launcher code)."""

from __future__ import annotations

import pytest
from hicache_umbp.launch.errors import LaunchError
from hicache_umbp.launch.noderoot import NodeRoot
from hicache_umbp.launch.run import plan_launch

from .conftest import io_uring_ok, launch_env
from .fakenode import GIB, MIB, FakeNode

FIX = (". Fix the request or the node, or set HICACHE_HOST_ALLOW_4K_FALLBACK=true "
       "(spec.hiCache.hostAllocator fallback) to start on 4 KiB pages.")


def _plan(node: FakeNode, **env: object):
    return plan_launch(launch_env(**env), NodeRoot(node.root), io_uring_probe=io_uring_ok)


def _error(node: FakeNode, **env: object) -> LaunchError:
    with pytest.raises(LaunchError) as e:
        _plan(node, **env)
    return e.value


def test_cgroup_v2_limit_covering_the_pool_passes(mi355x: FakeNode) -> None:
    size = _plan(mi355x).report["hugepages"]["sizes"][0]
    assert size["need_pages"] == 819200
    assert size["cgroup"] == {"version": "v2", "file": "/sys/fs/cgroup/hugetlb.2MB.max",
                              "limit_bytes": 1600 * GIB, "usage_bytes": 0}
    assert size["need_pages_by_numa"] == {"0": 409600, "1": 409600}


def test_no_hugepage_request_fails_with_the_numbers(mi355x: FakeNode) -> None:
    mi355x.cgroup_v2({2 * MIB: 0})
    err = _error(mi355x)
    assert err.reason == "HugepagesUnavailable"
    assert str(err) == (
        "host pool needs 8 x 200 GiB = 1600 GiB of 2 MiB hugepages; cgroup hugetlb.2MB.max "
        "allows 0: the pod has no hugepages-2Mi request" + FIX)


def test_request_smaller_than_plan_counts_pages_in_use(mi355x: FakeNode) -> None:
    mi355x.cgroup_v2({2 * MIB: 1600 * GIB}, usage={2 * MIB: 2 * GIB})
    assert str(_error(mi355x)) == (
        "host pool needs 8 x 200 GiB = 1600 GiB of 2 MiB hugepages; cgroup hugetlb.2MB.max "
        "allows 1598 GiB: the pod's hugepages-2Mi request is smaller than the plan "
        "(2 GiB already in use)" + FIX)


@pytest.mark.parametrize("subtree", [False, True], ids=["full-path", "mount-shows-own-cgroup"])
def test_cgroup_v1_limit(node: FakeNode, subtree: bool) -> None:
    node.mi355x()
    node.hugepages(2 * MIB, free=819200)
    node.cgroup_v1({2 * MIB: 1600 * GIB}, mount_subtree=subtree)
    size = _plan(node).report["hugepages"]["sizes"][0]
    assert size["cgroup"]["version"] == "v1"
    assert size["cgroup"]["limit_bytes"] == 1600 * GIB
    node.cgroup_v1({2 * MIB: 100 * GIB}, path="/kubepods/pod2/c2", mount_subtree=subtree)
    assert "cgroup hugetlb.2MB.limit_in_bytes allows 100 GiB" in str(_error(node))


def test_cgroup_v1_unlimited_and_no_controller_leave_the_node_pool_as_the_bound(
    node: FakeNode,
) -> None:
    node.mi355x()
    node.hugepages(2 * MIB, free=819200)
    node.cgroup_v1({2 * MIB: 9223372036854771712})
    assert _plan(node).report["hugepages"]["sizes"][0]["cgroup"]["limit_bytes"] is None
    node.write("/proc/self/cgroup", "0::/\n")  # v1 layout without a hugetlb hierarchy
    node.p("/sys/fs/cgroup/hugetlb").rename(node.p("/sys/fs/cgroup/gone"))
    assert _plan(node).report["hugepages"]["sizes"][0]["cgroup"]["version"] == "none"


def test_node_without_preallocated_hugepages(node: FakeNode) -> None:
    node.mi355x()
    node.cgroup_v2({2 * MIB: 1600 * GIB})
    node.meminfo(free=0)
    assert str(_error(node)) == (
        "host pool needs 8 x 200 GiB = 1600 GiB of 2 MiB hugepages; the node has 0 free "
        "2 MiB pages (0): the node's 2 MiB hugepage pool is not pre-allocated or is used by "
        "other pods (nr_hugepages on the node)" + FIX)


def test_meminfo_is_read_when_sysfs_lacks_the_size(node: FakeNode) -> None:
    node.mi355x()
    node.cgroup_v2({2 * MIB: 1600 * GIB})
    node.meminfo(free=819300, resv=100)
    assert _plan(node).report["hugepages"]["sizes"][0]["node_free_pages"] == 819200
    node.meminfo(free=819300, resv=101)
    assert "the node has 819199 free 2 MiB pages" in str(_error(node))


def test_reserved_pages_are_not_free(mi355x: FakeNode) -> None:
    mi355x.hugepages(2 * MIB, free=819200, resv=1)
    assert "the node has 819199 free 2 MiB pages (1599.99 GiB)" in str(_error(mi355x))


def test_numa_node_short_of_pages(mi355x: FakeNode) -> None:
    mi355x.hugepages(2 * MIB, free=819200, per_numa={0: 600000, 1: 219200})
    assert str(_error(mi355x)) == (
        "ranks bound to NUMA node 1 need 409600 2 MiB pages (800 GiB); node1 has 219200 free "
        "(428.12 GiB): hugepages are not pre-allocated evenly across NUMA nodes" + FIX)


def test_numa_none_skips_the_per_node_check(mi355x: FakeNode) -> None:
    mi355x.hugepages(2 * MIB, free=819200, per_numa={0: 819200, 1: 0})
    plan = _plan(mi355x, numa_policy="none")
    assert plan.report["numa_per_rank"] == [-1] * 8
    assert "HICACHE_HOST_NUMA" not in plan.command.env_overrides


def test_allowed_fallback_warns_and_switches_the_allocator_to_4k(mi355x: FakeNode) -> None:
    mi355x.cgroup_v2({2 * MIB: 0})
    plan = _plan(mi355x, host_allow_4k_fallback=True)
    assert plan.report["fallbacks"] == ["hugepages->4KiB"]
    assert plan.report["hugepages"]["backing"] == {
        "host pool": "4 KiB (fallback)", "UMBP DRAM": "4 KiB"}
    assert plan.command.env_overrides["HICACHE_HOST_HUGEPAGE_BYTES"] == "0"
    assert plan.command.extra_config["host_hugepage_bytes"] == 0
    assert plan.report["warnings"][0].startswith("host pool needs 8 x 200 GiB = 1600 GiB")
    assert plan.report["warnings"][1].startswith("starting on 4 KiB pages")


def test_umbp_dram_on_1gi_pages_is_checked_on_its_own_size(mi355x: FakeNode) -> None:
    mi355x.cgroup_v2({2 * MIB: 1600 * GIB, GIB: 256 * GIB})
    mi355x.hugepages(GIB, free=1024)
    err = _error(mi355x, umbp_dram_hugepage_bytes=GIB)
    assert str(err) == (
        "UMBP DRAM needs 8 x 64 GiB = 512 GiB of 1 GiB hugepages; cgroup hugetlb.1GB.max allows "
        "256 GiB: the pod's hugepages-1Gi request is smaller than the plan" + FIX)
    mi355x.cgroup_v2({2 * MIB: 1600 * GIB, GIB: 512 * GIB})
    plan = _plan(mi355x, umbp_dram_hugepage_bytes=GIB)
    assert [s["page_size"] for s in plan.report["hugepages"]["sizes"]] == [2 * MIB, GIB]
    assert plan.report["hugepages"]["backing"] == {
        "host pool": "hugetlb 2 MiB", "UMBP DRAM": "hugetlb 1 GiB"}


def test_pool_sized_by_ratio_still_needs_some_hugepages(mi355x: FakeNode) -> None:
    mi355x.cgroup_v2({2 * MIB: 0})
    assert str(_error(mi355x, host_pool_bytes=0)) == (
        "host pool (sized by --hicache-ratio) needs 2 MiB hugepages; cgroup hugetlb.2MB.max "
        "allows 0: the pod has no hugepages-2Mi request" + FIX)
    mi355x.cgroup_v2({2 * MIB: 1600 * GIB})
    plan = _plan(mi355x, host_pool_bytes=0)
    assert plan.report["hugepages"]["sizes"][0]["unknown_size_pools"] == ["host pool"]
    assert plan.command.argv[plan.command.argv.index("--hicache-ratio") + 1] == "2.0"


def test_no_hugepages_asked_means_no_check(node: FakeNode) -> None:
    node.mi355x()
    plan = _plan(node, host_hugepage_bytes=0)
    assert plan.report["hugepages"] == {
        "backing": {"host pool": "4 KiB", "UMBP DRAM": "4 KiB"},
        "fallback_to_4k": False, "sizes": []}


def test_cgroup_v2_max_is_unlimited_and_nested_paths_are_found(node: FakeNode) -> None:
    """Without a cgroup namespace /proc/self/cgroup shows the full path under the v2 mount."""
    node.mi355x()
    node.hugepages(2 * MIB, free=819200)
    path = "/kubepods.slice/kubepods-pod1.slice/cri-containerd-c1.scope"
    node.cgroup_v2({2 * MIB: "max"}, path=path)
    cgroup = _plan(node).report["hugepages"]["sizes"][0]["cgroup"]
    assert cgroup["limit_bytes"] is None
    assert cgroup["file"] == f"/sys/fs/cgroup{path}/hugetlb.2MB.max"
    node.cgroup_v2({2 * MIB: 0}, path=path)
    assert "cgroup hugetlb.2MB.max allows 0: the pod has no hugepages-2Mi request" in str(
        _error(node))
