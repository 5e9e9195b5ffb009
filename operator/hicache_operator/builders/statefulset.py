"""The StatefulSet: engine container, standalone UMBP sidecars, volumes, placement.

Standalone sidecars are native sidecars (init containers with ``restartPolicy: Always``, GA in
Kubernetes 1.33): they start, and answer on their socket, before the engine, and keep running
when the engine container restarts, so the L3 cache survives engine crashes.
"""

from __future__ import annotations

from typing import Any

from hicache_umbp.contract.media import Medium
from hicache_umbp.contract.mori_env import standalone_server_env
from hicache_umbp.contract.names import DRAIN_COMMAND, LAUNCH_COMMAND
from hicache_umbp.contract.paths import POD_INFO_DIR, REPORT_DIR, SOCKET_DIR, SSD_MOUNT
from hicache_umbp.contract.revisions import CONFIG_REVISION_ENV

from ..api.quantity import format_bytes
from ..planner.engine import (
    SIDECAR_MEDIUM,
    sidecar_socket,
    standalone_server_command,
)
from ..planner.k8s_checks import SHM_PATH
from ..planner.pod_overhead import (
    DRAIN_ENDPOINT_DELAY_S,
    DRAIN_L3_TIMEOUT_S,
    DRAIN_TIMEOUT_S,
    termination_grace_seconds,
)
from ..planner.security import (
    engine_security_context,
    pod_security_context,
    sidecar_security_context,
)
from ..planner.sizing import ContainerSizing
from .context import (
    CONFIG_HASH_ANNOTATION,
    IN_PLACE_READY_GATE,
    POD_HASH_ANNOTATION,
    BuildInput,
    digest,
)

SHM_VOLUME = "dshm"
RUN_VOLUME = "hicache-run"
SOCKET_VOLUME = "umbp-sockets"
MODEL_VOLUME = "model"
TMP_VOLUME = "tmp"
POD_INFO_VOLUME = "pod-info"
# SGLang 0.5.23 endpoints (sglang/srt/entrypoints/http_server.py):
# * /ready answers at once: 200 once the server finished starting and is not paused or
#   shutting down (TokenizerManager.is_ready), else 503. It is what "can take traffic" means, so
#   it gates startup and readiness.
# * /health is /health_generate: it runs a 1-token generation when idle (ignored when busy) and
#   sleeps 1 s before its first check, answering after >= 1 s and at most after
#   SGLANG_HEALTH_CHECK_TIMEOUT (20 s) with 503. A probe on it with Kubernetes' default
#   timeoutSeconds (1) never passes; liveness gives it the whole check time.
READY_PATH = "/ready"
HEALTH_PATH = "/health"
SGLANG_HEALTH_CHECK_TIMEOUT_S = 20
READY_TIMEOUT_S = 5
HEALTH_TIMEOUT_S = SGLANG_HEALTH_CHECK_TIMEOUT_S + 5


def _resources(b: BuildInput, c: ContainerSizing, ephemeral: int = 0) -> dict[str, Any]:
    res = c.resources(b.config.gpu_resource_name)
    requests = dict(res)
    if ephemeral:
        requests["ephemeral-storage"] = format_bytes(ephemeral)
    return {"requests": requests, "limits": res}


def _env_list(env: dict[str, str]) -> list[dict[str, Any]]:
    return [{"name": k, "value": v} for k, v in sorted(env.items())]


def _engine_container(b: BuildInput) -> dict[str, Any]:
    spec = b.spec
    standalone = spec.l3.mode == "standalone"
    mounts: list[dict[str, Any]] = [
        {"name": SHM_VOLUME, "mountPath": SHM_PATH},
        {"name": RUN_VOLUME, "mountPath": REPORT_DIR},
    ]
    if spec.model.volume is not None:
        mounts.append({"name": MODEL_VOLUME, "mountPath": spec.model.mount_path, "readOnly": True})
    # The SSD tier's drives: the hicache engine holds them in the engine in either mode, mori's
    # SSD node only embedded (standalone, the umbp-ssd sidecar does).
    engine_ssd = b.ssd.ours or (b.ssd.enabled and not standalone)
    if engine_ssd:
        mounts += b.ssd.mounts()
    if standalone:
        mounts.append({"name": SOCKET_VOLUME, "mountPath": SOCKET_DIR})
    env: list[dict[str, Any]] = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ]
    in_config: set[str] = set()
    if b.in_place:  # the configuration revision is chosen at each start (launch.revision)
        in_config = b.config_env()
        annotation = f"metadata.annotations['{CONFIG_HASH_ANNOTATION}']"
        env.append({"name": CONFIG_REVISION_ENV,
                    "valueFrom": {"fieldRef": {"fieldPath": annotation}}})
        mounts.append({"name": POD_INFO_VOLUME, "mountPath": POD_INFO_DIR, "readOnly": True})
    env += [v.model_dump(by_alias=True, exclude_none=True) for v in spec.engine.env
            if v.name not in in_config]

    def probe(path: str, timeout_s: int) -> dict[str, Any]:
        return {"httpGet": {"path": path, "port": "http"}, "timeoutSeconds": timeout_s}

    ephemeral = b.ssd.ephemeral_bytes if engine_ssd else 0
    return {
        "name": "engine",
        "image": b.image,
        "imagePullPolicy": b.image_pull_policy,
        "command": list(LAUNCH_COMMAND),
        "ports": [{"name": "http", "containerPort": spec.engine.port, "protocol": "TCP"}],
        "envFrom": [{"configMapRef": {"name": b.names.configmap}}],
        "env": env,
        "resources": _resources(b, b.sizing.engine, ephemeral),
        "volumeMounts": mounts,
        # Loading a large model and prefaulting the host pool take long: up to 2 h to start.
        "startupProbe": {
            **probe(READY_PATH, READY_TIMEOUT_S), "periodSeconds": 10, "failureThreshold": 720,
        },
        "readinessProbe": {
            **probe(READY_PATH, READY_TIMEOUT_S), "periodSeconds": 10, "failureThreshold": 3,
        },
        # A wedged scheduler fails /health (no token within 20 s): restarted after ~2 min.
        "livenessProbe": {
            **probe(HEALTH_PATH, HEALTH_TIMEOUT_S), "periodSeconds": 30, "failureThreshold": 4,
        },
        # On deletion: the endpoints drop the terminating pod, in-flight requests finish, then
        # SIGTERM (planner.pod_overhead: terminationGracePeriodSeconds covers this and the release).
        # Standalone, L3 first takes what is queued: before an in-place image change the kubelet
        # runs this hook too, and the sidecars keep L3 for the restarted engine. The port is
        # given: with configuration revisions HICACHE_PORT is not a variable of the container.
        "lifecycle": {"preStop": {"exec": {"command": [
            *DRAIN_COMMAND, "--timeout", str(DRAIN_TIMEOUT_S),
            "--endpoint-delay", str(DRAIN_ENDPOINT_DELAY_S), "--port", str(spec.engine.port),
            *(["--l3-timeout", str(DRAIN_L3_TIMEOUT_S)] if standalone else [])]}}},
        "securityContext": engine_security_context(spec, b.config.policy, b.capabilities),
    }


def _sidecar(b: BuildInput, medium: Medium, sizing: ContainerSizing) -> dict[str, Any]:
    spec = b.spec
    socket = sidecar_socket(medium)
    mounts = [
        {"name": SOCKET_VOLUME, "mountPath": SOCKET_DIR},
        {"name": TMP_VOLUME, "mountPath": "/tmp"},
    ]
    ephemeral = 0
    if medium == "dram":
        env = standalone_server_env(
            "dram", capacity_bytes=b.sizing.dram_total, hugepage_bytes=b.sizing.dram_page
        )
        caps = [c for c in b.capabilities if c in ("IPC_LOCK", "SYS_NICE")]
    else:
        env = standalone_server_env(
            "ssd",
            capacity_bytes=b.ssd.capacity,
            ssd_dir=SSD_MOUNT,
            io_backend=spec.l3.ssd.io_backend,
            durability=spec.l3.ssd.durability,
            # slot = the engine's umbp_ssd_slot_bytes; slots shared by every rank (sizing)
            value_bytes=b.sizing.ssd_slot_bytes,
            staging_slots=b.sizing.ssd_sidecar_slots,
        )
        mounts += b.ssd.mounts()
        ephemeral = b.ssd.ephemeral_bytes
        caps = []
    return {
        "name": f"umbp-{medium}",
        "image": b.sidecar_image,
        "imagePullPolicy": b.image_pull_policy,
        "restartPolicy": "Always",
        "command": standalone_server_command(medium),
        "env": _env_list(env),
        "resources": _resources(b, sizing, ephemeral),
        "volumeMounts": mounts,
        "startupProbe": {
            "exec": {"command": ["test", "-S", socket]},
            "periodSeconds": 2,
            "failureThreshold": 300,
        },
        "securityContext": sidecar_security_context(caps),
    }


def _volumes(b: BuildInput) -> list[dict[str, Any]]:
    spec = b.spec
    vols: list[dict[str, Any]] = [
        {
            "name": SHM_VOLUME,
            "emptyDir": {"medium": "Memory", "sizeLimit": format_bytes(b.sizing.shm_bytes)},
        },
        {"name": RUN_VOLUME, "emptyDir": {"sizeLimit": "64Mi"}},
    ]
    if spec.model.volume is not None:
        vols.append(
            {"name": MODEL_VOLUME, **spec.model.volume.model_dump(by_alias=True, exclude_none=True)}
        )
    if b.ssd.enabled:
        vols += b.ssd.pod_volumes
    if spec.l3.mode == "standalone":
        vols.append({"name": SOCKET_VOLUME, "emptyDir": {"sizeLimit": "16Mi"}})
        vols.append({"name": TMP_VOLUME, "emptyDir": {"sizeLimit": "1Gi"}})
    if b.in_place:  # the kubelet rewrites the file when the pod's annotations change
        vols.append({"name": POD_INFO_VOLUME, "downwardAPI": {"items": [
            {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]}})
    return vols


def _update_strategy(b: BuildInput) -> dict[str, Any]:
    strategy = b.spec.update_strategy
    if strategy.type == "OnDelete":
        return {"type": "OnDelete"}
    if b.in_place:
        # The operator rolls the pods itself (in place): the StatefulSet controller is held
        # off every pod by the partition, and still keeps its revisions (pods it creates, and
        # currentRevision once every pod is on the new one). The controller lowers the
        # partition only to let the StatefulSet replace pods (controller/rollout.py).
        return {"type": "RollingUpdate", "rollingUpdate": {"partition": b.spec.replicas}}
    out: dict[str, Any] = {"type": "RollingUpdate"}
    rolling = strategy.rolling_update
    if rolling is not None:
        fields: dict[str, Any] = {}
        if rolling.partition:
            fields["partition"] = rolling.partition
        if rolling.max_unavailable is not None:
            fields["maxUnavailable"] = rolling.max_unavailable
        if fields:
            out["rollingUpdate"] = fields
    return out


def build_statefulset(b: BuildInput) -> dict[str, Any]:
    spec = b.spec
    sidecars = [_sidecar(b, SIDECAR_MEDIUM[c.name], c) for c in b.sizing.containers[1:]]
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": termination_grace_seconds(
            b.sizing.engine_pool_bytes, l3_wait=spec.l3.mode == "standalone"),
        "securityContext": pod_security_context(b.config.engine_pod_security),
        "affinity": b.affinity,
        "tolerations": b.tolerations,
        "containers": [_engine_container(b)],
        "volumes": _volumes(b),
    }
    if sidecars:
        pod_spec["initContainers"] = sidecars
    if spec.placement.node_selector:
        pod_spec["nodeSelector"] = dict(sorted(spec.placement.node_selector.items()))
    if spec.placement.priority_class_name:
        pod_spec["priorityClassName"] = spec.placement.priority_class_name
    policy = b.config.policy
    if spec.security.host_ipc and policy.allow_host_ipc:
        pod_spec["hostIPC"] = True
    if spec.security.host_network and policy.allow_host_network:
        pod_spec["hostNetwork"] = True
        pod_spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    annotations = {
        CONFIG_HASH_ANNOTATION: b.config_hash(),
        "kubectl.kubernetes.io/default-container": "engine",
    }
    if b.in_place:
        # The operator takes the pod out of rotation (condition False) before it restarts the
        # engine in place, and lets it back once the new engine is ready (controller.rollout).
        pod_spec["readinessGates"] = [{"conditionType": IN_PLACE_READY_GATE}]
        annotations[POD_HASH_ANNOTATION] = pod_hash(pod_spec)
    sts_spec: dict[str, Any] = {
        "serviceName": b.names.headless_service,
        "replicas": spec.replicas,
        "podManagementPolicy": "Parallel",
        "revisionHistoryLimit": 5,
        "updateStrategy": _update_strategy(b),
        "selector": {"matchLabels": b.selector()},
        "template": {
            "metadata": {
                "labels": b.labels("engine"),
                "annotations": annotations,
            },
            "spec": pod_spec,
        },
    }
    claims = b.ssd.claim_templates if b.ssd.enabled else []
    if claims:
        sts_spec["volumeClaimTemplates"] = [
            {**c, "metadata": {**c["metadata"], "labels": b.labels("cache")}} for c in claims]
        # The CR's deletion keeps the claims unless it opts in (deleteWithResource on any drive:
        # a user's volume is not deleted implicitly; one policy covers the StatefulSet). A
        # scale-down deletes its pods' claims unless a drive says whenScaled: Retain: a kept
        # local-NVMe claim binds a later scale-up to the old node even when its GPUs are taken.
        templates = [v.claim_template for v in spec.l3.ssd.drive_volumes()
                     if v.claim_template is not None]
        delete = any(t.delete_with_resource for t in templates)
        retain = any(t.when_scaled == "Retain" for t in templates)
        sts_spec["persistentVolumeClaimRetentionPolicy"] = {
            "whenDeleted": "Delete" if delete else "Retain",
            "whenScaled": "Retain" if retain else "Delete",
        }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": b.metadata(b.names.statefulset, "engine"),
        "spec": sts_spec,
    }


def pod_hash(pod_spec: dict[str, Any]) -> str:
    """The digest of a pod template's spec without the engine container's image: two
    templates with the same one differ only in what changes in place (the engine image, and
    the configuration revision, which is an annotation)."""
    containers = [{**c, "image": ""} if c.get("name") == "engine" else c
                  for c in pod_spec.get("containers") or []]
    return digest({**pod_spec, "containers": containers})
