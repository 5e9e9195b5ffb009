"""values.yaml, values.schema.json, the chart README and the operator's config loader agree.

Real: the operator's ``OperatorConfig`` loader and JSON schema, helm's rendering of the
ConfigMap. Nothing is faked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import chart_gen
import jsonschema
import pytest
import yaml
from chartkit import CHART, rendered_operator_config

pytestmark = pytest.mark.chart

VALUES_TEXT = (CHART / "values.yaml").read_text()


def test_every_value_is_documented_in_values_yaml() -> None:
    assert chart_gen.undocumented(VALUES_TEXT) == []


def test_readme_values_table_is_generated_from_values_yaml() -> None:
    readme = (CHART / "README.md").read_text()
    assert readme == chart_gen.render_readme(readme, VALUES_TEXT), (
        "chart README values table is stale: python tests/chart/chart_gen.py --write")


def test_values_schema_is_generated_from_chart_and_operator_config() -> None:
    assert (CHART / "values.schema.json").read_text() == chart_gen.render_schema(), (
        "values.schema.json is stale: python tests/chart/chart_gen.py --write")


def test_schema_covers_exactly_the_keys_of_values_yaml() -> None:
    schema = chart_gen.values_schema()
    values = yaml.safe_load(VALUES_TEXT)
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.Draft7Validator(schema).validate(values)

    def keys(node: dict[str, Any], props: dict[str, Any], prefix: str = "") -> list[str]:
        missing = []
        for key, value in node.items():
            if key not in props:
                missing.append(prefix + key)
            elif isinstance(value, dict) and value and "properties" in props[key]:
                missing += keys(value, props[key]["properties"], f"{prefix}{key}.")
        return missing

    assert keys(values, schema["properties"]) == []
    # every documented schema property has a default in values.yaml (no hidden knobs)
    assert sorted(schema["properties"]) == sorted(values)


def test_rendered_config_loads_in_the_operator_and_equals_its_defaults() -> None:
    from hicache_operator.api.config import OperatorConfig

    config = OperatorConfig.from_mapping(rendered_operator_config(), source="chart")
    assert config == OperatorConfig()


def test_overridden_config_reaches_the_operator(tmp_path: Path) -> None:
    from hicache_operator.api.config import OperatorConfig

    rendered = rendered_operator_config({"operatorConfig": {
        "watchNamespaces": ["models"],
        "logLevel": "DEBUG",
        "policy": {"allowedHostPathPrefixes": ["/mnt/nvme"], "maxHugepagesPerPod": "1Ti",
                   "allowedGpuModels": ["MI355X"]},
        "nodeFacts": {"gpuNuma": [0, 0, 0, 0, 1, 1, 1, 1]},
    }})
    path = tmp_path / "operator.yaml"
    path.write_text(yaml.safe_dump(rendered))
    config = OperatorConfig.from_file(path)
    assert config.watch_namespaces == ["models"]
    assert config.log_level == "DEBUG"
    assert config.policy.allowed_host_path_prefixes == ["/mnt/nvme"]
    assert config.policy.max_hugepages_bytes == 2**40
    assert config.policy.allowed_gpu_models == ["MI355X"]
    assert config.node_facts.numa_of_gpu(5) == 1
    # untouched keys keep the chart defaults
    assert config.policy.allowed_capabilities == ["IPC_LOCK", "SYS_NICE"]
    assert config.policy.allow_privileged is False
