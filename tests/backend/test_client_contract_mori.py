"""The UMBP client contract against the real amd-mori 1.2.4 (the engine environment, make
test-mori).

Everything is real: mori's embedded DRAM pool, its embedded SSD node writing segment logs under
a temporary directory, and ``umbp_standalone_server`` processes (DRAM and SSD media) started by
PID under the trixie loader and always killed at teardown. Nothing is faked.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hicache_umbp.clients.factories import (
    OpenedClient,
    make_embedded_dram_client,
    make_embedded_ssd_client,
    make_standalone_client,
)
from hicache_umbp.contract.media import Medium
from hicache_umbp.contract.mori_env import standalone_server_env
from hicache_umbp.contract.staging import SSD_STAGING_SLOTS
from hicache_umbp.store.protocol import UMBPClientLike

from .conftest import StandaloneServers
from .contract import CHECKS, HostArena, Subject

pytestmark = pytest.mark.mori

VALUE = 1 << 20

SubjectBuilder = Callable[[Path, StandaloneServers], Subject]


def _embedded_dram(tmp: Path, servers: StandaloneServers) -> Subject:
    return Subject("embedded-dram", lambda n: make_embedded_dram_client(n * VALUE), VALUE)


def _faulty_embedded_dram(tmp: Path, servers: StandaloneServers) -> Subject:
    """The real DRAM client inside support.faults.FaultyClient with no fault injected: the
    wrapper the sglang tier injects faults with changes nothing else."""
    from support.faults import FaultyClient

    def open_(n: int) -> OpenedClient:
        opened = make_embedded_dram_client(n * VALUE)
        return dataclasses.replace(opened, client=FaultyClient(opened.client))

    return Subject("faulty-embedded-dram", open_, VALUE)


def _embedded_ssd(tmp: Path, servers: StandaloneServers) -> Subject:
    counter = iter(range(1_000_000))

    def open_(n: int) -> OpenedClient:
        ssd_dir = tmp / f"ssd-{next(counter)}"
        return make_embedded_ssd_client(str(ssd_dir), n * VALUE, max_value_bytes=VALUE)

    return Subject(
        "embedded-ssd", open_, VALUE, full_batch_fails_tail=False, min_capacity_values=128,
        exists_exact=False,
    )


def _standalone(medium: Medium) -> SubjectBuilder:
    def build(tmp: Path, servers: StandaloneServers) -> Subject:
        counter = iter(range(1_000_000))

        def open_(n: int) -> OpenedClient:
            i = next(counter)
            env = standalone_server_env(
                medium,
                capacity_bytes=n * VALUE,
                ssd_dir=str(tmp / f"sa-ssd-{i}") if medium == "ssd" else "",
                value_bytes=VALUE,
            )
            server = servers.start(medium, env, name=f"{medium}-{i}")
            client = make_standalone_client(server.socket_path, medium, wait_s=30)
            client._on_close.append(server.stop)
            return client

        if medium == "ssd":
            return Subject(
                "standalone-ssd", open_, VALUE, HostArena, full_batch_fails_tail=False,
                min_capacity_values=128, exists_exact=False, requires_registration=True,
            )
        return Subject(
            f"standalone-{medium}", open_, VALUE, HostArena, requires_registration=True
        )

    return build


BUILDERS: dict[str, SubjectBuilder] = {
    "embedded-dram": _embedded_dram,
    "faulty-embedded-dram": _faulty_embedded_dram,
    "embedded-ssd": _embedded_ssd,
    "standalone-dram": _standalone("dram"),
    "standalone-ssd": _standalone("ssd"),
}


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
@pytest.mark.parametrize("kind", list(BUILDERS))
def test_real_mori_meets_contract(
    kind: str,
    check: Callable[[Subject], None],
    tmp_path: Path,
    standalone_servers: StandaloneServers,
) -> None:
    check(BUILDERS[kind](tmp_path, standalone_servers))


def test_real_clients_are_client_like(tmp_path: Path) -> None:
    opened_client = make_embedded_dram_client(8 * VALUE)
    assert isinstance(opened_client.client, UMBPClientLike)


def _segment_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def test_embedded_ssd_pages_are_read_from_the_segment_files(tmp_path: Path) -> None:
    """The SSD node has no DRAM tier. Its pages are in ``segment_*.log`` under the SSD directory
    (each page's bytes are found there), and reads come from those files: once the files' bytes
    are flipped in place, no read returns a page any more (mori's CRC check fails them)."""
    ssd_dir = tmp_path / "ssd"
    slots, n = SSD_STAGING_SLOTS, 3 * SSD_STAGING_SLOTS
    opened_client = make_embedded_ssd_client(str(ssd_dir), 256 * VALUE, max_value_bytes=VALUE)
    client = opened_client.client
    src = np.random.default_rng(7).integers(0, 256, n * VALUE, dtype=np.uint8)
    dst = np.zeros(n * VALUE, dtype=np.uint8)
    client.register_memory(src.ctypes.data, src.nbytes)
    client.register_memory(dst.ctypes.data, dst.nbytes)
    keys = [f"p{i}" for i in range(n)]

    def batches(buf: np.ndarray) -> list[tuple[list[str], list[int]]]:
        return [
            (keys[b : b + slots], [buf.ctypes.data + i * VALUE for i in range(b, b + slots)])
            for b in range(0, n, slots)
        ]

    def served() -> list[int]:
        dst[:] = 0
        got: list[bool] = []
        for ks, ptrs in batches(dst):
            got += client.batch_get_into_ptr(ks, ptrs, [VALUE] * len(ks))
        page = slice
        return [i for i in range(n) if got[i] and np.array_equal(
            dst[page(i * VALUE, (i + 1) * VALUE)], src[page(i * VALUE, (i + 1) * VALUE)])]

    for ks, ptrs in batches(src):
        assert client.batch_put_from_ptr(ks, ptrs, [VALUE] * len(ks)) == [True] * len(ks)
    assert client.flush() is True
    segments = sorted(ssd_dir.glob("segment_*.log"))
    assert segments, sorted(os.listdir(ssd_dir))
    on_disk = b"".join(p.read_bytes() for p in segments)
    for i in range(n):
        assert src[i * VALUE : (i + 1) * VALUE].tobytes() in on_disk, f"page {i} not in files"
    del on_disk
    assert served() == list(range(n))
    for seg in segments:
        flipped = (np.fromfile(seg, dtype=np.uint8) ^ 0xFF).tobytes()
        with open(seg, "r+b") as f:  # in place: mori keeps its descriptors
            f.write(flipped)
            f.flush()
            os.fsync(f.fileno())
    assert served() == [], "pages were served from somewhere other than the segment files"


def test_plain_local_config_ignores_ssd_settings(tmp_path: Path) -> None:
    """Pins the 1.2.4 trap: UMBPConfig() with ssd.* set keeps pages in DRAM, writes no file."""
    from mori import umbp

    config = umbp.UMBPConfig()
    config.dram.capacity_bytes = 8 * VALUE
    config.ssd.enabled = True
    config.ssd.storage_dir = str(tmp_path / "ignored")
    config.ssd.capacity_bytes = 64 * VALUE
    client = umbp.UMBPClient(config)
    buf = np.ones(4 * VALUE, dtype=np.uint8)
    keys = [f"k{i}" for i in range(4)]
    ptrs = [buf.ctypes.data + i * VALUE for i in range(4)]
    assert client.batch_put_from_ptr(keys, ptrs, [VALUE] * 4) == [True] * 4
    client.flush()
    ignored = tmp_path / "ignored"
    assert not ignored.exists() or _segment_bytes(ignored) == 0


def test_ssd_batch_past_the_staging_slots_fails_its_tail(tmp_path: Path) -> None:
    """One put batch stores at most ``slots`` values of ``dram_page_size``: why the store
    chunks SSD batches by ``max_batch_keys``."""
    opened_client = make_embedded_ssd_client(
        str(tmp_path / "ssd"), 256 * VALUE, staging_slots=4, max_value_bytes=VALUE
    )
    buf = np.ones(8 * VALUE, dtype=np.uint8)
    opened_client.client.register_memory(buf.ctypes.data, buf.nbytes)
    keys = [f"k{i}" for i in range(8)]
    got = opened_client.client.batch_put_from_ptr(
        keys, [buf.ctypes.data + i * VALUE for i in range(8)], [VALUE] * 8
    )
    assert got == [True] * 4 + [False] * 4
    assert opened_client.max_batch_keys == 4


def test_make_client_from_the_configuration(tmp_path: Path, standalone_servers) -> None:
    """The config-driven factory opens the real clients: embedded DRAM, embedded SSD (pages in
    <umbp_ssd_dir>/rank-0) and standalone (servers at <umbp_socket_dir>/<medium>.sock)."""
    from hicache_umbp.clients.factories import make_client
    from hicache_umbp.contract.load import load_store_config

    embedded = load_store_config(
        {"umbp_dram_bytes": 16 * VALUE, "umbp_ssd_enabled": True,
         "umbp_ssd_dir": str(tmp_path / "ssd"), "umbp_ssd_bytes": 256 * VALUE},
        env={},
    ).rank(0)
    sockets = tmp_path  # where the fixture puts <name>.sock
    standalone = load_store_config(
        {"umbp_mode": "standalone", "umbp_socket_dir": str(sockets), "umbp_ssd_enabled": True,
         "umbp_standalone_wait_s": 30},
        env={},
    ).rank(0)
    standalone_servers.start("dram", standalone_server_env("dram", capacity_bytes=16 * VALUE),
                             name="dram")
    standalone_servers.start(
        "ssd",
        standalone_server_env("ssd", capacity_bytes=256 * VALUE, ssd_dir=str(tmp_path / "sa"),
                              value_bytes=VALUE),
        name="ssd",
    )
    arena = HostArena(2 * VALUE)
    arena.view[:VALUE] = 42
    for rank in (embedded, standalone):
        for medium in rank.media():
            c = make_client(rank, medium, ssd_value_bytes=VALUE)
            assert c.medium == medium and c.mode == rank.config.umbp_mode
            assert c.client.register_memory(arena.ptr, arena.nbytes) is True
            assert c.client.batch_put_from_ptr(["k"], [arena.ptr], [VALUE]) == [True]
            arena.view[VALUE:] = 0
            assert c.client.batch_get_into_ptr(["k"], [arena.ptr + VALUE], [VALUE]) == [True]
            assert int(arena.view[VALUE:].min()) == 42
            c.client.deregister_memory(arena.ptr)
            c.close()
    assert list((tmp_path / "ssd" / "rank-0").glob("segment_*.log"))
    arena.close()


def test_standalone_client_waits_then_names_the_socket(tmp_path: Path) -> None:
    from hicache_umbp.clients.factories import StandaloneServerUnavailableError

    with pytest.raises(StandaloneServerUnavailableError, match=r"dram server socket .*nope\.sock"):
        make_standalone_client(str(tmp_path / "nope.sock"), "dram", wait_s=0.2)


def test_ssd_read_lease_is_short_on_the_real_path(tmp_path: Path) -> None:
    """The ~3 s default lease of mori's SSD staging slots stalls every read batch after the
    first; the factory and the standalone env both pin the short lease (real mori)."""
    import subprocess
    import sys

    from hicache_umbp.contract.mori_env import SSD_READ_LEASE_ENV, SSD_READ_LEASE_MS

    env = standalone_server_env("ssd", capacity_bytes=256 << 20, ssd_dir=str(tmp_path / "s"))
    assert env[SSD_READ_LEASE_ENV] == str(SSD_READ_LEASE_MS)
    code = (
        "import os, sys\n"
        "from hicache_umbp.clients.factories import make_embedded_ssd_client\n"
        "from hicache_umbp.contract.mori_env import SSD_READ_LEASE_ENV\n"
        "os.environ.pop(SSD_READ_LEASE_ENV, None)\n"
        f"c = make_embedded_ssd_client({str(tmp_path / 'e')!r}, 256 << 20)\n"
        "print(os.environ[SSD_READ_LEASE_ENV]); c.close()\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.strip().splitlines()[-1] == str(SSD_READ_LEASE_MS)
