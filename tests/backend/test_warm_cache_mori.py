"""What survives a restart, measured on the REAL amd-mori 1.2.4 (the statements of
``hicache_umbp.contract.persistence`` and docs/operations.md "Warm cache across restarts").

Real: every engine is a separate child process (the engine environment's interpreter under the
trixie loader) that builds the store from a configuration and writes or reads pages, then
exits -- an engine restart is a new process with the same configuration and directory. The
standalone servers are real ``umbp_standalone_server`` processes, killed and restarted by PID.
Nothing is faked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hicache_umbp.contract.mori_env import standalone_server_env
from hicache_umbp.contract.persistence import warm_cache_survival

from .conftest import StandaloneServers

pytestmark = pytest.mark.mori

MIB = 1 << 20
PART = 256 * 1024
PAGES = 24  # 2 parts each: 12 MiB

ENGINE = r"""
import ctypes, json, sys
import numpy as np
from hicache_umbp.build import build_store
from hicache_umbp.clients.buffers import MoriShmStaging
from hicache_umbp.contract.load import load_store_config
from hicache_umbp.contract.page_limits import MHA_PARTS
from hicache_umbp.store.keys import KeyScheme
from hicache_umbp.store.tiers import TieredClient

extra, op, pages, part = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
store = build_store(load_store_config(extra, env={}).rank(0),
                    keys=KeyScheme("warm", "m", 1, 0, MHA_PARTS), value_bytes=part)
mem = MoriShmStaging(2 * 2 * pages * part)
view = np.ctypeslib.as_array((ctypes.c_uint8 * mem.size).from_address(mem.ptr))
half = 2 * pages * part
view[:half] = np.random.default_rng(7).integers(0, 256, half, dtype=np.uint8)
store.register_buffer(mem.ptr, mem.size)
hashes = [f"{i:064x}" for i in range(pages)]
ptrs = lambda base: [[(base + (2 * i + p) * part, part) for p in range(2)] for i in range(pages)]
out = {}
if op == "write":
    out["stored"] = 0
    for s in range(0, pages, 4):
        out["stored"] += sum(store.batch_set(hashes[s:s + 4], ptrs(mem.ptr)[s:s + 4]))
    out["flushed"] = store.flush()
else:
    out["exists"] = store.batch_exists(hashes)
    got = store.batch_get(hashes, ptrs(mem.ptr + half))
    out["hits"] = sum(got)
    out["exact"] = bool(np.array_equal(view[:half], view[half:])) if all(got) else False
if isinstance(store.client, TieredClient):
    out["ssd_hits"] = store.client.tier_stats().ssd_hits
store.close()
print("RESULT " + json.dumps(out))
"""


def engine(extra: dict[str, Any], op: str) -> dict[str, Any]:
    """One engine process lifetime: build the store, write or read every page, exit."""
    cmd = [sys.executable, "-c", ENGINE, json.dumps(extra), op,
           str(PAGES), str(PART)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert done.returncode == 0 and lines, f"engine failed ({done.returncode}):\n{done.stderr}"
    return json.loads(lines[-1][len("RESULT "):])


def segment_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("segment_*") if p.is_file())


def embedded(tmp_path: Path, dram_bytes: int) -> dict[str, Any]:
    return {"umbp_dram_bytes": str(dram_bytes), "umbp_ssd_enabled": "true",
            "umbp_ssd_dir": str(tmp_path / "ssd"), "umbp_ssd_bytes": str(256 * MIB),
            "umbp_tier_queue_bytes": str(16 * PART)}


@pytest.mark.parametrize("dram_bytes", [0, 8 * MIB], ids=["ssd-only", "dram+ssd"])
def test_embedded_ssd_pages_do_not_survive_an_engine_restart(
    tmp_path: Path, dram_bytes: int
) -> None:
    """The pages are on disk when the first engine exits (the segment files hold them), but
    the next engine's SSD node discards those files at startup: nothing is found, and the
    files are truncated -- the same on a retained PVC after a pod restart."""
    extra = embedded(tmp_path, dram_bytes)
    wrote = engine(extra, "write")
    assert (wrote["stored"], wrote["flushed"]) == (PAGES, True)
    on_disk = segment_bytes(tmp_path / "ssd")
    assert on_disk >= 2 * PAGES * PART  # every page reached the SSD directory
    read = engine(extra, "read")
    assert read["exists"] == 0 and read["hits"] == 0
    assert segment_bytes(tmp_path / "ssd") < on_disk  # mori wiped its "leftover"
    expected = warm_cache_survival("embedded", dram=dram_bytes > 0, ssd=True)
    assert expected.engine_restart.startswith("lost") and "discards" in expected.summary()


def test_embedded_dram_pages_do_not_survive_an_engine_restart(tmp_path: Path) -> None:
    extra = {"umbp_dram_bytes": str(64 * MIB)}
    assert engine(extra, "write")["stored"] == PAGES
    assert engine(extra, "read")["exists"] == 0
    assert warm_cache_survival("embedded", dram=True, ssd=False).engine_restart.startswith(
        "lost")


def test_standalone_sidecars_keep_pages_across_engine_restarts_not_their_own(
    standalone_servers: StandaloneServers, tmp_path: Path
) -> None:
    """Sidecars: DRAM 8 MiB (2/3 of the pages evicted to SSD), SSD 256 MiB. An engine writes
    and exits; the next engine (new process) reads every page byte-exact, some from the SSD
    sidecar. Then the sidecars restart (a pod restart restarts them too): the DRAM sidecar
    comes back empty and the SSD sidecar discards its segment files."""
    dram = standalone_servers.start(
        "dram", standalone_server_env("dram", capacity_bytes=8 * MIB), name="dram")
    ssd = standalone_servers.start("ssd", standalone_server_env(
        "ssd", capacity_bytes=256 * MIB, ssd_dir=str(tmp_path / "ssd"), value_bytes=PART),
        name="ssd")
    extra = {"umbp_mode": "standalone", "umbp_ssd_enabled": "true",
             "umbp_socket_dir": str(tmp_path), "umbp_ssd_slot_bytes": str(PART),
             "umbp_tier_queue_bytes": str(16 * PART)}
    wrote = engine(extra, "write")
    assert (wrote["stored"], wrote["flushed"]) == (PAGES, True)
    read = engine(extra, "read")
    assert read["exists"] == PAGES and read["hits"] == PAGES and read["exact"] is True
    assert read["ssd_hits"] > 0  # evicted from the DRAM sidecar, served by the SSD sidecar
    assert warm_cache_survival("standalone", dram=True, ssd=True).engine_restart.startswith(
        "kept")
    on_disk = segment_bytes(tmp_path / "ssd")
    assert on_disk >= 2 * PAGES * PART
    standalone_servers.restart(dram)
    standalone_servers.restart(ssd)
    after = engine(extra, "read")
    assert after["exists"] == 0 and after["hits"] == 0
    assert segment_bytes(tmp_path / "ssd") < on_disk
    assert warm_cache_survival("standalone", dram=True, ssd=True).pod_restart.startswith("lost")


def hicache_ssd(tmp_path: Path, dram_bytes: int, mode: str = "embedded") -> dict[str, Any]:
    extra = {"umbp_ssd_enabled": "true", "umbp_ssd_engine": "hicache",
             "umbp_ssd_dir": f"{tmp_path / 'nvme0'},{tmp_path / 'nvme1'}",
             "umbp_ssd_bytes": str(256 * MIB), "umbp_tier_queue_bytes": str(16 * PART)}
    for d in ("nvme0", "nvme1"):
        (tmp_path / d).mkdir(exist_ok=True)
    if mode == "standalone":
        return extra | {"umbp_mode": "standalone", "umbp_socket_dir": str(tmp_path)}
    return extra | {"umbp_dram_bytes": str(dram_bytes)}


@pytest.mark.parametrize("dram_bytes", [0, 8 * MIB], ids=["ssd-only", "dram+ssd"])
def test_our_ssd_tier_keeps_its_pages_across_engine_restarts(
    tmp_path: Path, dram_bytes: int
) -> None:
    """Our SSD tier on two drive directories, with real mori DRAM in front (or none): the next
    engine process finds every page and reads it back byte-exact from the SSD."""
    extra = hicache_ssd(tmp_path, dram_bytes)
    wrote = engine(extra, "write")
    assert (wrote["stored"], wrote["flushed"]) == (PAGES, True)
    read = engine(extra, "read")
    assert read["exists"] == PAGES and read["hits"] == PAGES and read["exact"] is True
    if dram_bytes:
        assert read["ssd_hits"] == 2 * PAGES  # the new engine's DRAM is empty
    expected = warm_cache_survival("embedded", dram=dram_bytes > 0, ssd=True,
                                   ssd_engine="hicache")
    for when in (expected.engine_restart, expected.pod_restart):
        assert ("SSD pages kept" if dram_bytes else "kept") in when and "lost" not in \
            when.split("SSD pages")[-1], when


def test_our_ssd_tier_behind_the_dram_sidecar_survives_the_sidecars_restart(
    standalone_servers: StandaloneServers, tmp_path: Path
) -> None:
    """Standalone: the real DRAM sidecar (8 MiB, most pages evicted) in front of our SSD tier
    in the engine process. Engine restart: kept. Then the DRAM sidecar restarts too (as in a
    pod restart) and comes back empty: every page is still served, from our SSD tier."""
    dram = standalone_servers.start(
        "dram", standalone_server_env("dram", capacity_bytes=8 * MIB), name="dram")
    extra = hicache_ssd(tmp_path, 0, mode="standalone")
    wrote = engine(extra, "write")
    assert (wrote["stored"], wrote["flushed"]) == (PAGES, True)
    read = engine(extra, "read")
    assert read["hits"] == PAGES and read["exact"] is True
    standalone_servers.restart(dram)
    after = engine(extra, "read")
    assert after["exists"] == PAGES and after["hits"] == PAGES and after["exact"] is True
    assert after["ssd_hits"] == 2 * PAGES
    survival = warm_cache_survival("standalone", dram=True, ssd=True, ssd_engine="hicache")
    assert "SSD pages kept" in survival.pod_restart
