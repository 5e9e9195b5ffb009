"""From a CR to a running pod: the tier's API for pod-level tests.

* :func:`running_pod` -- the CR's pod started on a node, Ready, with a :class:`Client`; always
  closed afterwards. What most tests need.
* :func:`plan_pod` runs the real planner on a CR with the cluster admin's operator
  configuration (:func:`admin_config`) and returns what the operator would apply;
  :func:`start_pod` starts its pod without waiting (tests of pods that must not get Ready);
  :func:`pod_of` turns the StatefulSet into the pod its controller would create (ordinal name,
  hostname, the ``volumeClaimTemplates`` as per-pod claims ``<template>-<pod>``).
* :func:`load_cr` reads an example CR with fields replaced.

The node (:class:`pod.node.Node`), the image (:func:`pod.image.make_image`) and the kubelet
(:class:`pod.runtime.Pod`) refuse what a real MI355X node refuses; docs/architecture.md ("The
pod tier") lists what is imitated and how.
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .image import Image, make_image
from .podspec import PodMeta
from .runtime import Pod

__all__ = ["Client", "Image", "PlannedPod", "admin_config", "load_cr", "make_image", "plan_pod",
           "pod_of", "running_pod", "start_pod"]

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class PlannedPod:
    cr: dict[str, Any]
    plan: Any  # hicache_operator.plan.orchestrate.Plan
    statefulset: dict[str, Any]
    configmaps: dict[str, dict[str, str]]


def load_cr(name: str, **overrides: Any) -> dict[str, Any]:
    """An example CR from examples/ with ``spec`` fields replaced (dotted keys)."""
    cr = yaml.safe_load((ROOT / "examples" / name).read_text())
    for dotted, value in overrides.items():
        node = cr
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return cr


def admin_config(node: Any = None, **overrides: Any) -> Any:
    """The operator configuration (chart values) an admin sets for this cluster, as
    docs/install.md says: the nodes' render gid in ``enginePodSecurity.supplementalGroups``,
    ``SYS_NICE`` allowed for NUMA binding. ``overrides`` replace top-level keys."""
    from hicache_operator.api.config import OperatorConfig

    data: dict[str, Any] = {
        "enginePodSecurity": {"supplementalGroups": [node.render_gid] if node else []},
        "policy": {"allowedCapabilities": ["IPC_LOCK", "SYS_NICE"]},
    }
    data.update(overrides)
    return OperatorConfig.from_mapping(data)


def plan_pod(cr: dict[str, Any], config: Any = None) -> PlannedPod:
    """The operator's objects for ``cr`` (``config``: :func:`admin_config` of no node)."""
    from hicache_operator.plan import plan

    p = plan(cr, config if config is not None else admin_config())
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for o in p.objects:
        by_kind.setdefault(o["kind"], []).append(o)
    (sts,) = by_kind["StatefulSet"]
    cms = {c["metadata"]["name"]: dict(c.get("data", {})) for c in by_kind.get("ConfigMap", [])}
    return PlannedPod(cr, p, sts, cms)


def pod_of(sts: dict[str, Any], ordinal: int = 0) -> tuple[PodMeta, dict[str, Any], list[str]]:
    """(meta, pod spec, claim names) of the StatefulSet's pod ``ordinal``."""
    name = f"{sts['metadata']['name']}-{ordinal}"
    tpl = copy.deepcopy(sts["spec"]["template"])
    spec = tpl["spec"]
    spec.setdefault("hostname", name)
    claims = []
    for ct in sts["spec"].get("volumeClaimTemplates", []):
        claim = f"{ct['metadata']['name']}-{name}"
        claims.append(claim)
        spec.setdefault("volumes", []).append(
            {"name": ct["metadata"]["name"], "persistentVolumeClaim": {"claimName": claim}})
    meta = PodMeta(name=name, namespace=sts["metadata"].get("namespace", "default"),
                   labels=dict(tpl["metadata"].get("labels", {})),
                   annotations=dict(tpl["metadata"].get("annotations", {})))
    return meta, spec, claims


class Client:
    """HTTP calls a user (and the operator's scraper) make to the pod."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.base = f"http://{host}:{port}"

    def generate(self, text: str, max_new_tokens: int = 8, **fields: Any) -> dict[str, Any]:
        """``POST /generate``, greedy; ``fields`` go into the request (e.g. ``cache_salt``)."""
        body = json.dumps({"text": text, "sampling_params": {
            "max_new_tokens": max_new_tokens, "temperature": 0}, **fields}).encode()
        req = urllib.request.Request(f"{self.base}/generate", body,
                                     {"content-type": "application/json"})
        t0 = time.perf_counter()
        with urllib.request.urlopen(req, timeout=300) as r:
            out: dict[str, Any] = json.load(r)
        out["client_latency_s"] = time.perf_counter() - t0
        return out

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.base}/metrics", timeout=30) as r:
            return str(r.read().decode())

    def wait_backups_in_l3(self, timeout_s: float = 120) -> tuple[float, float]:
        """Wait until every token SGLang backed up to its host pool (L2) was also backed up to
        L3 (``sglang:backuped_tokens_total`` >= ``sglang:hicache_backup_tokens_total``, read
        with the operator's own parser): what an engine killed now leaves in the L3 tier is
        then all it wrote. Returns (L2, L3) tokens; ``timeout_s`` is a hang guard."""
        from hicache_operator.cachestats.sglang_metrics import parse_pod

        deadline = time.monotonic() + timeout_s
        while True:
            pod = parse_pod(self.metrics())
            l2, l3 = pod.l2_backup_tokens or 0.0, pod.l3_backup_tokens
            if l2 > 0 and l3 >= l2:
                return l2, l3
            if time.monotonic() > deadline:
                raise AssertionError(f"L3 backups never caught up with L2: {l3} of {l2} tokens")
            time.sleep(0.2)


def start_pod(planned: PlannedPod, node: Any, image: Image, workdir: Path,
              claims: dict[str, Path], **kw: Any) -> Pod:
    meta, spec, claim_names = pod_of(planned.statefulset)
    for c in claim_names:
        claims.setdefault(c, workdir / "pv" / c)
        claims[c].mkdir(parents=True, exist_ok=True)
    pod = Pod(meta, spec, planned.configmaps, node, image, workdir / meta.name, claims, **kw)
    pod.start()
    return pod


@contextlib.contextmanager
def running_pod(cr: dict[str, Any], node: Any, image: Image, workdir: Path, models_dir: Path,
                *, ready_timeout_s: float = 600, config: Any = None,
                ) -> Iterator[tuple[Pod, Client]]:
    """The CR's pod started on ``node`` (its model claim bound to ``models_dir``), Ready, with a
    client on its engine port; always closed afterwards. ``config``: the operator
    configuration, default :func:`admin_config` of ``node``."""
    planned = plan_pod(cr, config if config is not None else admin_config(node))
    pod = start_pod(planned, node, image, workdir, {"tiny-models": models_dir})
    try:
        pod.wait_ready(ready_timeout_s)
        yield pod, Client(cr["spec"]["engine"]["port"])
    finally:
        pod.close()


def run_container(node: Any, image: Image, workdir: Path, container: dict[str, Any], *,
                  pod_security: dict[str, Any] | None = None,
                  volumes: list[dict[str, Any]] | None = None,
                  timeout_s: float = 120) -> tuple[int, str]:
    """Run one container to completion on ``node`` as the only (init) container of a pod with
    ``pod_security`` as its securityContext; (exit code, log). For tests of the tier itself."""
    meta = PodMeta(name=f"probe-{container['name']}", namespace="hicache-test")
    spec = {"securityContext": pod_security or {}, "volumes": volumes or [],
            "initContainers": [container], "containers": []}
    pod = Pod(meta, spec, {}, node, image, workdir / meta.name)
    try:
        pod.start(wait_started_s=timeout_s)
        rc = 0
    except RuntimeError:
        rc = pod.containers[0].proc.returncode if pod.containers[0].proc else -1
    finally:
        pod.close()
    return rc, pod.containers[0].log_text(20000)
