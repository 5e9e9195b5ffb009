"""Do the hugepages this pod may use cover the host pool (and UMBP DRAM) before SGLang starts?

Two limits apply and both must hold, per page size:

* the container's hugetlb cgroup: cgroup v2 ``hugetlb.<size>.max`` minus ``.current``, v1
  ``hugetlb.<size>.limit_in_bytes`` minus ``.usage_in_bytes`` (Kubernetes writes the pod's
  ``hugepages-<size>`` request there; no request means a limit of 0);
* the node's free pool: ``/sys/kernel/mm/hugepages/hugepages-<kB>kB/free_hugepages`` minus
  ``resv_hugepages`` (``/proc/meminfo`` ``HugePages_Free``/``HugePages_Rsvd`` for the default
  ``Hugepagesize`` when sysfs lacks the size), and, for NUMA-bound ranks,
  ``/sys/devices/system/node/node<N>/hugepages/.../free_hugepages`` of each node.

A pool sized by ``--hicache-ratio`` has no byte size until SGLang sees the GPU, so for it the
check is only that pages of that size can be had at all. When a limit is short the launcher
fails with the numbers, unless ``host_allow_4k_fallback`` is set: then it warns, records the
fallback and tells the allocator to use 4 KiB pages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..contract.settings import BY_KEY, LaunchConfig
from ..contract.units import (
    ceil_div,
    cgroup_size_name,
    fmt_bytes,
    k8s_hugepage_resource,
    page_size_name,
)
from .errors import LaunchError
from .noderoot import NodeRoot

# cgroup v1 writes "no limit" as PAGE_COUNTER_MAX * page size: about 2**63.
_V1_UNLIMITED = 1 << 62


@dataclass(frozen=True)
class PoolDemand:
    """One pool's bytes per rank on one page size; ``None`` bytes: sized by ratio (unknown)."""

    name: str
    page_size: int
    per_rank: tuple[int | None, ...]
    numa: tuple[int, ...]


@dataclass(frozen=True)
class CgroupLimit:
    version: str  # "v1", "v2" or "none"
    file: str
    limit: int | None  # bytes; None: unlimited or no hugetlb controller
    usage: int

    @property
    def available(self) -> int | None:
        return None if self.limit is None else max(self.limit - self.usage, 0)


@dataclass
class SizeCheck:
    """The verdict for one page size."""

    page_size: int
    need_pages: int
    unknown_pools: list[str]
    cgroup: CgroupLimit
    node_free_pages: int
    node_free_by_numa: dict[int, int] = field(default_factory=dict)
    need_by_numa: dict[int, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "page_size": self.page_size,
            "need_pages": self.need_pages,
            "need_bytes": self.need_pages * self.page_size,
            "unknown_size_pools": self.unknown_pools,
            "cgroup": {"version": self.cgroup.version, "file": self.cgroup.file,
                       "limit_bytes": self.cgroup.limit, "usage_bytes": self.cgroup.usage},
            "node_free_pages": self.node_free_pages,
            "node_free_pages_by_numa": {str(k): v for k, v in self.node_free_by_numa.items()},
            "need_pages_by_numa": {str(k): v for k, v in self.need_by_numa.items()},
            "problems": self.problems,
        }


@dataclass
class HugepageResult:
    checks: list[SizeCheck]
    fallback_to_4k: bool
    backing: dict[str, str]  # pool name -> "hugetlb 2 MiB" | "4 KiB" | "4 KiB (fallback)"


def demands(cfg: LaunchConfig, numa: Sequence[int]) -> list[PoolDemand]:
    """The hugepage-backed pools this pod plans: SGLang's host pool and embedded UMBP DRAM."""
    store = cfg.store
    out = []
    if store.host_hugepage_bytes:
        sized = any(b > 0 for b in cfg.host_pool_bytes)
        per_rank = tuple(b for b in cfg.host_pool_bytes) if sized else tuple(
            None for _ in cfg.host_pool_bytes)
        out.append(PoolDemand("host pool", store.host_hugepage_bytes, per_rank, tuple(numa)))
    if (store.umbp_mode == "embedded" and store.umbp_dram_hugepage_bytes
            and any(b > 0 for b in store.umbp_dram_bytes)):
        out.append(PoolDemand("UMBP DRAM", store.umbp_dram_hugepage_bytes,
                              tuple(store.umbp_dram_bytes), tuple(numa)))
    return out


def _cgroup_path(root: NodeRoot, controller: str) -> str:
    """This process's cgroup path for ``controller`` ("" selects the v2 unified line)."""
    for line in (root.read_text("/proc/self/cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if (controller == "" and parts[0] == "0" and parts[1] == "") or (
            controller and controller in parts[1].split(",")
        ):
            return parts[2].strip()
    return "/"


def cgroup_limit(root: NodeRoot, page_size: int) -> CgroupLimit:
    """The container's hugetlb limit and usage for ``page_size`` (cgroup v2 or v1)."""
    name = cgroup_size_name(page_size)
    if root.exists("/sys/fs/cgroup/cgroup.controllers"):
        version, base, rel = "v2", "/sys/fs/cgroup", _cgroup_path(root, "")
        limit_file, usage_file = f"hugetlb.{name}.max", f"hugetlb.{name}.current"
    else:
        version, base, rel = "v1", "/sys/fs/cgroup/hugetlb", _cgroup_path(root, "hugetlb")
        limit_file, usage_file = f"hugetlb.{name}.limit_in_bytes", f"hugetlb.{name}.usage_in_bytes"
    # Inside a cgroup namespace the path is "/"; without one the mount may show only our subtree.
    for d in dict.fromkeys([f"{base}/{rel.strip('/')}".rstrip("/"), base]):
        text = root.read_text(f"{d}/{limit_file}")
        if text is None:
            continue
        raw = text.strip()
        usage = root.read_int(f"{d}/{usage_file}") or 0
        if raw == "max":
            return CgroupLimit(version, f"{d}/{limit_file}", None, usage)
        try:
            value = int(raw)
        except ValueError:
            continue
        limit = None if value >= _V1_UNLIMITED else value
        return CgroupLimit(version, f"{d}/{limit_file}", limit, usage)
    return CgroupLimit("none", f"{base}/{limit_file}", None, 0)


def node_free_pages(root: NodeRoot, page_size: int) -> int:
    """Free, unreserved pages of ``page_size`` on the node (0 when the size is not configured)."""
    kb = page_size // 1024
    d = f"/sys/kernel/mm/hugepages/hugepages-{kb}kB"
    free = root.read_int(f"{d}/free_hugepages")
    if free is not None:
        return max(free - (root.read_int(f"{d}/resv_hugepages") or 0), 0)
    meminfo: dict[str, int] = {}
    for line in (root.read_text("/proc/meminfo") or "").splitlines():
        key, _, rest = line.partition(":")
        tok = rest.split()
        if tok and tok[0].isdigit():
            meminfo[key.strip()] = int(tok[0])
    if meminfo.get("Hugepagesize", 0) * 1024 == page_size:
        return max(meminfo.get("HugePages_Free", 0) - meminfo.get("HugePages_Rsvd", 0), 0)
    return 0


def numa_free_pages(root: NodeRoot, page_size: int, node: int) -> int | None:
    kb = page_size // 1024
    return root.read_int(
        f"/sys/devices/system/node/node{node}/hugepages/hugepages-{kb}kB/free_hugepages")


def _describe(pools: list[PoolDemand]) -> str:
    parts = []
    for p in pools:
        sizes = [b for b in p.per_rank if b is not None]
        if not sizes:
            continue
        if len(set(sizes)) == 1:
            parts.append(f"{p.name} needs {len(sizes)} x {fmt_bytes(sizes[0])}")
        else:
            parts.append(f"{p.name} needs {' + '.join(fmt_bytes(b) for b in sizes)}")
    return " and ".join(parts)


def check_size(root: NodeRoot, page_size: int, pools: list[PoolDemand]) -> SizeCheck:
    need = 0
    by_numa: dict[int, int] = {}
    unknown = []
    for p in pools:
        if any(b is None for b in p.per_rank):
            unknown.append(p.name)
        for rank, b in enumerate(p.per_rank):
            pages = ceil_div(b, page_size) if b else 0
            need += pages
            if pages and p.numa[rank] >= 0:
                by_numa[p.numa[rank]] = by_numa.get(p.numa[rank], 0) + pages
    check = SizeCheck(page_size, need, unknown, cgroup_limit(root, page_size),
                      node_free_pages(root, page_size), need_by_numa=by_numa)
    ps, res = page_size_name(page_size), k8s_hugepage_resource(page_size)
    what = _describe(pools)
    total = f"= {fmt_bytes(need * page_size)} of {ps} hugepages"
    avail = check.cgroup.available
    if avail is not None and (avail < need * page_size or (unknown and avail < page_size)):
        cause = (f"the pod has no {res} request" if check.cgroup.limit == 0 else
                 f"the pod's {res} request is smaller than the plan"
                 + (f" ({fmt_bytes(check.cgroup.usage)} already in use)"
                    if check.cgroup.usage else ""))
        if unknown and not need:
            check.problems.append(
                f"{', '.join(unknown)} (sized by --hicache-ratio) needs {ps} hugepages; cgroup "
                f"{check.cgroup.file.rsplit('/', 1)[-1]} allows {fmt_bytes(avail)}: {cause}")
        else:
            check.problems.append(
                f"{what} {total}; cgroup {check.cgroup.file.rsplit('/', 1)[-1]} allows "
                f"{fmt_bytes(avail)}: {cause}")
    free_bytes = check.node_free_pages * page_size
    if check.node_free_pages < need or (unknown and check.node_free_pages == 0):
        check.problems.append(
            (f"{what} {total}" if need else f"{', '.join(unknown)} needs {ps} hugepages")
            + f"; the node has {check.node_free_pages} free {ps} pages ({fmt_bytes(free_bytes)}):"
            f" the node's {ps} hugepage pool is not pre-allocated or is used by other pods "
            f"(nr_hugepages on the node)")
    for node, pages in sorted(by_numa.items()):
        free = numa_free_pages(root, page_size, node)
        if free is None:
            continue
        check.node_free_by_numa[node] = free
        if free < pages and not check.problems:
            check.problems.append(
                f"ranks bound to NUMA node {node} need {pages} {ps} pages "
                f"({fmt_bytes(pages * page_size)}); node{node} has {free} free "
                f"({fmt_bytes(free * page_size)}): hugepages are not pre-allocated evenly "
                f"across NUMA nodes")
    return check


def check_hugepages(root: NodeRoot, cfg: LaunchConfig, numa: Sequence[int]) -> HugepageResult:
    """Check every planned hugepage pool; raise :class:`LaunchError` unless fallback is allowed."""
    pools = demands(cfg, numa)
    backing: dict[str, str] = {}
    if not cfg.store.host_hugepage_bytes:
        backing["host pool"] = "4 KiB"
    if cfg.store.umbp_mode == "embedded" and any(b > 0 for b in cfg.store.umbp_dram_bytes):
        backing["UMBP DRAM"] = "4 KiB"
    checks = []
    for size in sorted({p.page_size for p in pools}):
        group = [p for p in pools if p.page_size == size]
        checks.append(check_size(root, size, group))
        for p in group:
            backing[p.name] = f"hugetlb {page_size_name(size)}"
    problems = [msg for c in checks for msg in c.problems]
    if not problems:
        return HugepageResult(checks, False, backing)
    flag = BY_KEY["host_allow_4k_fallback"].env
    if not cfg.store.host_allow_4k_fallback:
        raise LaunchError(
            "HugepagesUnavailable",
            "; ".join(problems) + f". Fix the request or the node, or set {flag}=true "
            f"(spec.hiCache.hostAllocator fallback) to start on 4 KiB pages.",
        )
    for p in pools:
        backing[p.name] = "4 KiB (fallback)"
    return HugepageResult(checks, True, backing)
