"""Key separation on the REAL amd-mori 1.2.4: two deployments that share one standalone
``umbp_standalone_server`` (as pods of one node share a retained volume or a sidecar) and
differ in exactly one field of the key never read each other's pages.

Real: the server process (started and killed by PID), two mori clients, mori-allocated shm
buffers, our key scheme and store. Nothing is faked.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hicache_umbp.clients.factories import make_standalone_client
from hicache_umbp.contract.mori_env import standalone_server_env
from hicache_umbp.contract.page_limits import MHA_PARTS
from hicache_umbp.store.keys import KeyScheme, PageFormat
from hicache_umbp.store.store import UMBPStore

from .conftest import StandaloneServers
from .test_store_mori import Pool, hashes

pytestmark = pytest.mark.mori

MIB = 1 << 20
BASE: dict[str, Any] = dict(
    namespace="prod/llama", model_id="meta-llama/Llama-3-8B", tp_size=2, rank=1,
    parts=MHA_PARTS, page_format=PageFormat("page_first", "bfloat16", 64))
CHANGES: dict[str, dict[str, Any]] = {
    "layout": {"page_format": PageFormat("page_first_direct", "bfloat16", 64)},
    "kv_dtype": {"page_format": PageFormat("page_first", "float16", 64)},
    "fp8_variant": {"page_format": PageFormat("page_first", "uint8:fp8_e5m2", 64)},
    "page_size": {"page_format": PageFormat("page_first", "bfloat16", 128)},
    "format_tag": {"page_format": PageFormat("page_first", "bfloat16", 64, "unified-token-major")},
    "backend_tag": {"backend_tag": "blue"},
    "model": {"model_id": "meta-llama/Llama-3-8B-Instruct"},
    "namespace": {"namespace": "prod/other"},
    "tp_layout": {"tp_size": 4},
}


def test_deployments_differing_in_one_key_field_never_share_a_page(
    standalone_servers: StandaloneServers,
) -> None:
    server = standalone_servers.start("dram", standalone_server_env("dram", capacity_bytes=
                                                                     256 * MIB))
    a_client = make_standalone_client(server.socket_path, "dram", wait_s=30)
    b_client = make_standalone_client(server.socket_path, "dram", wait_s=30)
    src, dst = Pool(4, 2, 51, shm=True), Pool(4, 2, 52, shm=True)
    try:
        a = UMBPStore(a_client.client, KeyScheme(**BASE), owns_client=False)
        assert a.register_buffer(src.ptr, src.nbytes) and a.register_buffer(dst.ptr, dst.nbytes)
        hs = hashes(4, "shared")
        assert a.batch_set(hs, src.ptrs(range(4))) == [True] * 4
        for field, change in CHANGES.items():
            b = UMBPStore(b_client.client, KeyScheme(**{**BASE, **change}), owns_client=False)
            assert b.register_buffer(dst.ptr, dst.nbytes)
            assert b.batch_exists(hs) == 0, f"{field}: B sees A's pages"
            dst.zero()
            assert b.batch_get(hs, dst.ptrs(range(4))) == [False] * 4, field
            assert not dst.view.any(), f"{field}: bytes of A reached B's buffer"
            b.close()
        twin = UMBPStore(b_client.client, KeyScheme(**BASE), owns_client=False)
        assert twin.register_buffer(dst.ptr, dst.nbytes)
        assert twin.batch_exists(hs) == 4  # the same deployment elsewhere does read them
        assert twin.batch_get(hs, dst.ptrs(range(4))) == [True] * 4
        assert all(np.array_equal(dst.page(i), src.page(i)) for i in range(4))
        twin.close()
        a.close()
    finally:
        for c in (a_client, b_client):
            c.client.deregister_memory(src.ptr)
            c.client.deregister_memory(dst.ptr)
            c.close()
        src.close()
        dst.close()
