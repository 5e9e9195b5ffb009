"""RBAC sufficiency: the rendered roles allow every API call the operator makes, and nothing more.

Real: helm renders the roles; the operator's own declaration of its API calls
(``hicache_operator.controller.kube.PERMISSIONS``: its REST calls plus what kopf does for it) is
the reference. ``test_chart_operator_e2e.py`` checks the same roles against the requests a running
operator actually sends to the API emulator.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pytest
from chartkit import NAMESPACE, by_kind, helm_template

pytestmark = pytest.mark.chart

Grant = tuple[str, str, str]  # (API group, resource, verb)

# Entries of PERMISSIONS a given install mode never exercises, with the reason. Everything else
# in PERMISSIONS must be granted, and nothing outside PERMISSIONS may be.
NOT_USED_CLUSTER_WIDE: dict[tuple[str, str], str] = {
    ("kopf.dev", "kopfpeerings"): "cluster-wide operators peer through ClusterKopfPeering",
}
# Verbs of a resource an install mode uses only in part.
NOT_USED_VERBS_CLUSTER_WIDE: dict[Grant, str] = {
    ("", "namespaces", "list"): "kopf observes namespaces only when restricted to some "
                               "(observation.namespace_observer skips it cluster-wide); the "
                               "operator GETs a CR's namespace (Pod Security label)",
    ("", "namespaces", "watch"): "as list",
}
NOT_USED_NAMESPACED: dict[tuple[str, str], str] = {
    ("kopf.dev", "clusterkopfpeerings"): "namespace-restricted operators peer through "
                                         "KopfPeering in each watched namespace",
}
# Verbs PERMISSIONS lists that neither the operator's REST client nor kopf issue for these
# resources: kopf lists and watches CRDs, it never GETs a single one.
NOT_ISSUED_VERBS: dict[Grant, str] = {
    ("apiextensions.k8s.io", "customresourcedefinitions", "get"): "kopf: list+watch only",
}


def expand(rules: Iterable[Mapping[str, Any]]) -> set[Grant]:
    out = set()
    for rule in rules:
        for group in rule.get("apiGroups", []):
            for resource in rule.get("resources", []):
                for verb in rule.get("verbs", []):
                    out.add((group, resource, verb))
    return out


def declared() -> set[Grant]:
    from hicache_operator.controller.kube import PERMISSIONS

    return {(g, r, v) for g, r, verbs in PERMISSIONS for v in verbs}


def granted(objects: list[dict[str, Any]], namespace: str | None) -> set[Grant]:
    """What the operator's ServiceAccount may do in ``namespace`` (None: cluster-scoped)."""
    roles = {r["metadata"]["name"]: r for r in by_kind(objects, "ClusterRole")}
    grants: set[Grant] = set()
    for binding in by_kind(objects, "ClusterRoleBinding"):
        grants |= expand(roles[binding["roleRef"]["name"]]["rules"])
    for binding in by_kind(objects, "RoleBinding"):
        if namespace is not None and binding["metadata"]["namespace"] == namespace:
            grants |= expand(roles[binding["roleRef"]["name"]]["rules"])
    for subject_binding in [*by_kind(objects, "ClusterRoleBinding"),
                            *by_kind(objects, "RoleBinding")]:
        (subject,) = subject_binding["subjects"]
        assert subject == {"kind": "ServiceAccount", "name": "shc-sglang-hicache-operator",
                           "namespace": NAMESPACE}
    return grants


def _expected(not_used: Mapping[tuple[str, str], str],
              not_used_verbs: Mapping[Grant, str] | None = None) -> set[Grant]:
    return {g for g in declared()
            if (g[0], g[1]) not in not_used and g not in NOT_ISSUED_VERBS
            and g not in (not_used_verbs or {})}


def test_no_wildcards_no_secrets_no_escalation() -> None:
    for values in ({}, {"operatorConfig": {"watchNamespaces": ["a", "b"]}}):
        objects = helm_template(values)
        for role in [*by_kind(objects, "ClusterRole"), *by_kind(objects, "Role")]:
            for group, resource, verb in expand(role["rules"]):
                assert "*" not in (group, resource, verb), role["metadata"]["name"]
                assert resource != "secrets"
                assert verb not in ("escalate", "bind", "impersonate")
            assert all("resourceNames" not in r and "nonResourceURLs" not in r
                       for r in role["rules"])


def test_cluster_wide_install_grants_exactly_what_the_operator_uses() -> None:
    objects = helm_template()
    assert not by_kind(objects, "RoleBinding")
    grants = granted(objects, None)
    assert grants <= declared(), f"granted beyond the operator's needs: {grants - declared()}"
    missing = _expected(NOT_USED_CLUSTER_WIDE, NOT_USED_VERBS_CLUSTER_WIDE) - grants
    assert not missing, f"the operator's calls not allowed: {sorted(missing)}"


def test_namespaced_install_grants_workloads_only_in_watched_namespaces() -> None:
    objects = helm_template({"operatorConfig": {"watchNamespaces": ["models-a", "models-b"]}})
    expected = _expected(NOT_USED_NAMESPACED)
    cluster_only = granted(objects, None)
    for ns in ("models-a", "models-b"):
        grants = granted(objects, ns)
        assert grants <= declared(), grants - declared()
        assert not expected - grants, sorted(expected - grants)
    # outside the watched namespaces: only the cluster-scoped reads kopf needs, the
    # StorageClasses of SSD claims the operator grows, the namespaces' Pod Security labels and
    # the volumes and nodes of SSD claims bound to a lost node
    assert cluster_only == {
        ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
        ("", "namespaces", "get"),
        ("", "namespaces", "list"),
        ("", "namespaces", "watch"),
        ("storage.k8s.io", "storageclasses", "get"),
        ("", "persistentvolumes", "get"),
        ("", "nodes", "list"),
    }
    assert granted(objects, "kube-system") == cluster_only


def test_exclusions_name_real_entries_of_the_declaration() -> None:
    # a stale exclusion would silently hide a grant the operator needs
    pairs = {(g, r) for g, r, _ in declared()}
    assert set(NOT_USED_CLUSTER_WIDE) <= pairs and set(NOT_USED_NAMESPACED) <= pairs
    assert set(NOT_ISSUED_VERBS) <= declared()
    assert set(NOT_USED_VERBS_CLUSTER_WIDE) <= declared()
