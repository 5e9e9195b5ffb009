"""Render the SGLang command line and the child's environment from what the launcher resolved.

Flag names and units are SGLang 0.5.23's (``sglang/srt/arg_groups/fields/memory.py`` and
``parallel.py``):

* ``--hicache-size`` is an integer number of **gigabytes (10^9 bytes)** per rank (the host pool
  is ``host_size * 1e9 // size_per_token`` tokens), so per-rank bytes are rounded *down* to whole
  GB, staying inside what the operator sized hugepages for;
* DP attention is ``--attn-dp-size N`` (``--dp-size N --enable-dp-attention`` is the deprecated
  spelling, scheduled for removal after 2026-12-31); plain data parallelism is ``--dp-size N``;
* our backend loads with ``--hicache-storage-backend dynamic`` and the extra-config JSON naming
  ``backend_name``/``module_path``/``class_name`` and ``interface_v1: 1`` (without it SGLang uses
  the slow per-page legacy path); SGLang's built-in one (``l3_backend`` ``sglang-mori``) with
  ``--hicache-storage-backend mori`` and what :mod:`.builtin` renders.

The server starts through ``python -m hicache_umbp.serve``, which installs the host-allocator
hook before SGLang's server main runs, so every SGLang child process allocates its host pool
through our allocator (with the built-in backend: SGLang's, with the hook's per-rank NUMA node
and hugepage-aware host-memory check).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..contract.builtin import BACKEND_FLAG_VALUE, BUILTIN_BACKEND
from ..contract.load import render_env
from ..contract.names import SERVE_MODULE, dynamic_extra_config
from ..contract.settings import BY_KEY, STORE_KEYS, LaunchConfig
from ..contract.units import GB
from .builtin import builtin_env, builtin_extra_config
from .errors import LaunchError

# Flags the launcher renders; user extra args must not repeat them (argparse keeps the last
# value silently, which would undo what the operator sized).
OWNED_FLAGS = frozenset({
    "--model-path", "--host", "--port", "--tp-size", "--tensor-parallel-size", "--dp-size",
    "--data-parallel-size", "--attn-dp-size", "--attention-data-parallel-size",
    "--enable-dp-attention", "--page-size", "--enable-hierarchical-cache", "--enable-hicache",
    "--hicache-size", "--hicache-ratio", "--hicache-mem-layout", "--hicache-write-policy",
    "--hicache-io-backend", "--hicache-storage-backend", "--hicache-storage-backend-extra-config",
})
OWNED_FLAG_PREFIXES = ("--hicache-",)
SGLANG_FLAG_ALIASES = frozenset({"--model"})  # SGLang 0.5.23's alias of --model-path


def owned_flag(arg: str) -> str | None:
    """The launcher-owned SGLang flag ``arg`` would set, or None.

    SGLang parses with argparse's default ``allow_abbrev``: ``--page-s 32`` sets --page-size and
    ``--model`` is an alias of --model-path, so aliases and unambiguous prefixes of an owned flag
    are owned too (no other SGLang 0.5.23 flag is a prefix of an owned one:
    tests/operator/test_owned_flags_sglang.py checks both against SGLang's real parser).
    """
    flag = arg.split("=", 1)[0]
    owned = OWNED_FLAGS | SGLANG_FLAG_ALIASES
    if flag in owned or flag.startswith(OWNED_FLAG_PREFIXES):
        return flag
    if flag.startswith("--") and len(flag) > 2:
        full = sorted(o for o in owned if o.startswith(flag))
        if full:
            return f"{flag} (an abbreviation of {' / '.join(full)})"
    return None


# The upstream SGLang ROCm image sets SGLANG_SET_CPU_AFFINITY=1. SGLang 0.5.23 then pins each
# scheduler to (host physical cores / TP) cores counted on the whole host, ignoring the
# container's cpuset: under the kubelet's static CPU manager a rank whose range misses the pod's
# exclusive CPUs dies with EINVAL, and under the none policy ranks land on the wrong socket.
# Off: the pod's cpuset is the kubelet's CPU placement, each rank's host pool and UMBP DRAM stay
# bound to its GPU's NUMA node by the launcher.
CPU_AFFINITY_ENV = {"SGLANG_SET_CPU_AFFINITY": "0"}


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]
    env_overrides: dict[str, str]
    extra_config: dict[str, Any]


def expected_ranks(cfg: LaunchConfig) -> int:
    """GPUs (ranks) one SGLang server of this pod drives."""
    return cfg.tp_size if cfg.enable_dp_attention else cfg.tp_size * cfg.dp_size


def _json_value(key: str, value: Any) -> Any:
    """Per-rank tuples as JSON lists; one value for every rank as a scalar (ports excepted: a
    scalar port auto-increments per rank)."""
    if not isinstance(value, tuple):
        return value
    if len(set(value)) == 1 and BY_KEY[key].kind != "rank_port":
        return value[0]
    return list(value)


def store_extra_config(cfg: LaunchConfig, resolved: Mapping[str, Any]) -> dict[str, Any]:
    """The backend's extra-config: SGLang's dynamic-backend keys, then every store key that is
    not at its default (as the store will read it), then what the launcher resolved on the node.
    """
    extra = dynamic_extra_config()
    store = cfg.store
    for key in sorted(STORE_KEYS):
        if store.sources.get(key, "default") != "default":
            extra[key] = _json_value(key, getattr(store, key))
    for key, value in resolved.items():
        extra[key] = _json_value(key, value)
    return extra


def _check_extra_args(args: tuple[str, ...]) -> None:
    clashes = sorted({flag for flag in map(owned_flag, args) if flag is not None})
    if clashes:
        raise LaunchError(
            "InvalidConfig",
            f"{BY_KEY['extra_args'].env} sets {', '.join(clashes)}, which the launcher renders "
            f"from the CR (spec.engine / spec.hiCache); remove them from spec.engine.extraArgs",
        )


def render_command(
    cfg: LaunchConfig,
    resolved: Mapping[str, Any],
    *,
    python: str = sys.executable,
) -> Command:
    """The argv to exec and the env variables to set on top of the launcher's own environment.

    ``resolved`` holds store keys the launcher decided on the node (per-rank NUMA nodes, a 4 KiB
    or posix fallback); they go both into the extra-config and into the child's env (through
    :func:`render_env`, so the host-allocator hook, which reads env, agrees with the store).
    """
    _check_extra_args(cfg.extra_args)
    if not cfg.model_path:
        raise LaunchError("InvalidConfig", f"{BY_KEY['model_path'].env} is empty: set the "
                          f"model path or id (spec.model.path)")
    argv = [python, "-m", SERVE_MODULE,
            "--model-path", cfg.model_path,
            "--host", "0.0.0.0",
            "--port", str(cfg.port),
            "--tp-size", str(cfg.tp_size)]
    if cfg.enable_dp_attention:
        if cfg.dp_size < 2:
            raise LaunchError(
                "InvalidConfig",
                f"{BY_KEY['enable_dp_attention'].env}=true needs {BY_KEY['dp_size'].env} >= 2 "
                f"(got {cfg.dp_size})")
        if cfg.tp_size % cfg.dp_size:
            raise LaunchError(
                "InvalidConfig",
                f"DP attention splits the TP group: {BY_KEY['tp_size'].env}={cfg.tp_size} must "
                f"be a multiple of {BY_KEY['dp_size'].env}={cfg.dp_size}")
        argv += ["--attn-dp-size", str(cfg.dp_size)]
    elif cfg.dp_size > 1:
        argv += ["--dp-size", str(cfg.dp_size)]
    argv += ["--page-size", str(cfg.page_size), "--enable-hierarchical-cache"]
    pools = cfg.host_pool_bytes
    if any(b > 0 for b in pools):
        env_name = BY_KEY["host_pool_bytes"].env
        if len(set(pools)) != 1:
            raise LaunchError(
                "InvalidConfig",
                f"{env_name}={','.join(map(str, pools))}: SGLang takes one --hicache-size for "
                f"every rank; give the same size per rank")
        if pools[0] < GB:
            raise LaunchError(
                "InvalidConfig",
                f"{env_name}={pools[0]} is below 1 GB (10^9 bytes), the unit of SGLang's "
                f"--hicache-size; use at least 1000000000 or a ratio")
        argv += ["--hicache-size", str(pools[0] // GB)]
    else:
        argv += ["--hicache-ratio", repr(cfg.host_pool_ratio)]
    builtin = cfg.l3_backend == BUILTIN_BACKEND
    if builtin:
        backend, extra = BACKEND_FLAG_VALUE, builtin_extra_config(cfg)
    else:
        backend, extra = "dynamic", store_extra_config(cfg, resolved)
    # SGLang pops its prefetch keys from any backend's extra-config (built-in or dynamic).
    extra.update(prefetch_threshold=cfg.prefetch_threshold,
                 prefetch_timeout_base=cfg.prefetch_timeout_base,
                 prefetch_timeout_per_ki_token=cfg.prefetch_timeout_per_ki_token)
    argv += ["--hicache-mem-layout", cfg.mem_layout,
             "--hicache-write-policy", cfg.write_policy,
             "--hicache-io-backend", cfg.io_backend,
             "--hicache-storage-prefetch-policy", cfg.prefetch_policy,
             "--hicache-storage-backend", backend,
             "--hicache-storage-backend-extra-config",
             json.dumps(extra, sort_keys=False, separators=(",", ":")),
             *cfg.extra_args]
    # The resolved HICACHE_* values reach the child either way: our store and hook read them,
    # and with the built-in backend the hook takes each rank's NUMA node from them.
    env = render_env(dict(resolved))
    if builtin:
        env.update(builtin_env(cfg, resolved))
    if cfg.enable_dp_attention:
        # SGLang never sets it; the store reads it to place DP-attention ranks in its key scheme.
        # SGLANG_DP_RANK is deliberately not set: one server process hosts every DP rank, and
        # SGLang 0.5.23 would apply a process-wide SGLANG_DP_RANK to every scheduler it spawns.
        env["SGLANG_DP_SIZE"] = str(cfg.dp_size)
    env.update(CPU_AFFINITY_ENV)
    return Command(tuple(argv), env, extra)


#: torch's JIT extension build directory (SGLang's page hash, hicache_umbp.sglang.page_hash).
EXTENSIONS_ENV = "TORCH_EXTENSIONS_DIR"


def extensions_env(cfg: LaunchConfig, env: Mapping[str, str]) -> dict[str, str]:
    """``TORCH_EXTENSIONS_DIR`` beside the launcher's report, on the pod's run volume (an
    emptyDir, which outlives container restarts), unless the container already sets it: SGLang
    JIT-compiles its page-hash extension there once per pod, and a restarted engine (a fresh
    writable layer, a fresh ``$HOME``) loads that build instead of compiling it again."""
    if env.get(EXTENSIONS_ENV):
        return {}
    return {EXTENSIONS_ENV: os.path.join(os.path.dirname(cfg.report_path) or ".",
                                         "torch-extensions")}


def shell_quote(argv: tuple[str, ...]) -> str:
    import shlex

    return " ".join(shlex.quote(a) for a in argv)
