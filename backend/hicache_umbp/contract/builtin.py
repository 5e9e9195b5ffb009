"""SGLang 0.5.23's built-in ``mori`` backend as the contract knows it: its name among the L3
backends, the host-allocator variables it reads, and what it cannot do on mori 1.2.4.

Each refusal is worded here once; the backend's loader, the operator's planner and the CRD's CEL
rules all say it in these words (measured in tests/backend/test_builtin_backend_sglang.py;
docs/architecture.md compares the backends). The launcher renders its flags and environment
(:mod:`hicache_umbp.launch.builtin`).
"""

from __future__ import annotations

#: The L3 backends the launcher can start. ``umbp``: ours (``--hicache-storage-backend dynamic``
#: with the adapter, :mod:`hicache_umbp.contract.names`). ``sglang-mori``: SGLang 0.5.23's
#: built-in ``mori`` backend (``--hicache-storage-backend mori``, ``storage/umbp/umbp_store.py``),
#: which reads the ``SGLANG_HICACHE_HOST_*`` variables below and mori's own ``UMBP_*``
#: (:mod:`hicache_umbp.contract.mori_env`).
OUR_BACKEND = "umbp"
BUILTIN_BACKEND = "sglang-mori"
L3_BACKENDS = (OUR_BACKEND, BUILTIN_BACKEND)

#: ``--hicache-storage-backend`` value that selects it, and the extra-config keys the launcher
#: renders for it (``umbp_store.py`` reads them).
BACKEND_FLAG_VALUE = "mori"
SSD_ENABLED_KEY = "ssd_enabled"
DRAM_CAPACITY_KEY = "dram_capacity_bytes"

#: What SGLang's built-in host allocator (``umbp_host_allocator.py``) reads, once per process:
#: hugepages on/off (default on), their size in bytes (default 2 MiB), ONE NUMA node for the
#: whole process (``int()`` of the value: a per-rank list raises), prefault (default on).
SGLANG_HOST_HUGEPAGE = "SGLANG_HICACHE_HOST_HUGEPAGE"
SGLANG_HOST_HUGEPAGE_SIZE = "SGLANG_HICACHE_HOST_HUGEPAGE_SIZE"
SGLANG_HOST_NUMA_NODE = "SGLANG_HICACHE_HOST_NUMA_NODE"
SGLANG_HOST_PREFAULT = "SGLANG_HICACHE_HOST_PREFAULT"
SGLANG_HOST_ALLOCATOR_ENV = (SGLANG_HOST_HUGEPAGE, SGLANG_HOST_HUGEPAGE_SIZE,
                             SGLANG_HOST_NUMA_NODE, SGLANG_HOST_PREFAULT)

#: Why the built-in backend cannot hold an SSD tier on mori 1.2.4.
SSD_REFUSAL = (
    "the SSD tier needs backend umbp on mori 1.2.4: SGLang's built-in mori backend never "
    "writes its SSD tier in-process, and a standalone SSD server fails the part of each "
    "backup batch beyond its 16 staging slots (Write page to storage: N pages failed)"
)
#: Why it cannot honour a prefault thread count.
PREFAULT_THREADS_REFUSAL = (
    "SGLang's built-in host allocator has no thread setting; leave it 0 or use backend umbp"
)
#: Why it cannot run distributed here.
DISTRIBUTED_REFUSAL = "SGLang's built-in mori backend runs embedded or standalone here"
