"""The chart's monitoring objects: PodMonitors, the PrometheusRule and the Grafana dashboard.

Real: helm's rendering, Debian's promtool 2.42 (``make router-env``): ``promtool check rules``
on the rendered groups and ``promtool test rules`` (``monitoring/rules-test.yaml``: each alert
fires on the series that mean it and not before its ``for``). That the queries return series
from real engines and a real router is the pod tier's (``tests/pod``) and the e2e tier's
(``tests/e2e/test_monitoring_prometheus.py``) to show.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from chartkit import CHART, ROOT, by_kind, helm_template, helm_template_error, one, run

pytestmark = pytest.mark.chart
ON = {"monitoring": {"podMonitors": {"enabled": True}, "prometheusRule": {"enabled": True},
                     "dashboard": {"enabled": True}}}
PROMTOOL = ROOT / ".cache" / "bin" / "promtool"


def _promtool() -> Path:
    if not PROMTOOL.exists():
        pytest.fail(f"{PROMTOOL} missing: run `make router-env` (scripts/build-router-env.sh)")
    return PROMTOOL


def rule_groups(values: dict[str, Any] | None = None) -> dict[str, Any]:
    rule = one(helm_template(values or ON), "PrometheusRule")
    return {"groups": rule["spec"]["groups"]}


def test_monitoring_objects_are_off_by_default_and_rendered_when_asked() -> None:
    default = helm_template()
    assert not by_kind(default, "PodMonitor") and not by_kind(default, "PrometheusRule")
    objects = helm_template(ON)
    monitors = {m["metadata"]["name"]: m for m in by_kind(objects, "PodMonitor")}
    assert set(monitors) == {"shc-sglang-hicache-operator-engines",
                             "shc-sglang-hicache-operator-routers"}
    engines = monitors["shc-sglang-hicache-operator-engines"]["spec"]
    assert engines["selector"]["matchLabels"]["app.kubernetes.io/component"] == "engine"
    assert engines["podMetricsEndpoints"][0]["port"] == "http"
    routers = monitors["shc-sglang-hicache-operator-routers"]["spec"]
    assert routers["selector"]["matchLabels"]["app.kubernetes.io/name"] == \
        "sglang-hicache-router"
    assert routers["podMetricsEndpoints"][0]["port"] == "metrics"
    dash = [c for c in by_kind(objects, "ConfigMap") if c["metadata"]["name"].endswith(
        "-dashboard")]
    assert dash and dash[0]["metadata"]["labels"]["grafana_dashboard"] == "1"
    json.loads(dash[0]["data"]["sglang-hicache.json"])


def test_the_dashboard_needs_the_recording_rules() -> None:
    err = helm_template_error({"monitoring": {"dashboard": {"enabled": True}}})
    assert "needs monitoring.prometheusRule.enabled" in err


def test_promtool_checks_and_tests_the_rules(tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_groups(), sort_keys=False))
    shutil.copy(Path(__file__).parent / "monitoring" / "rules-test.yaml", tmp_path)
    out = run([_promtool(), "check", "rules", tmp_path / "rules.yaml"]).stdout
    assert "SUCCESS: 26 rules found" in out, out
    run([_promtool(), "test", "rules", tmp_path / "rules-test.yaml"])


def test_the_dashboard_reads_only_recorded_or_scraped_series() -> None:
    """Every ``hicache:`` series a panel reads is recorded by the rules (a renamed rule would
    leave a panel empty), and every panel has a query."""
    recorded = {r["record"] for g in rule_groups()["groups"] for r in g["rules"]
                if "record" in r}
    dashboard = json.loads((CHART / "dashboards" / "sglang-hicache.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert all(p.get("targets") for p in dashboard["panels"] if p["type"] != "row")
    used = {m for e in exprs for m in re.findall(r"hicache:[a-z0-9_:]+", e)}
    assert used and used <= recorded, used - recorded


def dashboard_queries() -> list[str]:
    """Every query of the dashboard, with Grafana's variables as Prometheus would see them."""
    dashboard = json.loads((CHART / "dashboards" / "sglang-hicache.json").read_text())
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            out.append(target["expr"].replace("$namespace", ".*").replace("$instance", ".*")
                       .replace("$__rate_interval", "1m"))
    return out
