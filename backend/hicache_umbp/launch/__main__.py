"""``python -m hicache_umbp.launch``: the engine container's command (see docs/launcher.md)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Mapping, Sequence

from ..contract.settings import BY_KEY
from .command import shell_quote
from .errors import LaunchError
from .noderoot import NodeRoot
from .report import new_report, write_report
from .revision import select_revision, start_watcher
from .run import LaunchPlan, plan_launch

log = logging.getLogger("hicache_umbp.launch")

# The environment shown by --dry-run: what configures the engine, never the whole environment
# (which may hold credentials).
SHOWN_ENV_PREFIXES = ("HICACHE_", "SGLANG_", "UMBP_", "HIP_VISIBLE_DEVICES",
                      "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m hicache_umbp.launch",
        description="Probe the node (GPUs, NUMA, hugepages, SSD, sidecars), then exec SGLang "
                    "with the UMBP HiCache backend. Configuration comes from HICACHE_* "
                    "environment variables (the operator renders them).")
    p.add_argument("--dry-run", action="store_true",
                   help="run every check, print the command and environment, do not exec")
    p.add_argument("--node-root", default="/", metavar="DIR",
                   help="read sysfs/procfs/cgroup/dev and the SSD mount under DIR (tests)")
    p.add_argument("--json", action="store_true",
                   help="with --dry-run: print one JSON object (argv, env, report)")
    return p


def shown_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(env.items()) if k.startswith(SHOWN_ENV_PREFIXES)}


def _print_dry_run(plan: LaunchPlan, as_json: bool) -> None:
    env = shown_env(plan.child_env)
    if as_json:
        print(json.dumps({"argv": list(plan.command.argv), "env": env, "report": plan.report},
                         sort_keys=True))
        return
    print("# command")
    print(shell_quote(plan.command.argv))
    print("# environment (engine settings only; * = set by the launcher)")
    for k, v in env.items():
        mark = "*" if k in plan.command.env_overrides else " "
        print(f"{mark} {k}={v}")


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    args = _parser().parse_args(argv)
    env = dict(os.environ if env is None else env)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="hicache-launch: %(message)s")
    root = NodeRoot(args.node_root)
    report = new_report(args.dry_run)
    report_path = env.get(BY_KEY["report_path"].env) or str(BY_KEY["report_path"].default)
    revision = None
    try:
        env, revision = select_revision(env)
        report_path = env.get(BY_KEY["report_path"].env) or report_path
        if revision is not None:
            report["config_revision"] = revision
            log.info("configuration revision %s", revision)
        plan = plan_launch(env, root, dry_run=args.dry_run, report=report)
    except LaunchError as e:
        report["reason"], report["error"] = e.reason, str(e)
        log.error("error [%s]: %s", e.reason, e)
        if not args.dry_run:
            try:
                write_report(root, report_path, report)
            except OSError as w:
                log.error("could not write the report to %s: %s", report_path, w)
        return 1
    if args.dry_run:
        _print_dry_run(plan, args.json)
        return 0
    path = write_report(root, plan.config.report_path, plan.report)
    log.info("report: %s; exec SGLang", path)
    sys.stdout.flush()
    sys.stderr.flush()
    if revision is not None:
        # restarts the engine (after a drain) when the pod's revision changes
        start_watcher(root, revision, port=plan.config.port,
                      wait_l3=plan.config.store.umbp_mode == "standalone",
                      grace_s=plan.config.engine_stop_grace_s)
    os.execve(plan.command.argv[0], list(plan.command.argv), plan.child_env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
