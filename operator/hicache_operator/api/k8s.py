"""Kubernetes types a CR passes through (core/v1 scheduling, env and volume sources; the apps/v1
update strategy): typed, so the CRD is structural.

A bare ``x-kubernetes-preserve-unknown-fields`` object lets ``affinity: {nodeAffinity: "x"}``
through the API server; the planner then crashed, or the StatefulSet it built was refused. With
these models the API server itself answers 422 for wrongly typed fields (``kubectl apply``
fails at once), and the planner, which validates with the same models, reports CRs stored before
the schema existed as ``SpecValid=False``. Field names and types follow core/v1 (Kubernetes
1.33); rules a schema cannot state cheaply (label key syntax, operator/values combinations) are
checked by ``planner.k8s_checks``. Optional lists default to ``None`` so a dump
(``exclude_none``) gives back exactly what the user wrote.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from .types import ApiModel, IntOrPercent, Quantity

# Generous bounds: they keep objects small and make CEL cost estimation possible.
_MAX_TERMS = 32
_MAX_VALUES = 256
_NAME = 253

# ----------------------------------------------------------------------------- selectors
class LabelSelectorRequirement(ApiModel):
    """A label selector requirement (meta/v1 LabelSelectorRequirement)."""

    key: str = Field(max_length=_NAME, description="Label key the selector applies to.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(
        description="In, NotIn, Exists or DoesNotExist."
    )
    values: list[str] | None = Field(
        default=None,
        max_length=_MAX_VALUES,
        description="Values for In/NotIn (non-empty); empty for Exists/DoesNotExist.",
    )


class LabelSelector(ApiModel):
    """A label query over pods or namespaces (meta/v1 LabelSelector)."""

    match_labels: dict[str, str] | None = Field(
        default=None, max_length=64, description="Labels that must all match."
    )
    match_expressions: list[LabelSelectorRequirement] | None = Field(
        default=None, max_length=_MAX_TERMS, description="Requirements that must all hold."
    )


class NodeSelectorRequirement(ApiModel):
    """A node label or field requirement (core/v1 NodeSelectorRequirement)."""

    key: str = Field(max_length=_NAME, description="Node label key (or field for matchFields).")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"] = Field(
        description="In, NotIn, Exists, DoesNotExist, Gt or Lt."
    )
    values: list[str] | None = Field(
        default=None,
        max_length=_MAX_VALUES,
        description="Values: non-empty for In/NotIn, empty for Exists/DoesNotExist, one "
        "integer for Gt/Lt.",
    )


class NodeSelectorTerm(ApiModel):
    """Requirements ANDed together (core/v1 NodeSelectorTerm)."""

    match_expressions: list[NodeSelectorRequirement] | None = Field(
        default=None, max_length=_MAX_TERMS, description="Requirements on node labels."
    )
    match_fields: list[NodeSelectorRequirement] | None = Field(
        default=None, max_length=_MAX_TERMS, description="Requirements on node fields."
    )


class NodeSelector(ApiModel):
    """Terms ORed together (core/v1 NodeSelector)."""

    node_selector_terms: list[NodeSelectorTerm] = Field(
        max_length=_MAX_TERMS, description="A node matches when any term matches."
    )


class PreferredSchedulingTerm(ApiModel):
    """A weighted node preference (core/v1 PreferredSchedulingTerm)."""

    weight: int = Field(ge=1, le=100, description="Weight, 1 to 100.")
    preference: NodeSelectorTerm = Field(description="The node selector term.")


class NodeAffinity(ApiModel):
    """Node affinity (core/v1 NodeAffinity); required terms are ANDed with the GPU terms."""

    required_during_scheduling_ignored_during_execution: NodeSelector | None = Field(
        default=None, description="Nodes a pod must be scheduled on."
    )
    preferred_during_scheduling_ignored_during_execution: list[PreferredSchedulingTerm] | None = (
        Field(default=None, max_length=_MAX_TERMS, description="Weighted node preferences.")
    )


class PodAffinityTerm(ApiModel):
    """Pods to be co-located with (or kept away from) on a topology (core/v1 PodAffinityTerm)."""

    label_selector: LabelSelector | None = Field(default=None, description="Pods to match.")
    namespace_selector: LabelSelector | None = Field(
        default=None, description="Namespaces whose pods are matched."
    )
    namespaces: list[str] | None = Field(
        default=None, max_length=_MAX_VALUES, description="Namespaces whose pods are matched."
    )
    topology_key: str = Field(
        min_length=1, max_length=_NAME, description="Node label defining the topology domain."
    )
    match_label_keys: list[str] | None = Field(
        default=None, max_length=_MAX_TERMS, description="Pod label keys merged into the selector."
    )
    mismatch_label_keys: list[str] | None = Field(
        default=None,
        max_length=_MAX_TERMS,
        description="Pod label keys merged into the selector as NotIn.",
    )


class WeightedPodAffinityTerm(ApiModel):
    """A weighted pod (anti-)affinity preference (core/v1 WeightedPodAffinityTerm)."""

    weight: int = Field(ge=1, le=100, description="Weight, 1 to 100.")
    pod_affinity_term: PodAffinityTerm = Field(description="The pod affinity term.")


class PodAffinity(ApiModel):
    """Inter-pod affinity (core/v1 PodAffinity and PodAntiAffinity)."""

    required_during_scheduling_ignored_during_execution: list[PodAffinityTerm] | None = Field(
        default=None, max_length=_MAX_TERMS, description="Terms that must hold."
    )
    preferred_during_scheduling_ignored_during_execution: list[WeightedPodAffinityTerm] | None = (
        Field(default=None, max_length=_MAX_TERMS, description="Weighted preferences.")
    )


class Affinity(ApiModel):
    """Scheduling constraints (core/v1 Affinity)."""

    node_affinity: NodeAffinity | None = Field(default=None, description="Node affinity.")
    pod_affinity: PodAffinity | None = Field(default=None, description="Pod affinity.")
    pod_anti_affinity: PodAffinity | None = Field(default=None, description="Pod anti-affinity.")


# ----------------------------------------------------------------------------- env sources
class KeySelector(ApiModel):
    """A key of a ConfigMap or Secret in the CR's namespace (core/v1 *KeySelector)."""

    name: str = Field(default="", max_length=_NAME, description="Name of the object.")
    key: str = Field(min_length=1, max_length=_NAME, description="The key to select.")
    optional: bool | None = Field(default=None, description="Whether it may be missing.")


class ObjectFieldSelector(ApiModel):
    """A field of the pod (core/v1 ObjectFieldSelector)."""

    api_version: str | None = Field(default=None, description="Schema version, default v1.")
    field_path: str = Field(min_length=1, max_length=_NAME, description="Path of the field.")


class ResourceFieldSelector(ApiModel):
    """A resource of a container (core/v1 ResourceFieldSelector)."""

    container_name: str | None = Field(default=None, description="Container; default engine.")
    resource: str = Field(min_length=1, max_length=_NAME, description="Resource to select.")
    divisor: Quantity | None = Field(default=None, description="Output format, e.g. 1Mi.")


class EnvVarSource(ApiModel):
    """Where an environment variable's value comes from (core/v1 EnvVarSource)."""

    field_ref: ObjectFieldSelector | None = Field(default=None, description="A pod field.")
    resource_field_ref: ResourceFieldSelector | None = Field(
        default=None, description="A container resource."
    )
    config_map_key_ref: KeySelector | None = Field(default=None, description="A ConfigMap key.")
    secret_key_ref: KeySelector | None = Field(default=None, description="A Secret key.")


# ----------------------------------------------------------------------------- volume sources
class PvcSource(ApiModel):
    """An existing PersistentVolumeClaim (core/v1 PersistentVolumeClaimVolumeSource)."""

    claim_name: str = Field(min_length=1, max_length=_NAME, description="Name of the claim.")
    read_only: bool | None = Field(default=None, description="Mount read-only (it always is).")


class NfsSource(ApiModel):
    """An NFS export (core/v1 NFSVolumeSource)."""

    server: str = Field(min_length=1, max_length=_NAME, description="NFS server.")
    path: str = Field(min_length=1, max_length=4096, description="Exported path.")
    read_only: bool | None = Field(default=None, description="Mount read-only (it always is).")


class HostPathSource(ApiModel):
    """A host directory (core/v1 HostPathVolumeSource); admin-allowed prefixes only."""

    path: str = Field(min_length=1, max_length=4096, description="Absolute host path.")
    type: (
        Literal[
            "",
            "DirectoryOrCreate",
            "Directory",
            "FileOrCreate",
            "File",
            "Socket",
            "CharDevice",
            "BlockDevice",
        ]
        | None
    ) = Field(default=None, description="Expected type of the host path.")


class LocalObjectReference(ApiModel):
    """An object in the CR's namespace, by name (core/v1 LocalObjectReference)."""

    name: str = Field(min_length=1, max_length=_NAME, description="Name of the object.")


class CsiSource(ApiModel):
    """An inline CSI volume (core/v1 CSIVolumeSource)."""

    driver: str = Field(min_length=1, max_length=_NAME, description="CSI driver name.")
    read_only: bool | None = Field(default=None, description="Mount read-only (it always is).")
    fs_type: str | None = Field(default=None, description="Filesystem type.")
    volume_attributes: dict[str, str] | None = Field(
        default=None, max_length=64, description="Driver-specific attributes."
    )
    node_publish_secret_ref: LocalObjectReference | None = Field(
        default=None, description="Secret with the driver's publish credentials."
    )


class ImageSource(ApiModel):
    """An OCI image or artifact mounted as a volume (core/v1 ImageVolumeSource, k8s >= 1.31)."""

    reference: str = Field(min_length=1, max_length=1024, description="Image reference.")
    pull_policy: Literal["Always", "Never", "IfNotPresent"] | None = Field(
        default=None, description="Pull policy."
    )


class TypedObjectReference(ApiModel):
    """A data source of a claim (core/v1 TypedObjectReference), e.g. a VolumeSnapshot."""

    api_group: str | None = Field(default=None, description="API group of the object.")
    kind: str = Field(min_length=1, max_length=_NAME, description="Kind of the object.")
    name: str = Field(min_length=1, max_length=_NAME, description="Name of the object.")


class StorageRequest(ApiModel):
    """Requested storage of a claim."""

    storage: Quantity = Field(description="Size of the claim.")


class ClaimResources(ApiModel):
    """Storage requested by a claim (core/v1 VolumeResourceRequirements)."""

    requests: StorageRequest = Field(description="The requested storage.")


class EphemeralClaimSpec(ApiModel):
    """The claim of a generic ephemeral volume (core/v1 PersistentVolumeClaimSpec, abridged)."""

    access_modes: list[Literal["ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany",
                               "ReadWriteOncePod"]] = Field(
        min_length=1, max_length=4, description="Access modes."
    )
    resources: ClaimResources = Field(description="Requested storage.")
    storage_class_name: str | None = Field(default=None, description="StorageClass.")
    data_source: TypedObjectReference | None = Field(
        default=None, description="Pre-populate from a snapshot or another claim."
    )
    data_source_ref: TypedObjectReference | None = Field(
        default=None, description="Pre-populate from any populator."
    )


class EphemeralClaimTemplate(ApiModel):
    """Template of a generic ephemeral volume's claim."""

    spec: EphemeralClaimSpec = Field(description="The claim spec.")


class EphemeralSource(ApiModel):
    """A per-pod claim made from a template (core/v1 EphemeralVolumeSource)."""

    volume_claim_template: EphemeralClaimTemplate = Field(description="The claim template.")


class ModelVolumeSource(ApiModel):
    """Where model weights come from: exactly one member (a subset of core/v1 VolumeSource).

    In-tree cloud and legacy volume plugins are not offered: reach them through a
    PersistentVolumeClaim.
    """

    persistent_volume_claim: PvcSource | None = Field(default=None, description="A claim.")
    nfs: NfsSource | None = Field(default=None, description="An NFS export.")
    csi: CsiSource | None = Field(default=None, description="An inline CSI volume.")
    host_path: HostPathSource | None = Field(
        default=None, description="A host directory (admin allow-listed prefixes only)."
    )
    image: ImageSource | None = Field(default=None, description="An OCI image volume.")
    ephemeral: EphemeralSource | None = Field(
        default=None, description="A generic ephemeral volume (e.g. from a snapshot)."
    )

    def kinds(self) -> list[str]:
        """The members set (camelCase), in field order."""
        return [
            str(info.alias)
            for name, info in type(self).model_fields.items()
            if getattr(self, name) is not None
        ]


# ----------------------------------------------------------------------------- rollouts
IN_PLACE = "InPlaceIfPossible"  # the update strategy that restarts engines in place
ROLLING_UPDATE_TYPES_MESSAGE = (
    "rollingUpdate applies to type RollingUpdate or InPlaceIfPossible only"
)


class RollingUpdate(ApiModel):
    """How a RollingUpdate proceeds (apps/v1 RollingUpdateStatefulSetStrategy)."""

    partition: int = Field(
        default=0,
        ge=0,
        le=1024,
        description="Only pods with an ordinal >= partition are updated; lower ones keep the "
        "previous template (a canary: set it to replicas - 1, then lower it).",
    )
    max_unavailable: IntOrPercent | None = Field(
        default=None,
        description="Pods updated at once (a number or a percentage of replicas, rounded "
        "down, at least 1); unset: one at a time. Pods replaced by the StatefulSet need the "
        "MaxUnavailableStatefulSet feature of the cluster (beta and on by default from "
        "Kubernetes 1.35); in-place engine restarts (InPlaceIfPossible) are paced by the "
        "operator itself.",
    )


class UpdateStrategy(ApiModel):
    """How pods move to a new template (any change of env, image, sizes or the L3 layout)."""

    model_config = ConfigDict(
        json_schema_extra={"x-kubernetes-validations": [{
            "rule": "!has(self.rollingUpdate) || !has(self.type) || "
            "self.type == 'RollingUpdate' || self.type == 'InPlaceIfPossible'",
            "message": ROLLING_UPDATE_TYPES_MESSAGE,
        }]}
    )

    type: Literal["RollingUpdate", "OnDelete", "InPlaceIfPossible"] = Field(
        default="RollingUpdate",
        description="RollingUpdate: pods are replaced one by one, each after the previous is "
        "Ready (each replacement reloads the model and refills its pools: minutes per pod). "
        "OnDelete: pods keep running on the old template until you delete them. "
        "InPlaceIfPossible: a change of the engine container alone (spec.image, engine "
        "arguments and env, everything the launcher renders from the ConfigMap) restarts the "
        "engine container of each pod in place: same pod, node, hugepages, volumes and UMBP "
        "sidecars, so a standalone L3 stays warm; pod by pod, rollingUpdate.maxUnavailable at "
        "once, each after the previous is Ready. Any other change replaces the pods like "
        "RollingUpdate, and status.rollout says why.",
    )
    rolling_update: RollingUpdate | None = Field(
        default=None,
        description="Partition and parallelism of a RollingUpdate or an InPlaceIfPossible "
        "rollout.",
    )
