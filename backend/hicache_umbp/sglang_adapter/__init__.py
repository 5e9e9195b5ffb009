"""``hicache_umbp.sglang_adapter``: the public load path of the storage backend.

SGLang imports the ``module_path`` of ``--hicache-storage-backend-extra-config`` and takes
``class_name`` from it (:mod:`hicache_umbp.contract.names`); the launcher renders this path, and
pods started before the adapter moved to :mod:`hicache_umbp.sglang.adapter` render it too. The
class lives there; this module only re-exports it.
"""

from hicache_umbp.sglang.adapter import UMBPHiCacheStorage

__all__ = ["UMBPHiCacheStorage"]
