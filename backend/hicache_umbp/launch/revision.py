"""Engine configuration revisions: how a running pod takes a new configuration in place.

With ``updateStrategy: InPlaceIfPossible`` the operator cannot change a running pod's env (a
Pod's ``env``/``envFrom`` are immutable), so the pod's configuration is chosen at each engine
container start instead:

- the ConfigMap holds one key per live revision, ``HICACHE_CONFIG_<revision>``: a JSON object
  of the engine's environment (the ``HICACHE_*`` settings and the user's literal env), loaded
  with ``envFrom``; the kubelet resolves ``envFrom`` again at every container start;
- the pod's annotation ``hicache.sglang.ai/config-hash`` names the revision the pod runs; the
  engine container reads it through ``HICACHE_CONFIG_REVISION`` (``valueFrom.fieldRef``
  ``metadata.annotations['hicache.sglang.ai/config-hash']``, also resolved at every start);
- pod annotations are mutable: the operator patches the annotation (and the engine image, for
  an image change, which makes the kubelet restart the container at once);
- a config-only change restarts nothing by itself, so the launcher leaves a watcher behind when
  it execs SGLang: it reads the pod's annotations from a downward API volume (the kubelet
  rewrites that file when the annotations change; conformance test "Downward API volume should
  update annotations on modification") and, when the revision differs from the one this
  container started with, stops the engine (SIGTERM, as the kubelet's own stop does); the
  kubelet restarts the container (``restartPolicy: Always``) and the new one starts on the new
  revision. The sidecars, volumes, hugepages and the pod itself are untouched.

:func:`select_revision` turns the container's environment into the plain ``HICACHE_*``
environment the rest of the launcher reads (the revision keys are removed). Without
``HICACHE_CONFIG_REVISION`` (every other update strategy) the environment is used as it is.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping

from ..contract.paths import ANNOTATIONS_FILE, POD_INFO_DIR
from ..contract.revisions import (
    CONFIG_ANNOTATION,
    CONFIG_KEY_PREFIX,
    CONFIG_REVISION_ENV,
    RESTARTED_AT_ANNOTATION,
    config_key,
    is_revision_variable,
)
from ..drain import drain, read_metrics, wait_l3_caught_up
from .errors import LaunchError
from .noderoot import NodeRoot

log = logging.getLogger("hicache_umbp.launch")

__all__ = ["ANNOTATIONS_FILE", "CONFIG_ANNOTATION", "CONFIG_KEY_PREFIX", "CONFIG_REVISION_ENV",
           "POD_INFO_DIR", "annotated_revision", "config_key", "parse_annotations",
           "restart_requested", "select_revision", "start_watcher", "watch_revision"]

#: How often the watcher reads the annotations file.
WATCH_INTERVAL_S = 1.0
#: Before it stops the engine the watcher lets the requests in flight finish, as the preStop
#: hook does before a kubelet's SIGTERM (``hicache_umbp.drain``, the same timeout as the hook's:
#: ``planner.pod_overhead.DRAIN_TIMEOUT_S``); the pod is not terminating, so there is no
#: endpoint delay. Standalone, it then waits for L3 (``drain.L3_CATCH_UP_TIMEOUT_S`` at most).
STOP_DRAIN_TIMEOUT_S = 300.0
#: Then SIGTERM, and SIGKILL after this (SGLang's stop releases its host pool meanwhile) unless
#: the pod says otherwise: the operator renders ``HICACHE_ENGINE_STOP_GRACE_S`` from the pools
#: (``planner.pod_overhead.engine_stop_grace_seconds``, the share of the pod's grace period the
#: kubelet allows after its own drain), so both stops give the engine the same time.
STOP_GRACE_S = 110.0


def select_revision(env: Mapping[str, str]) -> tuple[dict[str, str], str | None]:
    """(the environment of the revision the pod runs, that revision or None).

    Raises :class:`LaunchError` (``InvalidConfig``) when the ConfigMap has no such revision or
    its value is not a JSON object of strings.
    """
    plain = {k: v for k, v in env.items() if not is_revision_variable(k)}
    revision = env.get(CONFIG_REVISION_ENV)
    if revision is None:
        return plain, None
    known = sorted(k[len(CONFIG_KEY_PREFIX):] for k in env
                   if k.startswith(CONFIG_KEY_PREFIX) and k != CONFIG_REVISION_ENV)
    if not revision:
        raise LaunchError("InvalidConfig", f"{CONFIG_REVISION_ENV} is empty: the pod has no "
                          f"{CONFIG_ANNOTATION} annotation (ConfigMap revisions: {known})")
    raw = env.get(config_key(revision))
    if raw is None:
        raise LaunchError("InvalidConfig", f"the pod runs configuration revision {revision} "
                          f"({CONFIG_ANNOTATION}) but the ConfigMap has no "
                          f"{config_key(revision)}; it holds {known or 'none'}")
    try:
        values = json.loads(raw)
    except ValueError as e:
        raise LaunchError("InvalidConfig", f"{config_key(revision)} is not JSON: {e}") from e
    if not isinstance(values, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in values.items()):
        raise LaunchError("InvalidConfig",
                          f"{config_key(revision)} must be a JSON object of strings")
    bad = sorted(k for k in values if is_revision_variable(k))
    if bad:
        raise LaunchError("InvalidConfig", f"{config_key(revision)} may not set {bad}")
    return {**plain, **values}, revision


def parse_annotations(text: str) -> dict[str, str]:
    """A downward API ``metadata.annotations`` file: ``key="value"`` lines (Go ``%q``)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, quoted = line.partition("=")
        if not sep:
            continue
        value = quoted
        if len(quoted) >= 2 and quoted[0] == quoted[-1] == '"':
            try:
                value = json.loads(quoted)
            except ValueError:
                value = quoted[1:-1]
        out[key] = value
    return out


def annotated_revision(root: NodeRoot, path: str = ANNOTATIONS_FILE) -> str | None:
    """The revision the pod's annotation names now (None: no file or no annotation)."""
    text = root.read_text(path)
    return None if text is None else parse_annotations(text).get(CONFIG_ANNOTATION)


def restart_requested(root: NodeRoot, path: str = ANNOTATIONS_FILE) -> str:
    """The pod's ``kubectl.kubernetes.io/restartedAt`` annotation now ("" when none)."""
    text = root.read_text(path)
    return "" if text is None else parse_annotations(text).get(RESTARTED_AT_ANNOTATION, "")


def watch_revision(root: NodeRoot, started: str, engine_pid: int, *,
                   path: str = ANNOTATIONS_FILE, interval_s: float = WATCH_INTERVAL_S,
                   grace_s: float = STOP_GRACE_S,
                   alive: Callable[[int], bool] | None = None,
                   kill: Callable[[int, int], None] = os.kill,
                   sleep: Callable[[float], None] = time.sleep,
                   drain_first: Callable[[], tuple[bool, str]] | None = None,
                   restarted_at: str | None = None) -> str:
    """Wait until the pod's annotation names another revision than ``started`` (or, given
    ``restarted_at``, its ``restartedAt`` annotation differs from it: ``kubectl rollout
    restart`` carried in place by the operator), then stop the engine: ``drain_first`` (the
    requests in flight finish), SIGTERM, SIGKILL after ``grace_s``. Returns the revision, or
    ``""`` when the engine ended first. A missing file or annotation is not a change (a volume
    being updated is replaced atomically, so a read never sees half a file)."""
    def running(pid: int) -> bool:
        # The engine is this watcher's parent: once it ends the watcher is re-parented (an
        # ended engine's pid may linger as a zombie, so kill(pid, 0) would not tell).
        return alive(pid) if alive is not None else os.getppid() == pid

    while True:
        if not running(engine_pid):
            return ""
        now = annotated_revision(root, path)
        if now and now != started:
            break
        if restarted_at is not None and now and \
                restart_requested(root, path) not in ("", restarted_at):
            log.warning("restart requested (%s: %s)", RESTARTED_AT_ANNOTATION,
                        restart_requested(root, path))
            break
        sleep(interval_s)
    log.warning("configuration revision changed from %s to %s (%s): stopping the engine so "
                "the kubelet restarts it on the new revision", started, now, CONFIG_ANNOTATION)
    if drain_first is not None:
        _, message = drain_first()
        log.warning("%s", message)
    kill(engine_pid, signal.SIGTERM)
    waited = 0.0
    while running(engine_pid) and waited < grace_s:
        sleep(interval_s)
        waited += interval_s
    if running(engine_pid):
        log.warning("the engine did not stop within %.0f s of SIGTERM: SIGKILL", grace_s)
        kill(engine_pid, signal.SIGKILL)
    return now


def start_watcher(root: NodeRoot, started: str, path: str = ANNOTATIONS_FILE, *,
                  port: int | None = None, wait_l3: bool = False,
                  grace_s: float = STOP_GRACE_S) -> int | None:
    """Fork the watcher for the process about to exec the engine (this process's pid is the
    engine's after ``execve``); with ``port`` (the engine's HTTP port) it drains the engine
    before stopping it, and with ``wait_l3`` (standalone: the sidecars keep L3 for the
    restarted engine) lets L3 take what is still queued from the host pool. Returns the
    watcher's pid in the parent; never returns in the child. None when the pod has no
    annotations file (no downward API volume mounted)."""
    if not root.exists(path):
        log.warning("%s is missing: a new configuration revision will not restart the "
                    "engine by itself", path)
        return None
    engine_pid = os.getpid()
    restarted_at = restart_requested(root, path)
    pid = os.fork()
    if pid:
        return pid
    code = 0
    def drain_engine() -> tuple[bool, str]:
        # Unlike a deleted pod's, this engine's sidecars stay: what they hold is what the
        # restarted engine finds, so the pages still queued for L3 get there first.
        base = f"http://127.0.0.1:{port}"
        drained, message = drain(base, STOP_DRAIN_TIMEOUT_S, 0.0, fetch=read_metrics)
        if not wait_l3:
            return drained, message
        caught_up, l3_message = wait_l3_caught_up(base)
        return drained and caught_up, f"{message}; {l3_message}"

    try:  # the child: never return into the launcher
        watch_revision(root, started, engine_pid, path=path, grace_s=grace_s,
                       drain_first=drain_engine if port is not None else None,
                       restarted_at=restarted_at)
    except BaseException:
        log.exception("the configuration watcher failed")
        code = 1
    finally:
        sys.stderr.flush()
        os._exit(code)
