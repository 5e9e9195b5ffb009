"""Our SSD tier (hicache_umbp.disk) on a real filesystem: the UMBP client contract, restarts,
torn writes, identities, sharing between processes, eviction, failures and O_DIRECT.

Real: the files, ``O_DIRECT`` ``preadv``/``pwritev`` on this machine's ext4 (the tmp_path
directory), ``posix_fallocate``, ``statvfs``, ``flock``/``lockf`` between real processes, a real
SIGKILL in the middle of a page write. Faked, and said where: a failing disk (EIO injected at the
drive's transfer call: no device here fails on demand) and the evicting writer of a race (the
slot freed in the shared index between a reader's lookup and its read).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from hicache_umbp.clients.factories import OpenedClient
from hicache_umbp.contract.settings import ConfigError
from hicache_umbp.disk import DiskStore
from hicache_umbp.disk.drive import Drive
from hicache_umbp.disk.index import Slot
from hicache_umbp.disk.layout import DATA_FILE, DIR_NAME, key_digest

from .contract import CHECKS, Subject

VALUE = 64 * 1024
ROOT = Path(__file__).resolve().parents[2]


def _subject(tmp_path: Path) -> Subject:
    counter = iter(range(1000))

    def open_(capacity_values: int) -> OpenedClient:
        d = tmp_path / f"drive-{next(counter)}"
        d.mkdir()
        store = DiskStore.open([str(d)], capacity_bytes=capacity_values * VALUE,
                               value_bytes=VALUE, identity="contract")
        return OpenedClient(store, "ssd", "embedded", None, VALUE, "hicache disk",
                            _on_close=[store.close])

    return Subject("hicache-disk", open_, VALUE, clear_disables_puts=False,
                   full_batch_fails_tail=False)


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_disk_store_meets_the_client_contract(tmp_path: Path, check: Callable[[Subject], None]):
    check(_subject(tmp_path))


class Pages:
    """``n`` pages of ``size`` bytes in one page-aligned anonymous mapping (like a host pool),
    plus as many destinations."""

    def __init__(self, n: int, size: int, seed: int = 0) -> None:
        self.n, self.size = n, size
        self.map = mmap.mmap(-1, 2 * n * size)
        self.ptr = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        self.view = np.frombuffer(self.map, dtype=np.uint8)
        self.view[: n * size] = np.random.default_rng(seed).integers(0, 256, n * size,
                                                                     dtype=np.uint8)

    def src(self, i: int) -> int:
        return self.ptr + i * self.size

    def dst(self, i: int) -> int:
        return self.ptr + (self.n + i) * self.size

    def same(self, i: int) -> bool:
        s = self.size
        return bool(np.array_equal(self.view[i * s : (i + 1) * s],
                                   self.view[(self.n + i) * s : (self.n + i + 1) * s]))

    def put(self, store: DiskStore, keys: list[str], first: int = 0) -> list[bool]:
        return store.batch_put_from_ptr(keys, [self.src(first + i) for i in range(len(keys))],
                                        [self.size] * len(keys))

    def get(self, store: DiskStore, keys: list[str]) -> list[bool]:
        self.view[self.n * self.size :] = 0
        return store.batch_get_into_ptr(keys, [self.dst(i) for i in range(len(keys))],
                                        [self.size] * len(keys))


@pytest.fixture
def pages() -> Iterator[Pages]:
    p = Pages(32, VALUE)
    yield p
    del p.view


def _open(d: Path | list[Path], capacity: int = 64 * VALUE, identity: str = "ns/model/tp1",
          **kw) -> DiskStore:
    dirs = d if isinstance(d, list) else [d]
    return DiskStore.open([str(x) for x in dirs], capacity_bytes=capacity, value_bytes=VALUE,
                          identity=identity, **kw)


def test_pages_survive_a_restart_byte_exact_with_their_accounting(tmp_path: Path, pages: Pages):
    keys = [f"k{i}" for i in range(20)]
    store = _open(tmp_path)
    assert pages.put(store, keys) == [True] * 20
    assert store.disk_stats().pages == 20
    store.close()
    again = _open(tmp_path)
    try:
        assert again.disk_stats().pages == 20, "the tier's accounting is lost on restart"
        assert pages.get(again, keys) == [True] * 20
        assert all(pages.same(i) for i in range(20))
    finally:
        again.close()


_KILLED_WRITER = textwrap.dedent("""
    import ctypes, mmap, os, signal, sys
    sys.path[:0] = sys.argv[4:]
    from hicache_umbp.disk import DiskStore
    from hicache_umbp.disk.drive import Drive
    directory, value, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    store = DiskStore.open([directory], capacity_bytes=16 * value, value_bytes=value,
                           identity="ns/model/tp1")
    buf = mmap.mmap(-1, value)
    buf.write(b"\\xab" * value)
    ptr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    if mode == "fill":
        keys = [f"old{i}" for i in range(16)]
        assert store.batch_put_from_ptr(keys, [ptr] * 16, [value] * 16) == [True] * 16
        sys.exit(0)
    real = Drive._io
    def torn(self, call, slot, p, size):
        if call is os.pwritev:
            real(self, call, slot, p, size // 2)   # half the page reaches the disk
            os.kill(os.getpid(), signal.SIGKILL)
        return real(self, call, slot, p, size)
    Drive._io = torn
    store.batch_put_from_ptr(["torn"], [ptr], [value])
""")


def _run_writer(directory: Path, mode: str) -> int:
    return subprocess.run(
        [sys.executable, "-c", _KILLED_WRITER, str(directory), str(VALUE), mode,
         str(ROOT / "backend")], check=False).returncode


def test_a_page_torn_by_sigkill_mid_write_is_never_served(tmp_path: Path, pages: Pages):
    """A real process is SIGKILLed after half of a page reached the disk; the one before it
    fills every slot, so the torn write overwrote a committed page's slot."""
    assert _run_writer(tmp_path, "fill") == 0
    assert _run_writer(tmp_path, "torn") == -9
    store = _open(tmp_path, capacity=16 * VALUE)
    try:
        assert store.batch_exists(["torn"]) == [False]
        assert store.batch_get_into_ptr(["torn"], [pages.dst(0)], [VALUE]) == [False]
        old = [f"old{i}" for i in range(16)]
        present = store.batch_exists(old)
        assert sum(present) == 15, "the evicted page must be gone, the others kept"
        got = store.batch_get_into_ptr(old, [pages.dst(i) for i in range(16)], [VALUE] * 16)
        assert got == present
        assert all((pages.view[(pages.n + i) * VALUE : (pages.n + i + 1) * VALUE] == 0xAB).all()
                   for i in range(16) if got[i])
        assert store.drives[0].recovered == 1, "the half-written slot was not recovered"
        assert store.disk_stats().pages == 15
    finally:
        store.close()


@pytest.mark.parametrize("other", ["other-ns/model/tp1", "ns/other-model/tp1",
                                   "ns/model/tp1/page_first_direct", "ns/model/tp2"])
def test_pages_of_another_identity_on_the_volume_are_never_served(
        tmp_path: Path, pages: Pages, other: str):
    keys = [f"k{i}" for i in range(8)]
    store = _open(tmp_path)
    assert pages.put(store, keys) == [True] * 8
    store.close()
    stranger = _open(tmp_path, identity=other)
    try:
        assert stranger.batch_exists(keys) == [False] * 8
        assert pages.get(stranger, keys) == [False] * 8
        assert stranger.disk_stats().pages == 0
    finally:
        stranger.close()


def test_another_identity_cannot_open_a_drive_in_use(tmp_path: Path):
    store = _open(tmp_path)
    try:
        with pytest.raises(ConfigError, match="another process has this drive open"):
            _run_in_child(tmp_path, identity="other-ns/model/tp1")
    finally:
        store.close()


def _run_in_child(directory: Path, identity: str) -> None:
    code = textwrap.dedent(f"""
        import sys; sys.path[:0] = [{str(ROOT / 'backend')!r}]
        from hicache_umbp.disk import DiskStore
        DiskStore.open([{str(directory)!r}], capacity_bytes={64 * VALUE}, value_bytes={VALUE},
                       identity={identity!r})
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if r.returncode:
        raise ConfigError([r.stderr.strip().splitlines()[-1]])


def test_ranks_in_other_processes_share_the_drives_one_copy_per_page(tmp_path: Path,
                                                                    pages: Pages):
    """Two processes (two ranks) open the same drive: one writes, the other reads it back; a
    page both write (MLA: the same on every rank) takes one slot."""
    store = _open(tmp_path)
    try:
        assert pages.put(store, ["shared"]) == [True]
        code = textwrap.dedent(f"""
            import ctypes, mmap, sys; sys.path[:0] = [{str(ROOT / 'backend')!r}]
            from hicache_umbp.disk import DiskStore
            s = DiskStore.open([{str(tmp_path)!r}], capacity_bytes={64 * VALUE},
                               value_bytes={VALUE}, identity="ns/model/tp1")
            buf = mmap.mmap(-1, {VALUE}); buf.write(bytes(range(256)) * {VALUE // 256})
            ptr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
            assert s.batch_put_from_ptr(["from-rank1", "shared"], [ptr, ptr], [{VALUE}] * 2) \\
                == [True, True]
            out = mmap.mmap(-1, {VALUE})
            optr = ctypes.addressof(ctypes.c_char.from_buffer(out))
            assert s.batch_get_into_ptr(["shared"], [optr], [{VALUE}]) == [True]
            sys.stdout.write(out[:].hex()[:64])
        """)
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True)
        assert r.stdout == pages.view[:32].tobytes().hex(), "rank 1 read another page"
        assert pages.get(store, ["from-rank1"]) == [True]
        got = pages.view[pages.n * VALUE : pages.n * VALUE + VALUE]
        assert got.tobytes() == bytes(range(256)) * (VALUE // 256)
        assert store.drives[0].index.counts() == (2, 0), "a shared page was stored twice"
    finally:
        store.close()


def test_eviction_keeps_the_tier_within_its_size_across_restarts(tmp_path: Path):
    cap = 32
    many = Pages(96, VALUE, seed=3)
    store = _open(tmp_path, capacity=cap * VALUE)
    data = tmp_path / DIR_NAME / DATA_FILE
    size = data.stat().st_size
    try:
        keys = [f"w{i}" for i in range(96)]
        for start in range(0, 96, 16):
            assert many.put(store, keys[start : start + 16], first=start) == [True] * 16
        present = store.batch_exists(keys)
        assert sum(present) <= cap and present[-1]
        assert store.disk_stats().evictions == 96 - sum(present)
        assert data.stat().st_size == size == cap * VALUE, "the data file grew past its size"
    finally:
        store.close()
    again = _open(tmp_path, capacity=cap * VALUE)
    try:
        assert again.batch_exists(keys) == present
        assert again.disk_stats().pages == sum(present) <= cap
        got = again.batch_get_into_ptr(keys, [many.dst(i) for i in range(96)], [VALUE] * 96)
        assert got == present
        assert all(many.same(i) for i in range(96) if got[i])
    finally:
        again.close()


def _failing(failed_call: Callable[..., int]) -> Callable[..., None]:
    """``Drive._io`` failing every transfer made with ``failed_call`` (os.preadv or
    os.pwritev) with EIO, as a dying disk does; the other direction works."""
    real = Drive._io

    def io(self: Drive, call: Callable[..., int], slot: int, ptr: int, size: int) -> None:
        if call is failed_call:
            raise OSError(errno.EIO, "Input/output error")
        real(self, call, slot, ptr, size)

    return io


def test_a_failing_disk_makes_pages_not_stored_never_acknowledged(tmp_path: Path,
                                                                  pages: Pages,
                                                                  monkeypatch):
    """Faked: EIO injected at the drive's transfer call, for writes only."""
    store = _open(tmp_path)
    real = Drive._io
    try:
        monkeypatch.setattr(Drive, "_io", _failing(os.pwritev))
        assert pages.put(store, ["a", "b"]) == [False, False]
        assert store.batch_exists(["a", "b"]) == [False, False]
        stats = store.disk_stats()
        assert stats.write_errors == 2 and stats.pages == 0
        monkeypatch.setattr(Drive, "_io", real)
        assert pages.put(store, ["a", "b"]) == [True, True], "a failed slot stayed claimed"
    finally:
        store.close()


def test_a_read_error_is_a_miss_never_wrong_bytes(tmp_path: Path, pages: Pages, monkeypatch):
    """Faked: EIO injected at the drive's transfer call, for reads only."""
    store = _open(tmp_path)
    real = Drive._io
    try:
        assert pages.put(store, ["a"]) == [True]
        monkeypatch.setattr(Drive, "_io", _failing(os.preadv))
        assert pages.get(store, ["a"]) == [False]
        assert store.disk_stats().read_errors == 1
        monkeypatch.setattr(Drive, "_io", real)
        assert pages.get(store, ["a"]) == [True] and pages.same(0)
    finally:
        store.close()


def test_a_page_evicted_while_it_is_read_is_a_miss(tmp_path: Path, pages: Pages, monkeypatch):
    """Faked: the evicting writer (another rank) frees and reclaims the slot in the shared
    index between the reader's lookup and its read; the reader must notice the generation."""
    store = _open(tmp_path)
    real = Drive.pread

    def raced(self, found, ptr):
        self.index._free(found.slot, found.gen)
        claimed, _ = self.index.claim(key_digest("intruder"), VALUE)
        assert isinstance(claimed, Slot) and claimed.slot == found.slot
        return real(self, found, ptr)

    try:
        assert pages.put(store, ["victim"]) == [True]
        monkeypatch.setattr(Drive, "pread", raced)
        assert pages.get(store, ["victim"]) == [False]
        assert store.disk_stats().overwritten == 1
    finally:
        store.close()


def test_a_capacity_the_volume_cannot_hold_is_refused_at_start(tmp_path: Path):
    with pytest.raises(ConfigError, match=r"umbp_ssd_bytes \(HICACHE_UMBP_SSD_BYTES\).* free"):
        _open(tmp_path, capacity=1 << 60)
    assert not (tmp_path / DIR_NAME / DATA_FILE).exists() or \
        (tmp_path / DIR_NAME / DATA_FILE).stat().st_size == 0


def test_aligned_pages_move_with_o_direct_and_no_copy(tmp_path: Path, pages: Pages):
    """Every transfer of a 4 KiB-aligned page goes straight between the page and the disk; a
    misaligned page goes through the page cache and is still exact."""
    store = _open(tmp_path)
    try:
        assert store.drives[0].direct, "this filesystem supports O_DIRECT"
        keys = [f"d{i}" for i in range(8)]
        assert pages.put(store, keys) == [True] * 8
        assert pages.get(store, keys) == [True] * 8
        stats = store.disk_stats()
        assert (stats.direct_ios, stats.buffered_ios) == (16, 0)
        odd = pages.src(20) + 16
        assert store.batch_put_from_ptr(["odd"], [odd], [VALUE - 16]) == [True]
        assert store.batch_get_into_ptr(["odd"], [pages.dst(0) + 16], [VALUE - 16]) == [True]
        got = pages.view[pages.n * VALUE + 16 : pages.n * VALUE + VALUE]
        assert np.array_equal(got, pages.view[20 * VALUE + 16 : 21 * VALUE])
        assert store.disk_stats().buffered_ios == 2
    finally:
        store.close()


def test_pages_are_striped_over_several_drives(tmp_path: Path):
    many = Pages(64, VALUE, seed=5)
    dirs = [tmp_path / f"nvme{i}" for i in range(4)]
    for d in dirs:
        d.mkdir()
    store = _open(dirs, capacity=256 * VALUE)
    try:
        keys = [f"s{i}" for i in range(64)]
        assert many.put(store, keys) == [True] * 64
        per_drive = [d.index.counts()[0] for d in store.drives]
        assert sum(per_drive) == 64 and min(per_drive) >= 8, per_drive
        assert many.get(store, keys) == [True] * 64
        assert all(many.same(i) for i in range(64))
    finally:
        store.close()


def test_strict_durability_acknowledges_only_synced_pages(tmp_path: Path, pages: Pages,
                                                         monkeypatch):
    """Strict: every acknowledged page was fdatasync'ed (data) and msync'ed (index) first;
    counted on the real calls (the sync itself is real)."""
    store = _open(tmp_path, durable=True)
    calls: list[str] = []
    real_sync = Drive.sync

    def counted(self):
        calls.append("sync")
        return real_sync(self)

    try:
        monkeypatch.setattr(Drive, "sync", counted)
        keys = [f"s{i}" for i in range(8)]
        assert pages.put(store, keys) == [True] * 8
        assert calls == ["sync"], "one fdatasync + msync per drive and batch"
        store.close()
        again = _open(tmp_path, durable=True)
        assert pages.get(again, keys) == [True] * 8 and all(pages.same(i) for i in range(8))
        again.close()
    finally:
        store.close()


def test_dram_hits_keep_their_ssd_copies_warm(tmp_path: Path, pages: Pages):
    """DRAM (the in-process double, faked) in front of our SSD tier (real): pages DRAM serves
    are touched on the SSD too, so when the SSD evicts, it evicts what nobody read, not the
    hot pages DRAM happens to hold (an inclusive cache's classic mistake)."""
    from hicache_umbp.store.tiers import TieredClient
    from support.memory_client import MemoryUMBPClient

    disk = _open(tmp_path, capacity=16 * VALUE, io_threads=1)
    tiers = TieredClient(MemoryUMBPClient(64 * VALUE), disk, write_policy="write_through")
    try:
        hot, cold, new = ([f"{n}{i}" for i in range(8)] for n in ("hot", "cold", "new"))
        for batch in (hot, cold):
            assert tiers.batch_put_from_ptr(batch, [pages.src(i) for i in range(8)],
                                            [VALUE] * 8) == [True] * 8
        got = tiers.batch_get_into_ptr(hot, [pages.dst(i) for i in range(8)], [VALUE] * 8)
        assert got == [True] * 8 and tiers.tier_stats().dram_hits == 8
        disk.drives[0].submit(lambda: None).result()  # the touches ran (one I/O thread)
        assert disk.batch_put_from_ptr(new, [pages.src(i) for i in range(8)],
                                       [VALUE] * 8) == [True] * 8
        assert disk.batch_exists(hot) == [True] * 8, "the SSD evicted the pages DRAM serves"
        assert disk.batch_exists(cold) == [False] * 8
    finally:
        tiers.close()
        disk.close()
