"""From a CR to a running pod: the planner's objects, a StatefulSet's pod, the test image.

``plan_pod`` runs the real planner on a CR and returns what the operator would apply; ``pod_of``
turns the StatefulSet into the pod its controller would create (ordinal name, hostname, the
``volumeClaimTemplates`` as per-pod claims ``<template>-<pod>``).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .podspec import PodMeta
from .runtime import Image, Pod

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


def plan_pod(cr: dict[str, Any]) -> PlannedPod:
    from hicache_operator.api.config import OperatorConfig
    from hicache_operator.plan import plan

    p = plan(cr, OperatorConfig())
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
                   labels=dict(tpl["metadata"].get("labels", {})))
    return meta, spec, claims


def make_image(workdir: Path) -> Image:
    """The engine image on this machine: ``python`` is the engine environment's interpreter,
    ``umbp_standalone_server`` mori's binary under the environment's loader."""
    from hicache_umbp.clients.runtime import mori_loader_prefix, standalone_server_binary

    bin_dir = workdir / "image-bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    python = bin_dir / "python"
    if not python.exists():
        python.symlink_to(sys.executable)
    server = bin_dir / "umbp_standalone_server"
    loader = " ".join(mori_loader_prefix())
    server.write_text(f"#!/bin/sh\nexec {loader} {standalone_server_binary()} \"$@\"\n")
    server.chmod(0o755)
    for d in (bin_dir, workdir):
        os.chmod(d, 0o755)
    env = {"PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin", "HOME": "/home/sglang",
           "PYTHONUNBUFFERED": "1"}
    return Image(bin_dir=bin_dir, env=env, root_keep=(sys.base_prefix,))


class Client:
    """HTTP calls a user (and the operator's scraper) make to the pod."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.base = f"http://{host}:{port}"

    def generate(self, text: str, max_new_tokens: int = 8) -> dict[str, Any]:
        body = json.dumps({"text": text, "sampling_params": {
            "max_new_tokens": max_new_tokens, "temperature": 0}}).encode()
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
                *, ready_timeout_s: float = 600) -> Iterator[tuple[Pod, Client]]:
    """The CR's pod started on ``node`` (its model claim bound to ``models_dir``), Ready, with a
    client on its engine port; always closed afterwards."""
    planned = plan_pod(cr)
    pod = start_pod(planned, node, image, workdir, {"tiny-models": models_dir})
    try:
        pod.wait_ready(ready_timeout_s)
        yield pod, Client(cr["spec"]["engine"]["port"])
    finally:
        pod.close()
