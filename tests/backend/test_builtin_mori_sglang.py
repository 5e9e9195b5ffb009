"""Facts about SGLang 0.5.23's built-in ``mori`` backend on amd-mori 1.2.4, measured in the engine
environment (issue 12: the operator offers it as an L3 choice and validates CRs by these).

Real: SGLang's scheduler stack (``HybridCacheController`` built by the plain-KV strategy) with
``--hicache-storage-backend mori`` (``storage/umbp/umbp_store.py``, its own host allocator
``umbp_host_allocator.py`` chosen by ``get_allocator_from_storage``, configured by the
``SGLANG_HICACHE_HOST_*`` and ``UMBP_*`` environment and its extra-config keys), the real mori
client it opens, real ``umbp_standalone_server`` processes (started and killed by PID) with the
``UMBP_*`` environment our operator renders for sidecars, files measured on disk. Ours runs
beside it in the same stack where a fact is a comparison. Pages are 128 KiB (MHA, 2 layers x 8
KV heads x 128, bf16, 16-token pages: two 64 KiB parts).

What these tests pin (each fails if SGLang or mori changes the behaviour):

* in-process, ``ssd_enabled`` with a directory and a DRAM tier smaller than the working set: the
  built-in backend acknowledges every backup but writes no byte under the SSD directory; pages
  past its DRAM are gone. Ours, configured alike, keeps all of them on disk and reads them
  back byte-exact;
* a standalone server with ``UMBP_DISTRIBUTED_MEDIUM=SSD`` (an SSD node) stages one call in
  ``UMBP_DISTRIBUTED_SSD_STAGING_BUFFER_SLOTS`` slots. The built-in backend sends SGLang's
  whole storage batch (up to 128 pages: 256 values for MHA) in one call, so with our sidecar's
  16 slots every backup of more than 8 MHA pages fails (SGLang logs ``Write page to storage: N
  pages failed``), although the first 16 values reach the disk; with slots >= the values of
  the largest batch, its writes and reads work;
* a standalone DRAM server keeps the built-in backend's pages across an engine restart.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch
from hicache_umbp.contract.mori_env import standalone_server_env
from hicache_umbp.contract.names import dynamic_extra_config

from . import sglang_env as E
from . import sglang_stack as S
from .conftest import StandaloneServers

pytestmark = pytest.mark.sglang

MIB = 1 << 20
NODES, PER_NODE = 4, 16  # 64 pages of 128 KiB (8 MiB), backed up as 4 radix nodes
PART = 64 * 1024


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return E.tiny_model_dir(tmp_path_factory.mktemp("model"))


@pytest.fixture
def builtin_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    # The built-in allocator asks for hugepages and prefaults by default; this machine's
    # hugepages are not reserved for the test, and a 1 GB pool is mostly never touched.
    monkeypatch.setenv("SGLANG_HICACHE_HOST_HUGEPAGE", "0")
    monkeypatch.setenv("SGLANG_HICACHE_HOST_PREFAULT", "0")
    for name in ("UMBP_STANDALONE_ADDRESS", "UMBP_MASTER_ADDRESS", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def device_pool() -> Any:
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    return MHATokenToKVPool(size=64 * E.PAGE, page_size=E.PAGE, dtype=torch.bfloat16,
                            head_num=8, head_dim=128, layer_num=2, device="cpu",
                            enable_memory_saver=False)


def stack(model: Path, backend: str, extra: dict[str, Any], stacks: list[S.Stack]) -> S.Stack:
    built = S.scheduler_stack(model, "mha", extra | {"prefetch_threshold": E.PAGE},
                              backend=backend, device_pool=device_pool())
    stacks.append(built)
    return built


def back_up_nodes(st: S.Stack, seed: int) -> tuple[list[int], list[str], list[bytes], list[int]]:
    """64 fresh pages backed up as NODES radix nodes; (tokens, hashes, bytes, tokens each
    backup completed)."""
    rng = random.Random(seed)
    tokens = [rng.randrange(256) for _ in range(NODES * PER_NODE * E.PAGE)]
    hashes = S.page_hashes(tokens, E.PAGE)
    idx = st.host.alloc(len(tokens))
    E.fill_pages(st.host, idx, seed)
    want = E.page_bytes(st.host, idx)
    assert len(want[0]) == 2 * PART
    done = []
    for n in range(NODES):
        t = slice(n * PER_NODE * E.PAGE, (n + 1) * PER_NODE * E.PAGE)
        done.append(S.backup(st.ctrl, idx[t], tokens[t], hashes[n * PER_NODE:(n + 1) * PER_NODE]))
    st.host.free(idx)
    E.wipe_pages(st.host, idx)
    return tokens, hashes, want, done


def read_back(st: S.Stack, tokens: list[int], hashes: list[str], want: list[bytes]) -> int:
    """Prefetch every node (continuing the chain, as after a matched prefix); pages exact."""
    exact = 0
    for n in range(NODES):
        node = tokens[n * PER_NODE * E.PAGE:(n + 1) * PER_NODE * E.PAGE]
        got = S.prefetch(st.ctrl, f"node-{n}", node, hashes[n * PER_NODE - 1] if n else None)
        if got.host_indices is not None:
            have = E.page_bytes(st.host, got.host_indices)[: got.tokens // E.PAGE]
            exact += sum(a == b for a, b in zip(have, want[n * PER_NODE:], strict=False))
            st.host.free(got.host_indices)
    return exact


def disk_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) if root.exists() else 0


def test_in_process_builtin_writes_nothing_to_its_ssd_tier_ours_keeps_every_page(
    model: Path, tmp_path: Path, builtin_env: pytest.MonkeyPatch, stacks: list[S.Stack],
) -> None:
    builtin_dir, ours_dir = tmp_path / "builtin-ssd", tmp_path / "ours-ssd"
    builtin = stack(model, "mori", {"dram_capacity_bytes": 8 * MIB, "ssd_enabled": True,
                                    "ssd_storage_dir": str(builtin_dir),
                                    "ssd_capacity_bytes": 256 * MIB}, stacks)
    assert type(builtin.backend).__name__ == "UMBPStore"
    tokens, hashes, want, done = back_up_nodes(builtin, seed=1)
    assert done == [PER_NODE * E.PAGE] * NODES  # every backup acknowledged
    assert builtin.backend.flush()
    assert disk_bytes(builtin_dir) == 0  # ... and not one byte on the SSD tier
    kept_builtin = read_back(builtin, tokens, hashes, want)
    assert kept_builtin < NODES * PER_NODE  # pages past its 8 MiB of DRAM are gone
    builtin.close()

    ours = stack(model, "dynamic", dynamic_extra_config(
        umbp_namespace="ns/facts", host_hugepage_bytes=0, host_prefault=False,
        umbp_dram_bytes=8 * MIB, umbp_ssd_enabled=True, umbp_ssd_dir=str(ours_dir),
        umbp_ssd_bytes=256 * MIB, umbp_tier_queue_bytes=16 * MIB), stacks)
    tokens, hashes, want, done = back_up_nodes(ours, seed=2)
    assert done == [PER_NODE * E.PAGE] * NODES
    assert ours.backend.flush()
    assert disk_bytes(ours_dir) >= NODES * PER_NODE * 2 * PART
    assert read_back(ours, tokens, hashes, want) == NODES * PER_NODE


@pytest.mark.parametrize("slots", [16, 256])
def test_builtin_on_a_standalone_ssd_server_needs_slots_for_a_whole_batch(
    model: Path, tmp_path: Path, builtin_env: pytest.MonkeyPatch,
    standalone_servers: StandaloneServers, stacks: list[S.Stack], slots: int,
) -> None:
    ssd_dir = tmp_path / "sidecar-ssd"
    server = standalone_servers.start("ssd", standalone_server_env(
        "ssd", capacity_bytes=256 * MIB, ssd_dir=str(ssd_dir), value_bytes=2 * PART,
        staging_slots=slots), "ssd")
    builtin_env.setenv("UMBP_STANDALONE_ADDRESS", f"unix:{server.socket_path}")
    builtin_env.setenv("UMBP_STANDALONE_AUTO_START", "0")
    st = stack(model, "mori", {}, stacks)
    assert st.backend._is_standalone_process
    tokens, hashes, want, done = back_up_nodes(st, seed=3)
    assert st.backend.flush()
    if slots == 16:  # 16 pages = 32 values per call: refused, though 16 values hit the disk
        assert done == [0] * NODES
        assert 0 < disk_bytes(ssd_dir) < NODES * PER_NODE * 2 * PART
        return
    assert done == [PER_NODE * E.PAGE] * NODES
    assert disk_bytes(ssd_dir) >= NODES * PER_NODE * 2 * PART
    assert read_back(st, tokens, hashes, want) == NODES * PER_NODE


def test_builtin_pages_on_a_standalone_dram_server_survive_an_engine_restart(
    model: Path, builtin_env: pytest.MonkeyPatch, standalone_servers: StandaloneServers,
    stacks: list[S.Stack],
) -> None:
    server = standalone_servers.start("dram", standalone_server_env(
        "dram", capacity_bytes=64 * MIB), "dram")
    builtin_env.setenv("UMBP_STANDALONE_ADDRESS", f"unix:{server.socket_path}")
    builtin_env.setenv("UMBP_STANDALONE_AUTO_START", "0")
    first = stack(model, "mori", {}, stacks)
    tokens, hashes, want, done = back_up_nodes(first, seed=4)
    assert done == [PER_NODE * E.PAGE] * NODES
    first.close()
    second = stack(model, "mori", {}, stacks)
    assert read_back(second, tokens, hashes, want) == NODES * PER_NODE
