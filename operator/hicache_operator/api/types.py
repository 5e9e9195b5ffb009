"""Shared field types of the API models and the Kubernetes schema each one maps to in the CRD."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
)
from pydantic.alias_generators import to_camel

from .quantity import QUANTITY_PATTERN, parse_bytes

GROUP = "hicache.sglang.ai"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "SGLangHiCache"
PLURAL = "sglanghicaches"
SINGULAR = "sglanghicache"
SHORT_NAMES = ("shc",)

GpuModelName = Literal["MI355X", "MI350X", "MI325X", "MI300X"]
GPU_MODEL_NAMES: tuple[GpuModelName, ...] = ("MI355X", "MI350X", "MI325X", "MI300X")
HugePageSize = Literal["2Mi", "1Gi", "none"]


class ApiModel(BaseModel):
    """Base of every API model: camelCase on the wire, unknown fields rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans_for_integers(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic's lax mode reads true/false as 1/0 (`replicas: true` would be one pod), "8"
        # as 8 and 0/1/"yes" as booleans; the CRD's `type: integer` / `type: boolean` refuse
        # them, and so does `plan -f` (what the planner accepts, the API server accepts).
        field = cls.model_fields.get(info.field_name or "")
        if field and field.annotation in _INTEGER_ANNOTATIONS:
            if isinstance(value, bool):
                raise ValueError(f"{value!r} is a boolean, not an integer")
            if isinstance(value, str):
                raise ValueError(f"{value!r} is a string, not an integer")
        if (field and field.annotation in _BOOLEAN_ANNOTATIONS and value is not None
                and not isinstance(value, bool)):
            raise ValueError(f"{value!r} is not a boolean (true or false)")
        return value


_INTEGER_ANNOTATIONS: tuple[Any, ...] = (int, int | None)
_BOOLEAN_ANNOTATIONS: tuple[Any, ...] = (bool, bool | None)


def _reject_bool(value: Any) -> Any:
    # pydantic's lax int mode turns true/false into 1/0: `hostPoolPerRank: false` must not
    # become a 0-byte pool, nor `cpu: true` one CPU.
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is a boolean, not a quantity or number")
    return value


def _check_quantity(value: int | str) -> int | str:
    parse_bytes(value, field="value")
    return value


def _check_auto_quantity(value: int | str) -> int | str:
    if value == "auto":
        return value
    return _check_quantity(value)


def _check_auto_int(value: int | str) -> int | str:
    if value == "auto":
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)  # "8" is what the CRD pattern admits for an int-or-string
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{value!r} is neither 'auto' nor a whole number of CPUs >= 1")
    return value


_INT_OR_STRING: dict[str, Any] = {
    "x-kubernetes-int-or-string": True,
    "anyOf": [{"type": "integer"}, {"type": "string"}],
}

# A byte quantity as Kubernetes writes it: 200Gi, 3Ti, 500G or a plain integer. Kept verbatim in
# the CR; the planner converts it to exact bytes.
Quantity = Annotated[
    int | str,
    BeforeValidator(_reject_bool),
    AfterValidator(_check_quantity),
    WithJsonSchema({**_INT_OR_STRING, "pattern": QUANTITY_PATTERN}),
]
AutoQuantity = Annotated[
    int | str,
    BeforeValidator(_reject_bool),
    AfterValidator(_check_auto_quantity),
    WithJsonSchema({**_INT_OR_STRING, "pattern": f"^auto$|{QUANTITY_PATTERN}"}),
]
AutoCpu = Annotated[
    int | str,
    BeforeValidator(_reject_bool),
    AfterValidator(_check_auto_int),
    WithJsonSchema({**_INT_OR_STRING, "pattern": "^(auto|[1-9][0-9]*)$"}),
]

def _check_int_or_percent(value: int | str) -> int | str:
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is a boolean, not a number or percentage")
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"{value} must be at least 1")
        return value
    if not (value.endswith("%") and value[:-1].isdigit() and 1 <= int(value[:-1]) <= 100):
        raise ValueError(f"{value!r} is neither a whole number >= 1 nor a percentage 1%-100%")
    return value


# A count of pods or a percentage of replicas (intstr.IntOrString), e.g. 2 or "25%".
IntOrPercent = Annotated[
    int | str,
    BeforeValidator(_reject_bool),
    AfterValidator(_check_int_or_percent),
    WithJsonSchema({**_INT_OR_STRING, "pattern": "^([1-9][0-9]*%?)$"}),
]

# apimachinery's DNS-1123 subdomain (object names such as a PriorityClass): lower-case
# alphanumerics, '-' and '.', starting and ending alphanumeric, at most 253 characters.
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


class Toleration(ApiModel):
    """A Kubernetes toleration (core/v1 Toleration)."""

    key: str | None = Field(
        default=None,
        description="Taint key to tolerate; empty with operator "
        "Exists tolerates every taint (including amd-gpu-unhealthy).",
    )
    operator: Literal["Exists", "Equal"] | None = Field(
        default=None, description="Exists or Equal (default Equal)."
    )
    value: str | None = Field(default=None, description="Taint value for operator Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to match; empty matches all effects."
    )
    toleration_seconds: int | None = Field(
        default=None,
        description="For NoExecute: how long the pod stays bound after the taint appears.",
    )

    def as_k8s(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)


def cel_rules(*rules: tuple[str, str]) -> ConfigDict:
    """A model's cross-field rules as CEL ``x-kubernetes-validations`` (rule, message)."""
    return ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [{"rule": r, "message": m} for r, m in rules]
        }
    )
