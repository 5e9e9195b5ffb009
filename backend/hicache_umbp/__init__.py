"""SGLang HiCache L3 backend over AMD MORI's UMBP, its host allocator and the in-pod launcher.

The core (``config``, ``keys``, ``store``, ``tiers``, ``client``, ``allocator``) imports neither
torch nor sglang; ``sglang_adapter`` is the only module that does.
"""

__version__ = "0.1.0"
