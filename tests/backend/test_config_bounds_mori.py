"""A size the loader accepts but the process cannot map fails the store by name, on the REAL
amd-mori 1.2.4 (what used to surface as ``PoolClient::Init() failed`` or ``ENOMEM`` without the
key).

Real: mori's embedded DRAM tier and SSD node, the write-back ring's memfd, ``build_store``. The
shortage is real too: the child process that builds the store lowers its own address-space
limit (``RLIMIT_AS``) to what it has mapped plus 1 GiB after importing mori, as a container
whose memory cannot hold the tier would refuse the mapping; nothing on the machine runs short.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.mori

GIB = 1 << 30

CHILD = textwrap.dedent(
    """
    import json, resource, sys
    from hicache_umbp.build import build_store
    from hicache_umbp.clients.runtime import import_umbp
    from hicache_umbp.contract.load import load_store_config
    from hicache_umbp.contract.settings import ConfigError
    from hicache_umbp.contract.page_limits import MHA_PARTS
    from hicache_umbp.store.keys import KeyScheme

    import_umbp()
    with open("/proc/self/status") as f:
        vm = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), resource.RLIM_INFINITY))
    cfg = load_store_config(json.loads(sys.argv[1]), env={})
    try:
        build_store(cfg.rank(0), keys=KeyScheme("t", "m", 1, 0, MHA_PARTS), value_bytes=1 << 20)
    except ConfigError as e:
        print(json.dumps({"error": str(e)}))
    else:
        print(json.dumps({"error": None}))
    """
)


def build_in_child(extra: dict[str, object]) -> str | None:
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(extra)], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    error: str | None = json.loads(out.stdout.strip().splitlines()[-1])["error"]
    return error


def test_a_dram_tier_the_process_cannot_map_is_refused_naming_umbp_dram_bytes() -> None:
    error = build_in_child({"umbp_dram_bytes": 4 * GIB, "umbp_dram_prefault": False})
    assert error is not None
    assert "umbp_dram_bytes (HICACHE_UMBP_DRAM_BYTES) of rank 0 = 4294967296 bytes" in error
    assert "mori could not create the embedded DRAM tier" in error


def test_a_ring_the_process_cannot_map_is_refused_naming_umbp_tier_queue_bytes(
        tmp_path: Path) -> None:
    error = build_in_child({"umbp_dram_bytes": 64 << 20, "umbp_ssd_enabled": True,
                            "umbp_ssd_dir": str(tmp_path), "umbp_ssd_bytes": GIB,
                            "umbp_tier_queue_bytes": 4 * GIB})
    assert error is not None
    assert "umbp_tier_queue_bytes (HICACHE_UMBP_TIER_QUEUE_BYTES) = 4294967296 bytes" in error
    assert "could not be mapped" in error


def test_the_same_sizes_within_the_limit_build() -> None:
    assert build_in_child({"umbp_dram_bytes": 64 << 20, "umbp_dram_prefault": False}) is None
