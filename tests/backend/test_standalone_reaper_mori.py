"""A dead engine's host pool is released from the standalone servers (real mori 1.2.4).

Real: ``umbp_standalone_server`` processes (DRAM and SSD media), our store's standalone client
(``make_standalone_client``) registering a memfd host pool on real 2 MiB hugepages from a child
process that is then SIGKILLed (what SGLang does to its schedulers, and what an OOM kill or
kubelet's grace-period SIGKILL does), the kernel's hugepage counters, and the launcher's reaper
talking gRPC to the server over its UNIX socket. Nothing is faked.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from hicache_umbp.clients import reaper as standalone_reaper
from hicache_umbp.contract.mori_env import standalone_server_env

from .conftest import StandaloneServers

pytestmark = pytest.mark.mori

MIB = 1 << 20
POOL = 32 * MIB  # 16 hugepages

ENGINE = f"""
import ctypes, os, signal, sys
from hicache_umbp.hostmem.allocator import HostAllocator
from hicache_umbp.clients.factories import make_standalone_client
allocator = HostAllocator(hugepage_bytes=2 << 20, numa_node=-1, prefault=True, shared=True)
pool = allocator.alloc({POOL})
args = sys.argv[1:]
clients = [make_standalone_client(p, m) for p, m in zip(args[::2], args[1::2])]
ctypes.memset(pool.ptr, 7, {POOL})
for c in clients:
    assert c.client.register_memory(pool.ptr, {POOL}) is True
    assert c.client.batch_put_from_ptr(["k"], [pool.ptr], [{MIB}]) == [True]
if os.environ.get("CLEAN") == "1":
    for c in clients:
        c.client.deregister_memory(pool.ptr)
    sys.exit(0)
print(os.getpid(), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def run_engine(servers: list[tuple[str, str]], clean: bool = False) -> None:
    import os

    args = [a for path, medium in servers for a in (path, medium)]
    env = {**os.environ, "CLEAN": "1" if clean else "0"}
    subprocess.run([sys.executable, "-c", ENGINE, *args], env=env, timeout=120,
                   capture_output=True, check=False)


def wait_free(reservation, want: int) -> int:
    for _ in range(50):
        if reservation.free() >= want:
            break
        time.sleep(0.1)
    return int(reservation.free())


def test_a_killed_engine_pins_its_pool_until_the_launcher_reaps_it(
        standalone_servers: StandaloneServers, hugepages_2m, tmp_path: Path) -> None:
    reservation = hugepages_2m(16)
    dram = standalone_servers.start("dram", standalone_server_env("dram", capacity_bytes=64 * MIB))
    ssd = standalone_servers.start("ssd", standalone_server_env(
        "ssd", capacity_bytes=64 * MIB, ssd_dir=str(tmp_path / "ssd")))
    servers = [(dram.socket_path, "dram"), (ssd.socket_path, "ssd")]
    before = reservation.free()
    run_engine(servers)
    time.sleep(1)
    # mori keeps the dead client's memfd mapped: the whole pool stays out of the free count
    assert reservation.free() == before - POOL // (2 * MIB)
    pending = [standalone_reaper.pending(path) for path, _ in servers]
    assert all(len(p) == 1 for p in pending), pending
    reaped = [r for path, _ in servers for r in standalone_reaper.reap(path)]
    assert len(reaped) == 2 and all(r.client_ids[0].startswith("umbp-") for r in reaped)
    assert wait_free(reservation, before) == before
    assert all(not standalone_reaper.pending(path) for path, _ in servers)
    # the servers kept serving: the pages put by the dead engine are still there
    from hicache_umbp.clients.factories import make_standalone_client

    client = make_standalone_client(dram.socket_path, "dram").client
    assert client.batch_exists(["k"]) == [True]


def test_a_clean_deregistration_leaves_nothing_to_reap(
        standalone_servers: StandaloneServers, hugepages_2m) -> None:
    reservation = hugepages_2m(16)
    dram = standalone_servers.start("dram", standalone_server_env("dram", capacity_bytes=64 * MIB))
    before = reservation.free()
    run_engine([(dram.socket_path, "dram")], clean=True)
    assert wait_free(reservation, before) == before
    assert standalone_reaper.pending(dram.socket_path) == []


def test_the_reaper_reports_a_server_that_rejects_the_call(
        standalone_servers: StandaloneServers) -> None:
    dram = standalone_servers.start("dram", standalone_server_env("dram", capacity_bytes=64 * MIB))
    with pytest.raises(standalone_reaper.ReapError, match="error status"):
        standalone_reaper.grpc_unary_unix(dram.socket_path, "/umbp.UMBPStandalone/NoSuchCall",
                                          b"")
    standalone_reaper.deregister_client(dram.socket_path, "umbp-1-0")  # unknown id: a no-op
