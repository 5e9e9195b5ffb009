"""``hicache_umbp.sglang_adapter``: the public load path of the storage backend.

SGLang imports the ``module_path`` of ``--hicache-storage-backend-extra-config`` and takes
``class_name`` from it; the launcher renders this path, and pods started before the backend moved
to :mod:`hicache_umbp.sglang.adapter` name it too. The class lives there; this alias only
re-exports it.
"""

from hicache_umbp.sglang.adapter import (
    BACKEND_NAME,
    CLASS_NAME,
    MODULE_PATH,
    UMBPHiCacheStorage,
    dynamic_extra_config,
)

__all__ = ["BACKEND_NAME", "CLASS_NAME", "MODULE_PATH", "UMBPHiCacheStorage",
           "dynamic_extra_config"]
