"""What the umbp-dram sidecar is charged for, measured, against the planner's memory for it
(issue finding 9).

Real: ``umbp_standalone_server`` (amd-mori 1.2.4) in its own cgroup v1 memory cgroup, exactly
as a container's limit counts it (``memory.max_usage_in_bytes``: its pool on 4 KiB pages, the
page tables of the pool and of the engine's host pool it maps zero-copy, the server itself); a
client "engine" that registers a shared-memory host pool and fills the server's DRAM pool to
capacity. The planner's formula (``planner.pod_overhead.sidecar_dram_memory``) must cover what was
measured, and its page-table rate must be at least the measured one, so the 512 GiB pool of the
DeepSeek example gets the ~1 GiB of page tables a node charges it on top of the pool.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hicache_umbp.clients.buffers import MoriShmStaging
from hicache_umbp.clients.factories import make_standalone_client
from hicache_umbp.clients.runtime import mori_loader_prefix, standalone_server_binary
from hicache_umbp.contract.mori_env import standalone_server_env

pytestmark = pytest.mark.mori

MIB, GIB = 1 << 20, 1 << 30
PAGE = MIB
BATCH = 16
POOL = 768 * MIB  # the server's DRAM pool (4 KiB pages)
ENGINE_POOL = 512 * MIB  # the "engine's" host pool, registered with the server


def _status(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if value.strip().endswith("kB"):
            out[key] = int(value.split()[0]) * 1024
    return out


@pytest.fixture
def cgroup() -> Iterator[Path]:
    from pod.node import kill_cgroup, own_memory_cgroup

    d = own_memory_cgroup() / f"hicache-sidecar-mem-{os.getpid()}"
    d.mkdir()
    try:
        yield d
    finally:
        kill_cgroup(d)
        with contextlib.suppress(OSError):
            d.rmdir()


def test_the_planned_dram_sidecar_memory_covers_its_measured_charge(
        cgroup: Path, tmp_path: Path) -> None:
    from hicache_operator.planner.pod_overhead import (
        PAGE_TABLE_BYTES_PER_PAGE,
        SIDECAR_PROCESS_MEMORY,
        sidecar_dram_memory,
    )

    sock = tmp_path / "dram.sock"
    env = {k: v for k, v in os.environ.items() if not k.startswith("UMBP_")}
    env.update(standalone_server_env("dram", capacity_bytes=POOL))
    cmd = [*mori_loader_prefix(), standalone_server_binary(), f"unix:{sock}"]
    # Join the cgroup before exec, as a container's process does: everything it faults in
    # from the first instruction is charged there.
    with open(tmp_path / "server.log", "wb") as log:
        proc = subprocess.Popen(["sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$@"',
                                 "sh", *cmd], env=env, stdout=log, stderr=subprocess.STDOUT)
    pool = None
    try:
        opened = make_standalone_client(str(sock), "dram", wait_s=60)
        idle = int((cgroup / "memory.usage_in_bytes").read_text())
        idle_pte = _status(proc.pid)["VmPTE"]
        pool = MoriShmStaging(ENGINE_POOL)
        # The engine prefaults and writes its pool: its pages are charged to the engine.
        ctypes.memset(pool.ptr, 0x5A, ENGINE_POOL)
        client = opened.client
        assert client.register_memory(pool.ptr, ENGINE_POOL)
        pages = ENGINE_POOL // PAGE
        keys_done = 0
        last: tuple[list[str], range] = ([], range(0))
        for round_ in range(POOL // ENGINE_POOL + 2):
            full = False
            for first in range(0, pages, BATCH):
                idx = range(first, min(first + BATCH, pages))
                keys = [f"k{round_}-{i}" for i in idx]
                ok = client.batch_put_from_ptr(keys, [pool.ptr + i * PAGE for i in idx],
                                               [PAGE] * len(idx))
                keys_done += sum(bool(x) for x in ok)
                full = full or not all(ok)
                if all(ok):
                    last = (keys, idx)
            if full:
                break
        # the pool is full (mori may have evicted the oldest pages): the newest batch reads back
        keys, idx = last
        got = client.batch_get_into_ptr(keys, [pool.ptr + i * PAGE for i in idx],
                                        [PAGE] * len(idx))
        assert all(got), got
        time.sleep(0.5)
        peak = int((cgroup / "memory.max_usage_in_bytes").read_text())
        status = _status(proc.pid)
        opened.close()
    finally:
        proc.kill()
        proc.wait(timeout=10)
        if pool is not None:
            pool.close()
    stored = keys_done * PAGE
    assert stored >= POOL * 0.9, f"only {stored} B of the {POOL} B pool filled"
    planned = sidecar_dram_memory(POOL, 0, registered={4096: ENGINE_POOL})
    pte = status["VmPTE"] - idle_pte
    print(f"\nsidecar: idle {idle / MIB:.0f} MiB, peak {peak / MIB:.0f} MiB for a "
          f"{POOL / MIB:.0f} MiB pool and a {ENGINE_POOL / MIB:.0f} MiB registered pool, page "
          f"tables {idle_pte / MIB:.2f} -> {status['VmPTE'] / MIB:.2f} MiB; planned "
          f"{planned / MIB:.0f} MiB")
    assert planned >= peak
    assert idle <= SIDECAR_PROCESS_MEMORY
    # page tables grow by about 8 B per 4 KiB page the server touched (its pool, and the
    # registered engine pool it reads from), never more than the planner's rate
    mapped = POOL + ENGINE_POOL
    rate = mapped * PAGE_TABLE_BYTES_PER_PAGE // 4096
    assert POOL * PAGE_TABLE_BYTES_PER_PAGE // 4096 // 2 <= pte <= rate * 1.1 + 256 * 1024
    deepseek = sidecar_dram_memory(512 * GIB, 0, registered={2 * MIB: 8 * 200 * GIB})
    assert deepseek - 512 * GIB >= SIDECAR_PROCESS_MEMORY + 512 * GIB // 512
    # the hugepage mappings' tables fit the process allowance with room to spare
    assert 8 * 200 * GIB // (2 * MIB) * PAGE_TABLE_BYTES_PER_PAGE < SIDECAR_PROCESS_MEMORY // 64
