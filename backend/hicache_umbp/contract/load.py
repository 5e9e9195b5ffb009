"""Loading the env contract (extra-config over ``HICACHE_*`` over defaults, every problem at
once) and rendering it back, for the store, the launcher and the operator.

The rules of each setting are in :mod:`.settings`; :func:`render_env` writes values the way
:func:`load_launch_config` reads them, which is how the operator checks what it renders.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from .builtin import (
    BUILTIN_BACKEND,
    DISTRIBUTED_REFUSAL,
    PREFAULT_THREADS_REFUSAL,
    SSD_REFUSAL,
)
from .media import l3_media, no_l3_tier
from .parsing import closest
from .settings import (
    BY_ENV,
    BY_KEY,
    ENV_PREFIX,
    SETTINGS,
    SGLANG_EXTRA_CONFIG_KEYS,
    STORE_KEYS,
    ConfigError,
    LaunchConfig,
    Setting,
    StoreConfig,
    ssd_dirs_of,
)
from .values import parse_value


def _gather(
    extra: Mapping[str, Any] | None,
    env: Mapping[str, str] | None,
    scopes: frozenset[str],
    problems: list[str],
    shadowed: dict[str, tuple[str, Any]] | None = None,
) -> dict[str, tuple[str, Any]]:
    """Raw values by key with the label of the source that won (extra-config over env).

    Env values that extra-config overrides go to ``shadowed``: they are still checked, so a
    broken variable is reported even while the extra-config hides it (it would surface the
    day the extra-config key is removed).
    """
    raw: dict[str, tuple[str, Any]] = {}
    for name, value in (env or {}).items():
        if not name.startswith(ENV_PREFIX):
            continue
        s = BY_ENV.get(name)
        if s is None:
            problems.append(f"unknown variable {name}{closest(name, BY_ENV)}")
        elif s.scope in scopes:
            raw[s.key] = (name, value)
    for key, value in (extra or {}).items():
        if key in SGLANG_EXTRA_CONFIG_KEYS:
            continue
        s = BY_KEY.get(key)
        if s is None or s.scope not in scopes:
            valid = [k for k, v in BY_KEY.items() if v.scope in scopes]
            problems.append(f"unknown extra-config key {key!r}{closest(key, valid)}")
        else:
            if shadowed is not None and key in raw:
                shadowed[key] = raw[key]
            raw[key] = (f"extra-config {key!r}", value)
    return raw


def _check_shadowed(
    shadowed: dict[str, tuple[str, Any]], ranks: int, problems: list[str]
) -> None:
    for key, (label, value) in shadowed.items():
        try:
            parse_value(BY_KEY[key], label, value, ranks)
        except ValueError as e:
            problems.append(f"{e} (extra-config {key!r} overrides it; fix or unset {label})")


def _resolve(
    raw: dict[str, tuple[str, Any]], scopes: frozenset[str], problems: list[str]
) -> tuple[dict[str, Any], dict[str, str]]:
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    ranks_setting = BY_KEY["umbp_local_ranks"]
    ranks = ranks_setting.default
    if "umbp_local_ranks" in raw:
        label, v = raw["umbp_local_ranks"]
        try:
            ranks = parse_value(ranks_setting, label, v, 1)
        except ValueError as e:
            problems.append(str(e))
    mode = BY_KEY["umbp_mode"].default
    if "umbp_mode" in raw:
        label, v = raw["umbp_mode"]
        try:
            mode = parse_value(BY_KEY["umbp_mode"], label, v, 1)
        except ValueError as e:
            problems.append(str(e))
    for s in SETTINGS:
        if s.scope not in scopes:
            continue
        if s.key in ("umbp_local_ranks", "umbp_mode"):  # parsed above: one error, not two
            sources[s.key] = raw[s.key][0] if s.key in raw else "default"
            continue
        if s.key in raw:
            label, v = raw[s.key]
            if mode not in s.modes:
                problems.append(
                    f"{label} only applies in umbp_mode {'/'.join(sorted(s.modes))}, "
                    f"not {mode!r}; remove it"
                )
                v = s.default
                label = "default"
            sources[s.key] = label
        else:
            label, v = "default", s.default
            sources[s.key] = "default"
        try:
            values[s.key] = parse_value(s, label if label != "default" else s.key, v, ranks)
        except ValueError as e:
            problems.append(str(e))
    values["umbp_local_ranks"] = ranks
    values["umbp_mode"] = mode
    return values, sources


def _store_rules(v: dict[str, Any], problems: list[str]) -> None:
    mode = v.get("umbp_mode")
    engine = v.get("umbp_ssd_engine", "hicache")
    in_process = mode == "embedded" or (mode == "standalone" and engine == "hicache")
    if in_process and v.get("umbp_ssd_enabled"):
        if not v.get("umbp_ssd_dir"):
            problems.append("umbp_ssd_enabled is true but umbp_ssd_dir is empty")
        if any(b <= 0 for b in v.get("umbp_ssd_bytes", (1,))):
            problems.append("umbp_ssd_enabled is true but umbp_ssd_bytes is 0 for some rank")
    dirs = ssd_dirs_of(v.get("umbp_ssd_dir") or "")
    if engine == "mori" and len(dirs) > 1:
        s = BY_KEY["umbp_ssd_dir"]
        problems.append(f"{s.key} ({s.env}) names {len(dirs)} directories, but "
                        "umbp_ssd_engine=mori stores in one (mori's SSD node takes one "
                        "storage directory); use umbp_ssd_engine=hicache for several drives")
    if mode == "standalone" and engine == "mori" and dirs:
        problems.append("umbp_ssd_dir is set with umbp_mode=standalone and umbp_ssd_engine=mori: "
                        "the umbp-ssd sidecar holds that SSD tier, not the engine")
    if mode == "embedded" and any(
            not l3_media(mode, dram=b > 0, ssd=bool(v.get("umbp_ssd_enabled")))
            for b in v.get("umbp_dram_bytes", (1,))):
        problems.append(no_l3_tier(dram="umbp_dram_bytes of every rank",
                                   ssd="umbp_ssd_enabled (with umbp_ssd_dir, umbp_ssd_bytes)"))
    if v.get("l3_backend") == BUILTIN_BACKEND:
        _builtin_rules(v, problems)
    if mode == "distributed" and not v.get("umbp_master_address"):
        problems.append(
            "umbp_mode distributed needs umbp_master_address (host:port of umbp_master)"
        )


def _builtin_rules(v: dict[str, Any], problems: list[str]) -> None:
    """What SGLang's built-in backend cannot do on mori 1.2.4, in :mod:`.builtin`'s words."""
    backend = f"{BY_KEY['l3_backend'].env}={BUILTIN_BACKEND}"
    if v.get("umbp_ssd_enabled"):
        problems.append(f"{BY_KEY['umbp_ssd_enabled'].env}=true with {backend}: {SSD_REFUSAL}")
    if v.get("umbp_mode") == "distributed":
        problems.append(f"umbp_mode distributed with {backend}: {DISTRIBUTED_REFUSAL}")
    if v.get("host_prefault_threads"):
        problems.append(
            f"{BY_KEY['host_prefault_threads'].env}={v['host_prefault_threads']} with {backend}: "
            f"{PREFAULT_THREADS_REFUSAL}")


def load_store_config(
    extra: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None
) -> StoreConfig:
    """Build the store configuration (extra-config over env over defaults).

    ``env`` defaults to ``os.environ``; pass ``{}`` to ignore the environment. Variables of the
    launcher scope are known (not "unknown") but not part of the store configuration.
    """
    env = os.environ if env is None else env
    problems: list[str] = []
    shadowed: dict[str, tuple[str, Any]] = {}
    raw = _gather(extra, env, frozenset({"store"}), problems, shadowed)
    values, sources = _resolve(raw, frozenset({"store"}), problems)
    _check_shadowed(shadowed, values["umbp_local_ranks"], problems)
    if not problems:
        _store_rules(values, problems)
    if problems:
        raise ConfigError(problems)
    return StoreConfig(**values, sources=sources)


def load_launch_config(env: Mapping[str, str] | None = None) -> LaunchConfig:
    """The launcher reads everything from the environment (the operator renders it)."""
    env = os.environ if env is None else env
    problems: list[str] = []
    raw = _gather(None, env, frozenset({"store", "launch"}), problems)
    values, sources = _resolve(raw, frozenset({"store", "launch"}), problems)
    extra_args: tuple[str, ...] = ()
    if "extra_args" in values:
        try:
            parsed = json.loads(values["extra_args"])
            if not isinstance(parsed, list) or not all(isinstance(a, str) for a in parsed):
                raise ValueError
            extra_args = tuple(parsed)
        except ValueError:
            env_name = BY_KEY["extra_args"].env
            problems.append(f"{env_name}={values['extra_args']!r} must be a JSON list of strings")
    if not problems:
        _store_rules(values, problems)
    if problems:
        raise ConfigError(problems)
    store_values = {k: v for k, v in values.items() if k in STORE_KEYS}
    launch_values = {k: v for k, v in values.items() if k not in STORE_KEYS}
    launch_values["extra_args"] = extra_args
    store = StoreConfig(**store_values, sources={k: sources[k] for k in STORE_KEYS})
    return LaunchConfig(store=store, **launch_values)


# ----------------------------------------------------------------------------- rendering


def render_value(s: Setting, value: Any) -> str:
    """The string form of ``value`` that :func:`parse_value` reads back (plain integers)."""
    if s.kind == "bool":
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(str(int(v)) for v in value)
    if s.kind == "float":
        return repr(float(value))
    return str(value)


def render_env(values: Mapping[str, Any]) -> dict[str, str]:
    """Environment variables for the given keys, validated by parsing them back.

    The operator uses this so that what it renders is exactly what the pod will accept; a value
    the pod would reject raises :class:`ConfigError` here, at plan time.
    """
    problems: list[str] = []
    out: dict[str, str] = {}
    for key, value in values.items():
        s = BY_KEY.get(key)
        if s is None:
            problems.append(f"unknown key {key!r}{closest(key, BY_KEY)}")
            continue
        out[s.env] = render_value(s, value)
    if problems:
        raise ConfigError(problems)
    return out
