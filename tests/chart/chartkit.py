"""Helpers of the chart tier: run the real helm/checkov/hadolint binaries and parse their output.

The binaries come from ``scripts/build-chart-tools.sh`` (``make chart-tools``) under
``.cache/bin``; nothing here is faked. Functions raise with the tool's own message when a tool
fails, so a test failure shows what helm or checkov said.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "sglang-hicache-operator"
CRD_FILE = CHART / "crds" / "sglanghicaches.yaml"
BIN = ROOT / ".cache" / "bin"
RELEASE = "shc"
NAMESPACE = "sglang-hicache-system"
# kubernetes-validate ships schemas up to 1.37; the project targets 1.33 clusters.
KUBE_VERSION = "1.33.0"


def tool(name: str) -> Path:
    """Path of a chart tool; fails the test with the command that builds it when it is missing."""
    path = BIN / name
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} missing: run `make chart-tools` (scripts/build-chart-tools.sh)")
    return path


def run(args: Sequence[str | os.PathLike[str]], *, check: bool = True, cwd: Path = ROOT,
        env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=600,
        env={**os.environ, **(env or {})},
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(map(str, args))} exited {proc.returncode}\n"
            f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
        )
    return proc


def values_args(values: Mapping[str, Any] | None, tmp: Path) -> list[str]:
    if not values:
        return []
    path = tmp / "override-values.yaml"
    path.write_text(yaml.safe_dump(dict(values)))
    return ["--values", str(path)]


def helm_template(values: Mapping[str, Any] | None = None, *, include_crds: bool = False,
                  chart: Path = CHART, extra: Iterable[str] = ()) -> list[dict[str, Any]]:
    """``helm template`` with optional override values; returns the rendered objects."""
    with tempfile.TemporaryDirectory(prefix="chart-") as tmp:
        args: list[str | Path] = [
            tool("helm"), "template", RELEASE, chart, "--namespace", NAMESPACE,
            "--kube-version", KUBE_VERSION, *values_args(values, Path(tmp)), *extra]
        if include_crds:
            args.append("--include-crds")
        out = run(args).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def helm_template_error(values: Mapping[str, Any]) -> str:
    """Renders with values expected to be rejected; returns helm's error text."""
    with tempfile.TemporaryDirectory(prefix="chart-") as tmp:
        proc = run([tool("helm"), "template", RELEASE, CHART, "--namespace", NAMESPACE,
                    *values_args(values, Path(tmp))], check=False)
    assert proc.returncode != 0, f"helm accepted values it should reject: {values}"
    return proc.stderr


def by_kind(objects: Iterable[Mapping[str, Any]], kind: str) -> list[Mapping[str, Any]]:
    return [o for o in objects if o.get("kind") == kind]


def one(objects: Iterable[Mapping[str, Any]], kind: str) -> Mapping[str, Any]:
    found = by_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def rendered_operator_config(values: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The operator configuration file exactly as the chart renders it into the ConfigMap."""
    objects = helm_template(values)
    cm = next(o for o in by_kind(objects, "ConfigMap") if o["metadata"]["name"].endswith("-config"))
    config = yaml.safe_load(cm["data"]["operator.yaml"])
    assert isinstance(config, dict)
    return config


def checkov_failures(paths: Sequence[Path], framework: str,
                     allow: Mapping[str, str]) -> list[str]:
    """Runs checkov on files; returns the failed checks not in the allow-list, one line each."""
    args: list[str | os.PathLike[str]] = [tool("checkov"), "--framework", framework,
                                          "--output", "json", "--quiet", "--compact",
                                          "--skip-download"]
    for p in paths:
        args += ["--file", p]
    proc = run(args, check=False, env={"BC_SKIP_MAPPING": "TRUE", "CHECKOV_RUN_SCA_PACKAGE_SCAN_V2":
                                       "false", "LOG_LEVEL": "ERROR"})
    if proc.returncode not in (0, 1):
        raise AssertionError(f"checkov failed to run ({proc.returncode}):\n{proc.stderr[-4000:]}")
    reports = json.loads(proc.stdout) if proc.stdout.strip() else []
    if isinstance(reports, dict):
        reports = [reports]
    passed = sum(r.get("summary", {}).get("passed", 0) for r in reports)
    assert passed > 0, f"checkov ran no checks on {paths}: {proc.stdout[:2000]}"
    problems = []
    for report in reports:
        for failed in report.get("results", {}).get("failed_checks", []):
            if failed["check_id"] in allow:
                continue
            problems.append(f"{failed['check_id']} {failed['check_name']} "
                            f"({failed.get('resource')} in {failed.get('file_path')})")
    return problems
