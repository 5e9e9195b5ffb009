"""The ``run`` subcommand of ``python -m hicache_operator`` (registered by ``cli.EXTENSIONS``)."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    from .controller.main import build_parser, run

    parser: argparse.ArgumentParser = subparsers.add_parser(
        "run", help="run the operator (kopf) against the cluster in the kubeconfig/service account")
    build_parser(parser)
    parser.set_defaults(func=run)
