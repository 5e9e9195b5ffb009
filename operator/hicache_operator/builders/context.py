"""What every builder reads: names, labels and the planned pod."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from ..api.config import OperatorConfig
from ..api.spec import SGLangHiCacheSpec
from ..planner.engine import EngineEnv
from ..planner.router import ROUTER_APP_NAME, RouterPlan
from ..planner.sizing import PodSizing
from ..planner.ssd import SsdLayout

APP_NAME = "sglang-hicache"
MANAGED_BY = "sglang-hicache-operator"
CONFIG_HASH_ANNOTATION = "hicache.sglang.ai/config-hash"


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
        return {"app.kubernetes.io/name": ROUTER_APP_NAME, "app.kubernetes.io/instance": self.name}

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

    def config_hash(self) -> str:
        blob = json.dumps(self.engine.env, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]
