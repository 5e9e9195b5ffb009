"""A standalone sidecar (``umbp_standalone_server``) killed and restarted, as Kubernetes
restarts a crashed sidecar container, on the REAL amd-mori 1.2.4.

Real: both servers (DRAM and SSD media; killed with SIGKILL by PID, restarted with the same
env on the same socket, whose stale file stays behind as in a pod), the store built from a
standalone configuration (TieredClient over two reconnecting mori clients), mori-allocated
shm buffers. Nothing is faked. Recovery is measured and printed (``-s``) / attached to the
test report (``record_property``); no time is asserted, calls and pages are counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hicache_umbp.build import build_store
from hicache_umbp.clients.guards import ReconnectingClient, SerializedClient
from hicache_umbp.contract.load import load_store_config
from hicache_umbp.contract.mori_env import standalone_server_env
from hicache_umbp.contract.page_limits import MHA_PARTS
from hicache_umbp.store.keys import KeyScheme
from hicache_umbp.store.store import UMBPStore
from hicache_umbp.store.tiers import TieredClient

from .conftest import StandaloneServer, StandaloneServers
from .test_store_mori import PART, Pool, hashes

pytestmark = pytest.mark.mori

MIB = 1 << 20
GIVE_UP_S = 120.0  # a hang guard for the recovery loop, not a performance threshold


def _standalone_store(
    servers: StandaloneServers, tmp_path: Path
) -> tuple[UMBPStore, TieredClient, StandaloneServer, StandaloneServer]:
    dram = servers.start("dram", standalone_server_env("dram", capacity_bytes=64 * MIB),
                         name="dram")
    ssd = servers.start("ssd", standalone_server_env(
        "ssd", capacity_bytes=256 * MIB, ssd_dir=str(tmp_path / "ssd"), value_bytes=PART),
        name="ssd")
    cfg = load_store_config(
        {"umbp_mode": "standalone", "umbp_ssd_enabled": "true",
         "umbp_socket_dir": str(tmp_path), "umbp_ssd_slot_bytes": str(PART),
         "umbp_tier_queue_bytes": str(16 * PART)},
        env={},
    )
    store = build_store(cfg.rank(0), keys=KeyScheme("t", "m", 1, 0, MHA_PARTS), value_bytes=PART)
    assert isinstance(store.client, TieredClient)
    return store, store.client, dram, ssd


def _reconnecting(client: object) -> ReconnectingClient:
    inner = client.inner if isinstance(client, SerializedClient) else client
    assert isinstance(inner, ReconnectingClient)
    return inner


def _until_stored(store: UMBPStore, src: Pool, tag: str) -> tuple[int, float]:
    """batch_set one fresh page per call until one is stored: (calls, seconds)."""
    start = time.monotonic()
    calls = 0
    while time.monotonic() - start < GIVE_UP_S:
        calls += 1
        if store.batch_set(hashes(1, f"{tag}-{calls}"), src.ptrs([0])) == [True]:
            return calls, time.monotonic() - start
        time.sleep(0.01)
    raise AssertionError(f"no page was stored within {GIVE_UP_S} s after the restart")


def test_both_sidecars_killed_and_restarted(
    standalone_servers: StandaloneServers, tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    store, tiers, dram, ssd = _standalone_store(standalone_servers, tmp_path)
    src, dst = Pool(8, 2, 61, shm=True), Pool(8, 2, 62, shm=True)
    try:
        assert store.register_buffer(src.ptr, src.nbytes)
        assert store.register_buffer(dst.ptr, dst.nbytes)
        old = hashes(4, "before")
        assert store.batch_set(old, src.ptrs(range(4))) == [True] * 4
        assert store.flush() and store.batch_exists(old) == 4

        standalone_servers.kill(dram)
        standalone_servers.kill(ssd)
        # No tier can take a page: the store must say so (it used to queue and say True).
        # SGLang keeps calling while the sidecars are down (here 100 calls over ~2 s): gRPC's
        # reconnect backoff grows meanwhile, and must not delay the recovery below.
        dead = hashes(4, "while-dead")
        for _ in range(100):
            assert store.batch_set(dead, src.ptrs(range(4))) == [False] * 4
            time.sleep(0.02)
        assert store.batch_exists(dead) == 0
        assert store.batch_get(old, dst.ptrs(range(4))) == [False] * 4

        restart_s = {m.medium: standalone_servers.restart(m) for m in (dram, ssd)}
        calls, recovered_s = _until_stored(store, src, "after")
        d, s = _reconnecting(tiers.dram), _reconnecting(tiers.ssd)
        assert (d.reconnects, s.reconnects) == (1, 1)
        assert calls == 1  # the first call after the restart already stores its page
        # Both servers came back empty (mori keeps nothing across a server restart) ...
        assert store.batch_exists(old) == 0
        # ... and serve new pages byte-exact, through DRAM and from SSD.
        new = hashes(4, "new")
        assert store.batch_set(new, src.ptrs(range(4, 8))) == [True] * 4
        assert store.flush()
        dst.zero()
        assert store.batch_get(new, dst.ptrs(range(4))) == [True] * 4
        assert all(np.array_equal(dst.page(i), src.page(4 + i)) for i in range(4))
        timing = {
            "dram_restart_to_listening_s": round(restart_s["dram"], 3),
            "ssd_restart_to_listening_s": round(restart_s["ssd"], 3),
            "listening_to_first_stored_page_s": round(recovered_s, 3),
            "calls_until_stored": calls,
            "dram_connect_s": round(d.last_connect_s or 0, 3),
            "dram_reconnect_and_reregister_s": round(d.last_reconnect_s or 0, 3),
            "ssd_connect_s": round(s.last_connect_s or 0, 3),
            "ssd_reconnect_and_reregister_s": round(s.last_reconnect_s or 0, 3),
        }
        for k, v in timing.items():
            record_property(k, v)
        print("sidecar restart recovery:", timing)
    finally:
        store.close()
        src.close()
        dst.close()


def test_ssd_sidecar_alone_restarted_while_dram_serves(
    standalone_servers: StandaloneServers, tmp_path: Path
) -> None:
    """Only the SSD sidecar dies: sets are still acknowledged (DRAM holds them, the write-back
    ring keeps them for SSD) and stay readable; the write-back stalls (counted, flush says
    False) instead of dropping them; after the sidecar's restart the writer reconnects and the
    very pages queued while it was down reach the new SSD server, then new ones do too."""
    store, tiers, _dram, ssd = _standalone_store(standalone_servers, tmp_path)
    src = Pool(8, 2, 63, shm=True)
    try:
        assert store.register_buffer(src.ptr, src.nbytes)
        standalone_servers.kill(ssd)
        early = hashes(2, "dram-only")
        assert store.batch_set(early, src.ptrs(range(2))) == [True] * 2
        assert store.flush() is False  # the ring is stalled: nothing was dropped
        st = tiers.tier_stats()
        assert (st.writeback_stalled, st.writeback_pending, st.writeback_failed) == (1, 4, 0)
        assert store.batch_exists(early) == 2
        standalone_servers.restart(ssd)
        deadline = time.monotonic() + GIVE_UP_S
        while tiers.tier_stats().writeback_pending:
            assert time.monotonic() < deadline, tiers.tier_stats()
            time.sleep(0.05)
        pages = hashes(4, "after-ssd-restart")
        assert store.batch_set(pages, src.ptrs(range(2, 6))) == [True] * 4
        assert store.flush() is True
        st = tiers.tier_stats()
        assert st.writeback_done == 4 + 8 and st.writeback_failed == 0
        assert _reconnecting(tiers.ssd).reconnects == 1
        assert tiers.ssd.batch_exists(store.keys.batch_keys([*early, *pages])) == [True] * 12
    finally:
        store.close()
        src.close()
