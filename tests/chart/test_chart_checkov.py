"""checkov on the rendered chart and on the engine pods the operator generates.

Real: checkov 3.3.30 (PyPI), helm, and the operator's planner (``hicache_operator.planner``)
with the operator configuration exactly as the chart renders it. Zero failed checks are allowed
except those in ``checkov_allowlist.yaml``, each with its reason; an allow-list entry that no
longer fails anywhere fails the test (it would hide a regression).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from chartkit import ROOT, checkov_failures, helm_template, rendered_operator_config

pytestmark = pytest.mark.chart

ALLOW: dict[str, dict[str, str]] = yaml.safe_load(
    (Path(__file__).with_name("checkov_allowlist.yaml")).read_text())
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))

# Representative CRs of our own, so the engine-pod scan covers both L3 modes and every SSD
# volume kind even before/independently of examples/.
OWN_CRS: list[dict[str, Any]] = [
    {"apiVersion": "hicache.sglang.ai/v1alpha1", "kind": "SGLangHiCache",
     "metadata": {"name": "standalone-emptydir", "namespace": "models"},
     "spec": {"model": {"path": "/models/llama"}, "engine": {"tensorParallelSize": 1},
              "hiCache": {"hostPoolPerRank": "16Gi"},
              "l3": {"mode": "standalone", "dram": {"capacity": "32Gi"},
                     "ssd": {"enabled": True, "capacity": "100Gi",
                             "volume": {"emptyDir": {"sizeLimit": "200Gi"}}}}}},
    {"apiVersion": "hicache.sglang.ai/v1alpha1", "kind": "SGLangHiCache",
     "metadata": {"name": "embedded-pvc", "namespace": "models"},
     "spec": {"model": {"path": "deepseek-ai/DeepSeek-R1"},
              "engine": {"tensorParallelSize": 8},
              "hiCache": {"hostPoolPerRank": "32Gi"},
              "l3": {"mode": "embedded", "dram": {"capacity": "128Gi"},
                     "ssd": {"enabled": True, "capacity": "3Ti", "volume": {
                         "claimTemplate": {"storageClassName": "local-nvme",
                                           "size": "3500Gi"}}}}}},
]


def _scan_chart(tmp_path: Path, name: str, values: dict[str, Any]) -> tuple[list[str], set[str]]:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump_all(helm_template(values)))
    failed = checkov_failures([path], "kubernetes", allow={})
    return [f for f in failed if f.split()[0] not in ALLOW["chart"]], {f.split()[0] for f in failed}


def test_rendered_chart_passes_checkov(tmp_path: Path) -> None:
    unexpected, failed = _scan_chart(tmp_path, "defaults", {})
    assert unexpected == []
    stale = set(ALLOW["chart"]) - failed
    assert not stale, f"stale allow-list entries: {stale}"
    # the exceptions are defaults an admin can change: hardened values leave only the token
    hardened = {"image": {"digest": "sha256:" + "0" * 64, "pullPolicy": "Always"},
                "networkPolicy": {"enabled": True}}
    unexpected, failed = _scan_chart(tmp_path, "hardened", hardened)
    assert unexpected == [] and failed == {"CKV_K8S_38"}


def _engine_crs() -> list[dict[str, Any]]:
    crs = list(OWN_CRS)
    for path in EXAMPLES:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                # applied with `kubectl apply -n <namespace>` as NOTES.txt says
                doc["metadata"].setdefault("namespace", "models")
                crs.append(doc)
    return crs


def test_generated_engine_pods_pass_checkov(tmp_path: Path) -> None:
    from hicache_operator.api.config import OperatorConfig
    from hicache_operator.plan.orchestrate import plan

    config = OperatorConfig.from_mapping(rendered_operator_config(), source="chart")
    files = []
    for cr in _engine_crs():
        objects = plan(cr, config).objects
        assert any(o["kind"] == "StatefulSet" for o in objects)
        path = tmp_path / f"{cr['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump_all(objects))
        files.append(path)
    failed = checkov_failures(files, "kubernetes", allow={})
    ids = {f.split()[0] for f in failed}
    assert [f for f in failed if f.split()[0] not in ALLOW["engine_pods"]] == []
    assert ids == set(ALLOW["engine_pods"]), \
        f"stale allow-list entries: {set(ALLOW['engine_pods']) - ids}"

