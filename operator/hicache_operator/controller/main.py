"""Command line of the controller: ``python -m hicache_operator.controller [options]``.

Namespaces come from ``--namespace`` (repeatable), else from the operator configuration's
``watchNamespaces``, else all namespaces. Metrics are served on ``--metrics-port`` (0 disables)
and kopf's health endpoint on ``--liveness`` (e.g. ``http://0.0.0.0:8080/healthz``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, cast

import kopf

from ..api import OperatorConfig
from . import logs, metrics
from .settings import PEERING_NAME


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(
        prog="python -m hicache_operator.controller",
        description="Run the SGLangHiCache operator (kopf).")
    parser.add_argument("-n", "--namespace", action="append", default=[],
                        help="namespace (or glob) to watch; repeatable; default: the "
                             "configuration's watchNamespaces, else all namespaces")
    parser.add_argument("--standalone", action="store_true",
                        help="no peering: this replica is always active (single replica, dev)")
    parser.add_argument("--peering", default=PEERING_NAME,
                        help=f"KopfPeering object name for HA (default {PEERING_NAME})")
    parser.add_argument("--priority", type=int, default=None,
                        help="peering priority (default: derived from POD_NAME/hostname, "
                             "distinct per replica)")
    parser.add_argument("--liveness", default=None,
                        help="kopf health endpoint, e.g. http://0.0.0.0:8080/healthz")
    parser.add_argument("--metrics-port", type=int, default=9090,
                        help="port of the Prometheus /metrics endpoint (0 disables)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return parser


def default_priority(identity: str | None = None) -> int:
    """A stable peering priority per replica, in 1..10000.

    kopf pauses *every* operator when two peers share a priority, so the chart's two replicas
    (which both start without ``--priority``) would both stay paused; a hash of the pod name
    makes them differ (and a restarted pod keeps its priority).
    """
    name = identity or os.environ.get("POD_NAME") or socket.gethostname()
    return zlib.crc32(name.encode()) % 10000 + 1


def peering_identity(env: Mapping[str, str] | None = None) -> str | None:
    """This replica's identity among the peers: its pod's name (POD_NAME, from the downward
    API). kopf ignores its own identity in the peering object, so a restarted operator (a
    crashed container, same pod) takes over its predecessor's entry at once instead of pausing
    up to the peering lifetime (60 s) behind "another operator with the same priority". Two
    live processes never share it: a pod name is unique in its namespace, and the kubelet
    stops a container before it starts the next one. Outside a pod (no POD_NAME) kopf makes a
    unique identity per process (so two operators on one host still pause each other)."""
    env = os.environ if env is None else env
    return env.get("POD_NAME") or None


def run(args: argparse.Namespace) -> int:
    from . import handlers  # noqa: F401  (registers the handlers with kopf)

    config = OperatorConfig.from_env()
    namespaces = list(args.namespace) or list(config.watch_namespaces)
    logs.setup(config.log_level, verbose=args.verbose)
    metrics.serve(args.metrics_port)
    identity = peering_identity()
    asyncio.run(kopf.operator(
        standalone=args.standalone,
        peering_name=None if args.standalone else args.peering,
        identity=cast(Any, identity),  # kopf's Identity is a NewType of str
        priority=args.priority if args.priority is not None else default_priority(),
        liveness_endpoint=args.liveness,
        clusterwide=not namespaces,
        namespaces=namespaces,
    ))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))
