"""SGLang general plugin (entry point group ``sglang.srt.plugins``) for HiCache on CPU.

SGLang 0.5.23 loads general plugins in every process it starts, before a host pool exists, so
these fixes reach the scheduler processes of a real ``sglang.launch_server`` without editing
SGLang. Active only when SGLang runs in CPU mode (``SGLANG_USE_CPU_ENGINE=1``): a GPU build with
this package installed by mistake is left untouched.

1. Host pools are built with ``pin_memory=False``. SGLang pins host pools with
   ``cudaHostRegister`` (``Found no NVIDIA driver`` on CPU) and allocates its flat legacy pages
   with ``pin_memory=self.pin_memory``.
2. Parallel groups never open PyNccl (CUDA only): with TP > 1 the CPU paths of SGLang's
   GroupCoordinator reduce over gloo.
3. ``pool_host/mha.py`` and ``mla.py`` bind the ``sgl_kernel.kvcacheio`` transfer ops only on
   CUDA/HIP/XPU, so the first device<->host copy on CPU is a ``NameError``; the pure-torch ops of
   :mod:`hicache_cpu_engine.kvcacheio` are put into those modules' namespaces.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

HOST_POOL_INIT = "sglang.srt.mem_cache.pool_host.base.HostKVCache.__init__"
PARALLEL_GROUP = "sglang.srt.distributed.parallel_state.init_model_parallel_group"
POOL_MODULES = ("sglang.srt.mem_cache.pool_host.mha", "sglang.srt.mem_cache.pool_host.mla")

_applied = False


def cpu_mode() -> bool:
    return os.environ.get("SGLANG_USE_CPU_ENGINE", "").strip().lower() in ("1", "true", "yes")


def plugin() -> None:
    global _applied
    if _applied or not cpu_mode():
        return
    import importlib

    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from . import kvcacheio, l3trace, tail_attention

    for name in POOL_MODULES:
        module = importlib.import_module(name)
        for op in kvcacheio.OPS:
            if not hasattr(module, op):
                setattr(module, op, getattr(kvcacheio, op))
    HookRegistry.register(HOST_POOL_INIT, _unpinned_host_pool, HookType.AROUND)
    HookRegistry.register(PARALLEL_GROUP, _gloo_only_group, HookType.AROUND)
    l3trace.register(HookRegistry, HookType.AROUND)  # only with CPU_ENGINE_L3_TRACE set
    tail_attention.register(HookRegistry, HookType.AROUND)  # only with CPU_ENGINE_TAIL_ATTENTION=1
    HookRegistry.apply_hooks()
    _applied = True
    log.info("hicache_cpu_engine: CPU HiCache support active (unpinned host pools, torch KV ops)")


def _gloo_only_group(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    # TP > 1 on CPU: SGLang would open a PyNccl communicator (CUDA only) for every group; the
    # CPU paths of GroupCoordinator then use torch.distributed over gloo.
    bound = inspect.signature(original).bind(*args, **kwargs)
    bound.arguments["use_pynccl"] = False
    bound.arguments["use_custom_allreduce"] = False
    return original(*bound.args, **bound.kwargs)


def _unpinned_host_pool(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    bound = inspect.signature(original).bind(*args, **kwargs)
    bound.arguments["pin_memory"] = False
    return original(*bound.args, **bound.kwargs)
