"""No acknowledged page is lost to a refused SSD write, on the REAL amd-mori 1.2.4.

mori's SSD node refuses puts for ~50-150 ms after a read batch (its read lease). A workload that
reads pages and then writes new ones at once -- what SGLang's prefetch and backup threads do all
the time -- used to lose acknowledged pages: the put answered True because DRAM took the page,
the write-back (or the synchronous SSD write of ``write_through``) was refused and dropped, and
DRAM evicted the page soon after (52 of 96 pages in the first report).

The scenario, for both page sizes (1 MiB parts of an MHA model, DeepSeek-R1's 8,994,816 B MLA
part), both write policies, the embedded store and the standalone sidecars: write round A,
drain it, read all of A, then write round B at once, drain; then every page of A and every page
of B that was acknowledged must read back byte-exact from the store, and every page of B must
have been acknowledged (refusals ridden out, not turned into unstored pages). The pages
outnumber the 64 MiB DRAM tier, so B's pages survive only if the SSD side took them. Round B
comes in two patterns: ``at-once`` (B's batches straight after the last read, the first report's
scenario) and ``interleaved`` (each small batch of B right after reading a batch of A again, as
SGLang's prefetch and backup threads interleave). On the data path before the fix (ac810b8) the
test fails; which cases lose pages there varies from run to run with the timing of the leases
(docs/performance.md, "Issue 17 runs").

Real: the store config the planner renders for the CR (``HICACHE_UMBP_*`` of its ConfigMap),
``build_store``, mori's clients, and for standalone the two ``umbp_standalone_server`` sidecars
started with the env of the planned StatefulSet (by PID, killed at teardown). Changed to fit a
test machine: the DRAM tier (64 MiB), the SSD directory and capacity, the socket directory.
The standalone cases share the sidecars between two ranks, as the planned pod does: rank 1 reads
A while rank 0 writes B.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hicache_umbp.clients.buffers import MoriShmStaging
from hicache_umbp.contract.page_limits import MHA_PARTS, MLA_PARTS
from hicache_umbp.contract.settings import BY_KEY
from hicache_umbp.store.keys import KeyScheme
from hicache_umbp.store.store import UMBPStore
from hicache_umbp.store.tiers import TieredClient
from support.planned_l3 import PlannedL3, planned_l3, planned_stores

pytestmark = pytest.mark.mori

MIB = 1 << 20
DRAM = 64 * MIB


@dataclass(frozen=True)
class Case:
    example: str
    spec: dict[str, Any]  # engine / model overrides
    parts: tuple[str, ...]
    part: int
    pages: int  # per round
    batch: int  # pages per batch_set / batch_get of round A and the reads
    b_batch: int  # pages per batch_set of round B interleaved (small: each lands in a lease)


CASES = {
    # 262,144 B/token (64 layers x 8 KV heads x 128 x 2 B x 2) at TP2, 16 tokens: 1 MiB parts.
    "mha-1MiB": Case("llama-3.1-70b-mi355x.yaml",
                     {"model": {"kvBytesPerToken": 262144},
                      "engine": {"pageSize": 16, "tensorParallelSize": 2}},
                     MHA_PARTS, MIB, 48, 16, 4),
    # DeepSeek-R1 bf16 at pageSize 128: 8,994,816 B, one part.
    "r1-8994816B": Case("deepseek-r1-mi355x.yaml",
                        {"engine": {"pageSize": 128, "tensorParallelSize": 2}},
                        MLA_PARTS, 8_994_816, 32, 8, 8),
}


def planned(case: Case, mode: str, policy: str) -> PlannedL3:
    """The ConfigMap env and the sidecars' env the planner renders for the case."""

    def edit(cr: dict[str, Any]) -> None:
        for section, fields in case.spec.items():
            cr["spec"][section].update(fields)
        cr["spec"]["l3"]["mode"] = mode
        if mode == "embedded" and case.parts == MLA_PARTS:
            cr["spec"]["engine"]["tensorParallelSize"] = 1  # MLA over TP needs one store
        cr["spec"]["l3"]["tiering"] = {"writePolicy": policy, "queueSize": "512Mi"}
        # mori's SSD node (and its umbp-ssd sidecar), whose read lease refuses writes: the
        # subject here; our SSD tier has no lease (tests/backend/test_disk_store.py)
        cr["spec"]["l3"]["ssd"]["engine"] = "mori"

    p = planned_l3(case.example, edit)
    assert p.plan.sizing.page is not None and p.plan.sizing.page.part_bytes == case.part
    return p


@contextlib.contextmanager
def open_stores(case: Case, mode: str, policy: str, tmp_path: Path) -> Iterator[list[UMBPStore]]:
    p = planned(case, mode, policy)
    assert p.engine_env[BY_KEY["umbp_tier_write_policy"].env] == policy
    keys = KeyScheme("refused", "m", 1, 0, case.parts)  # one key scheme: ranks share pages
    with planned_stores(p, tmp_path, keys=keys, value_bytes=case.part, dram_bytes=DRAM,
                        ssd_bytes=1 << 30) as stores:
        yield stores


class Pages:
    """``n`` pages of random bytes in mori shm (standalone servers take nothing else)."""

    def __init__(self, n: int, case: Case, seed: int) -> None:
        self.n, self.width, self.part = n, len(case.parts), case.part
        self.mem = MoriShmStaging(n * self.width * case.part)
        self.view = np.ctypeslib.as_array(
            (ctypes.c_uint8 * self.mem.size).from_address(self.mem.ptr))
        self.view[:] = np.random.default_rng(seed).integers(0, 256, self.mem.size,
                                                            dtype=np.uint8)

    def ptrs(self, idx: range | list[int]) -> list[list[tuple[int, int]]]:
        w, part, base = self.width, self.part, self.mem.ptr
        return [[(base + (i * w + p) * part, part) for p in range(w)] for i in idx]

    def page(self, i: int) -> np.ndarray:
        size = self.width * self.part
        return self.view[i * size : (i + 1) * size]


def lost(store: UMBPStore, hashes: list[str], idx: list[int], src: Pages, dst: Pages
         ) -> list[int]:
    """The pages ``idx`` (keys ``hashes[i]``, bytes ``src.page(i)``) that do not read back
    byte-exact, one at a time."""
    out = []
    for i in idx:
        dst.view[:] = 0
        got = store.batch_get([hashes[i]], dst.ptrs([0]))
        if got != [True] or not np.array_equal(dst.page(0), src.page(i)):
            out.append(i)
    return out


@pytest.mark.parametrize("pattern", ["at-once", "interleaved"])
@pytest.mark.parametrize("policy", ["write_back", "write_through"])
@pytest.mark.parametrize("mode", ["embedded", "standalone"])
@pytest.mark.parametrize("name", list(CASES))
def test_no_acknowledged_page_is_lost_when_writes_follow_reads(
        name: str, mode: str, policy: str, pattern: str, tmp_path: Path) -> None:
    case = CASES[name]
    n, b = case.pages, case.batch
    a_src, b_src, dst = Pages(n, case, 1), Pages(n, case, 2), Pages(max(n, b), case, 3)
    try:
        read_then_write(case, f"{name}{mode}{policy}{pattern}", mode, policy,
                        pattern == "interleaved", tmp_path, a_src, b_src, dst)
    finally:  # after the stores deregistered them
        for pages in (a_src, b_src, dst):
            pages.mem.close()


def read_then_write(case: Case, tag: str, mode: str, policy: str, interleaved: bool,
                    tmp_path: Path, a_src: Pages, b_src: Pages, dst: Pages) -> None:
    n, b = case.pages, case.batch
    with open_stores(case, mode, policy, tmp_path) as stores:
        writer, reader = stores[0], stores[-1]
        for store in stores:
            for pages in (a_src, b_src, dst):
                assert store.register_buffer(pages.mem.ptr, pages.mem.size)
        a_keys = [f"a{tag}-{i:048d}" for i in range(n)]
        b_keys = [f"b{tag}-{i:048d}" for i in range(n)]
        for s in range(0, n, b):
            assert writer.batch_set(a_keys[s : s + b], a_src.ptrs(range(s, s + b))) == [True] * b
        assert writer.flush()
        # Read all of A, newest first: the oldest pages, read last, are on SSD only (DRAM
        # holds the newest), so the last reads lease the SSD's staging slots; then write B at
        # once, or (interleaved) each small batch right after a read of one more batch of A
        # (as SGLang's prefetch and backup threads interleave): writes land inside read leases.
        for s in reversed(range(0, n, b)):
            assert reader.batch_get(a_keys[s : s + b], dst.ptrs(range(b))) == [True] * b
        acked: list[int] = []
        bb = case.b_batch if interleaved else b
        for s in range(0, n, bb):
            if interleaved:
                assert reader.batch_get(a_keys[s : s + bb], dst.ptrs(range(bb))) == [True] * bb
            got = writer.batch_set(b_keys[s : s + bb], b_src.ptrs(range(s, s + bb)))
            acked += [s + j for j, ok in enumerate(got) if ok]
        writer.flush()
        st = writer.client.tier_stats() if isinstance(writer.client, TieredClient) else None
        lost_b = lost(writer, b_keys, acked, b_src, dst)
        assert lost_b == [], (f"{len(lost_b)} of {len(acked)} acknowledged pages of B are "
                              f"lost: {lost_b}; {st}")
        assert lost(writer, a_keys, list(range(n)), a_src, dst) == []
        assert st is not None and st.writeback_failed == 0, st
        # The refusals were ridden out, not turned into unstored pages.
        assert len(acked) == n, f"{n - len(acked)} pages of B not stored; {st}"
