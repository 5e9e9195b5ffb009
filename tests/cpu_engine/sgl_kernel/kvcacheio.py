"""``sgl_kernel.kvcacheio`` on CPU: the pure-torch ops of :mod:`hicache_cpu_engine.kvcacheio`."""

from hicache_cpu_engine.kvcacheio import *  # noqa: F403
from hicache_cpu_engine.kvcacheio import OPS

__all__ = list(OPS)
