"""Command line: ``plan`` (what the operator would create; with ``--trace``, what its cache
would hit on a trace), ``crd``, ``api-docs``, and ``config-schema``.

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
from .plan.trace_summary import TraceOptions, render_trace_report, run_trace_model
from .planner.trace_model import (
    BUILTIN_TRACES,
    MEASURED_BANDWIDTH,
    ROUTER_POLICIES,
    NoGeometry,
    TraceError,
    load_trace,
)
from .planner.trace_model.tiers import SGLANG_PREFETCH_THRESHOLD

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
    if args.trace:
        try:
            trace = load_trace(args.trace)
            opts = _trace_options(args)
        except (TraceError, ValueError) as e:
            print(f"error: --trace: {e}", file=sys.stderr)
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
        if args.trace:
            try:
                sys.stdout.write(render_trace_report(p, trace, run_trace_model(p, trace, opts)))
            except NoGeometry as e:
                print(f"error: SGLangHiCache {name}: --trace: {e}", file=sys.stderr)
                rc = 2
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


def _trace_options(args: argparse.Namespace) -> TraceOptions:
    bandwidth: dict[str, float] = {}
    for item in args.bandwidth or ():
        tier, _, value = item.partition("=")
        if tier not in MEASURED_BANDWIDTH or not value:
            raise ValueError(f"--bandwidth {item!r}: expected TIER=GBPS with TIER one of "
                             f"{', '.join(MEASURED_BANDWIDTH)}")
        gbps = float(value)
        if gbps <= 0:
            raise ValueError(f"--bandwidth {item!r}: GB/s must be > 0")
        bandwidth[tier] = gbps
    return TraceOptions(pods=args.pods, router=args.router,
                        prefill_tokens_per_s=args.prefill_tokens_per_s,
                        prefetch_threshold=args.prefetch_threshold, bandwidth=bandwidth,
                        with_curve=not args.no_curve)


def _positive(kind: type[int] | type[float]) -> Any:
    def parse(text: str) -> int | float:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value
    return parse


def _add_trace_args(p: argparse.ArgumentParser) -> None:
    t = p.add_argument_group("trace model (docs/capacity-planning.md)")
    t.add_argument("--trace", help="replay a trace through the CR's tiers: a JSONL file "
                   f"(Mooncake or hicache-trace format) or {' | '.join(BUILTIN_TRACES)}")
    t.add_argument("--pods", type=_positive(int), help="pods behind the router "
                   "(default spec.replicas)")
    t.add_argument("--router", choices=ROUTER_POLICIES,
                   help="routing policy (default the CR's router, else round_robin)")
    t.add_argument("--prefill-tokens-per-s", type=_positive(float),
                   help="one pod's prefill throughput (default 52,300: LMSYS's DeepSeek-R1)")
    t.add_argument("--prefetch-threshold", type=int, default=SGLANG_PREFETCH_THRESHOLD,
                   help="SGLang's storage prefetch threshold in tokens (default %(default)s)")
    t.add_argument("--bandwidth", action="append", metavar="TIER=GBPS",
                   help="a tier's read bandwidth (host, l3_dram, l3_ssd); repeatable")
    t.add_argument("--no-curve", action="store_true", help="skip the 0.5x/2x/4x curve")


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
    _add_trace_args(p)
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
