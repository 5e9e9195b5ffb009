"""``hicache_umbp.sglang_hook``: the public name of the host-allocator hook.

The ``sglang.srt.plugins`` entry point (``hicache_umbp.sglang_hook:plugin``, pyproject.toml) names
it, and so does the metadata of every environment installed before the hook moved to
:mod:`hicache_umbp.sglang.hook`. The hook lives there; this alias only re-exports its entry.
"""

from hicache_umbp.sglang.hook import install, plugin

__all__ = ["install", "plugin"]
