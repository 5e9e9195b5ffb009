"""The backend's public names (``hicache_umbp.contract.names``) are the ones every consumer uses:
pyproject's plugin entry point, the engine image, the operator's CR models, the launcher's
extra-config, and the thin public modules that keep each name loadable.

Real: the files themselves (pyproject.toml, the Dockerfile, the public modules' source) and the
import system's module lookup; torch and sglang are not in this interpreter, so the public
modules are read, not imported (the sglang tier imports them: tests/launcher/
test_launch_sglang.py loads the adapter by its rendered module path).
"""

from __future__ import annotations

import ast
import importlib.util
import typing
from pathlib import Path

import pytest
import tomllib
from hicache_operator.api.l3 import L3
from hicache_umbp.contract import builtin, names

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def test_the_plugin_entry_point_is_the_public_hook() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    plugins = project["entry-points"]["sglang.srt.plugins"]
    assert plugins == {"hicache_umbp": names.PLUGIN_ENTRY_POINT}


def test_the_engine_image_runs_the_launcher_by_its_name() -> None:
    dockerfile = (ROOT / "images/engine/Dockerfile").read_text()
    assert f'ENTRYPOINT ["python3", "-m", "{names.LAUNCH_MODULE}"]' in dockerfile


@pytest.mark.parametrize("module", [names.LAUNCH_MODULE, names.SERVE_MODULE,
                                    names.ADAPTER_MODULE,
                                    names.PLUGIN_ENTRY_POINT.split(":")[0]])
def test_every_public_name_resolves_to_a_module(module: str) -> None:
    assert importlib.util.find_spec(module) is not None


def _imported_names(module: str) -> dict[str, str]:
    """``name -> module`` of the ``from M import name`` statements of a public module."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None
    tree = ast.parse(Path(spec.origin).read_text())
    return {a.name: str(n.module) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
            for a in n.names}


def test_the_public_modules_re_export_the_implementation() -> None:
    adapter = _imported_names(names.ADAPTER_MODULE)
    assert adapter[names.ADAPTER_CLASS] == "hicache_umbp.sglang.adapter"
    module, attribute = names.PLUGIN_ENTRY_POINT.split(":")
    assert _imported_names(module)[attribute] == "hicache_umbp.sglang.hook"


def test_the_extra_config_loads_our_adapter() -> None:
    extra = names.dynamic_extra_config(umbp_dram_bytes=1)
    assert (extra["backend_name"], extra["module_path"], extra["class_name"]) == (
        names.BACKEND_NAME, names.ADAPTER_MODULE, names.ADAPTER_CLASS)
    assert extra["interface_v1"] == 1 and extra["umbp_dram_bytes"] == 1


def test_the_crs_backend_choices_are_the_contracts() -> None:
    choices = typing.get_args(L3.model_fields["backend"].annotation)
    assert choices == builtin.L3_BACKENDS
