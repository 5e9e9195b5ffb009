"""What every builder reads: names, labels and the planned pod."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from hicache_umbp.contract.revisions import CONFIG_ANNOTATION
from hicache_umbp.contract.revisions import RESTARTED_AT_ANNOTATION as RESTARTED_AT

from ..api.config import OperatorConfig
from ..api.k8s import IN_PLACE
from ..api.spec import SGLangHiCacheSpec
from ..planner.engine import EngineEnv
from ..planner.router import RouterPlan, router_pod_labels
from ..planner.sizing import PodSizing
from ..planner.ssd import SsdLayout

APP_NAME = "sglang-hicache"
MANAGED_BY = "sglang-hicache-operator"
# The pod's engine configuration revision; with InPlaceIfPossible the launcher selects its
# configuration by it (hicache_umbp.launch.revision), so it is one name on both sides.
CONFIG_HASH_ANNOTATION = CONFIG_ANNOTATION
# InPlaceIfPossible: a digest of everything in the pod template that cannot change in place
# (all but the engine image and the configuration revision); equal digests mean "in place".
POD_HASH_ANNOTATION = "hicache.sglang.ai/pod-hash"
# InPlaceIfPossible: a pod readiness gate the operator owns. It turns the condition False before
# it restarts a pod's engine in place (Endpoints and the router drop the pod while it is still
# healthy, so the drain sees no new requests) and True once the new engine is ready; a pod is
# Ready only while every gate's condition is True (the kubelet's rule).
IN_PLACE_READY_GATE = "hicache.sglang.ai/in-place-ready"
# `kubectl rollout restart` writes RESTARTED_AT_ANNOTATION into the template; InPlaceIfPossible
# carries it into the operator's template and restarts each engine in place for it
# (controller.kubectl; the launcher's watcher restarts the engine when it changes).
RESTARTED_AT_ANNOTATION = RESTARTED_AT


def digest(value: Any) -> str:
    blob = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


@dataclass(frozen=True)
class ObjectNames:
    statefulset: str
    headless_service: str
    service: str
    configmap: str
    pdb: str
    router: str  # the router's Deployment, ServiceAccount, Role and RoleBinding

    @classmethod
    def of(cls, name: str) -> ObjectNames:
        return cls(
            statefulset=name,
            headless_service=f"{name}-headless",
            service=name,
            configmap=f"{name}-hicache",
            pdb=name,
            router=f"{name}-router",
        )


@dataclass(frozen=True)
class BuildInput:
    name: str
    namespace: str
    spec: SGLangHiCacheSpec
    config: OperatorConfig
    sizing: PodSizing
    ssd: SsdLayout
    engine: EngineEnv
    affinity: dict[str, Any]
    tolerations: list[dict[str, Any]]
    capabilities: list[str]
    router: RouterPlan | None = None  # None: no router
    # The client Service sends requests to the router (once it has an available pod).
    router_serving: bool = True

    @property
    def names(self) -> ObjectNames:
        return ObjectNames.of(self.name)

    @property
    def image(self) -> str:
        return self.spec.image or self.config.default_image

    @property
    def image_pull_policy(self) -> str:
        return self.spec.image_pull_policy or self.config.image_pull_policy

    def selector(self) -> dict[str, str]:
        return {"app.kubernetes.io/name": APP_NAME, "app.kubernetes.io/instance": self.name}

    def router_selector(self) -> dict[str, str]:
        """Router pods: a name of their own, so no engine selector (Services, PDB, the
        router's own discovery) ever matches them."""
        return router_pod_labels(self.name)

    @property
    def router_image(self) -> str:
        return self.spec.router.image or self.config.router_image

    def labels(self, component: str) -> dict[str, str]:
        return {
            **self.selector(),
            "app.kubernetes.io/component": component,
            "app.kubernetes.io/managed-by": MANAGED_BY,
        }

    def metadata(self, name: str, component: str) -> dict[str, Any]:
        return {"name": name, "namespace": self.namespace, "labels": self.labels(component)}

    @property
    def in_place(self) -> bool:
        """updateStrategy InPlaceIfPossible: the engine's configuration is a revision the pod
        selects at each engine start, so it can change without replacing the pod."""
        return self.spec.update_strategy.type == IN_PLACE

    @property
    def sidecar_image(self) -> str:
        return self.spec.l3.image or self.image

    def engine_config(self) -> dict[str, str]:
        """The environment the launcher starts the engine with, from the ConfigMap: the
        rendered HICACHE_* settings, and with InPlaceIfPossible the user's literal env too."""
        if not self.in_place:
            return dict(self.engine.env)
        literal = {v.name: v.value for v in self.spec.engine.env if v.name in self.config_env()}
        return {**self.engine.env, **{k: str(v) for k, v in literal.items()}}

    def config_env(self) -> set[str]:
        """InPlaceIfPossible: the user's env entries that go in the configuration revision
        (changeable in place): literal values that reference no variable and that no entry
        kept in the pod spec references; valueFrom entries and $(VAR) references stay in the
        pod spec, where the kubelet resolves them."""
        env = self.spec.engine.env
        kept = {v.name for v in env if v.value_from is not None or "$(" in (v.value or "")}
        referenced = {v.name for v in env
                      if any(f"$({v.name})" in (w.value or "") for w in env if w.name in kept)}
        return {v.name for v in env if v.name not in kept | referenced}

    def config_hash(self) -> str:
        if not self.in_place:  # byte for byte what older operators rendered
            blob = json.dumps(self.engine.env, sort_keys=True).encode()
            return hashlib.sha256(blob).hexdigest()[:16]
        return digest(self.engine_config())
