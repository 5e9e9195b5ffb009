"""Command line: ``plan`` (what the operator would create), ``crd``, ``api-docs``, and
``config-schema``.

Other modules add subcommands (the kopf ``run`` entry) without editing this file: every module
named in :data:`EXTENSIONS` that exists is imported and its ``register(subparsers)`` called.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from .api.config import NodeFacts, OperatorConfig, OperatorConfigError, dump_schema
from .api.crd import crd_yaml
from .api.docs import render_api_doc
from .plan import SpecError, plan, render_summary

EXTENSIONS = ("hicache_operator.run_cli",)


def _load_yaml(path: str) -> Any:
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    return yaml.safe_load(text)


def _write(text: str, output: str | None) -> None:
    if output:
        Path(output).write_text(text)
    else:
        sys.stdout.write(text)


def _cmd_plan(args: argparse.Namespace) -> int:
    try:
        config = OperatorConfig.from_file(args.config) if args.config else OperatorConfig.from_env()
        facts = None
        if args.node_facts:
            facts = NodeFacts.from_mapping(
                _load_yaml(args.node_facts) or {}, source=args.node_facts
            )
        docs = [
            d
            for d in yaml.safe_load_all(
                sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
            )
            if d
        ]
    except (OSError, yaml.YAMLError, OperatorConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not docs:
        print(f"error: {args.file} holds no CR", file=sys.stderr)
        return 2
    rc = 0
    for doc in docs:
        name = (doc.get("metadata") or {}).get("name", "?") if isinstance(doc, dict) else "?"
        try:
            p = plan(doc, config, facts)
        except SpecError as e:
            print(
                f"error: SGLangHiCache {name} is invalid ({len(e.problems)} problem(s)):",
                file=sys.stderr,
            )
            for path, message in e.problems:
                print(f"  {path}: {message}", file=sys.stderr)
            rc = 1
            continue
        if args.output == "yaml":
            sys.stdout.write(p.manifests_yaml())
        elif args.output == "json":
            sys.stdout.write(
                json.dumps({"objects": p.objects, "plan": p.status_plan}, indent=2) + "\n"
            )
        else:
            sys.stdout.write(render_summary(p))
    return rc


def _cmd_crd(args: argparse.Namespace) -> int:
    _write(crd_yaml(), args.output)
    return 0


def _cmd_api_docs(args: argparse.Namespace) -> int:
    _write(render_api_doc(), args.output)
    return 0


def _cmd_config_schema(args: argparse.Namespace) -> int:
    _write(dump_schema(), args.output)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hicache_operator", description="SGLangHiCache operator"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="show what the operator would create for a CR")
    p.add_argument("-f", "--file", required=True, help="CR YAML file ('-' for stdin)")
    p.add_argument("--node-facts", help="YAML file with node facts (NodeFacts fields)")
    p.add_argument(
        "--config",
        help="operator configuration file (default: "
        "$SGLANG_HICACHE_OPERATOR_CONFIG, else built-in defaults)",
    )
    p.add_argument("-o", "--output", choices=("summary", "yaml", "json"), default="summary")
    p.set_defaults(func=_cmd_plan)
    c = sub.add_parser("crd", help="print the generated CustomResourceDefinition")
    c.add_argument("-o", "--output", help="write to this file instead of stdout")
    c.set_defaults(func=_cmd_crd)
    d = sub.add_parser("api-docs", help="print the CR reference (docs/api.md)")
    d.add_argument("-o", "--output", help="write to this file instead of stdout")
    d.set_defaults(func=_cmd_api_docs)
    s = sub.add_parser("config-schema", help="print the operator configuration JSON schema")
    s.add_argument("-o", "--output", help="write to this file instead of stdout")
    s.set_defaults(func=_cmd_config_schema)
    for module_name in EXTENSIONS:
        if importlib.util.find_spec(module_name) is not None:
            importlib.import_module(module_name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))
