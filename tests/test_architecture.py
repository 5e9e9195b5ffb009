"""The layout as a property of the code: no import circles, what the operator loads from the
backend, and the size of product modules. The layers themselves are import-linter contracts
(``[tool.importlinter]`` in pyproject.toml, run by ``make lint``).

Real: grimp's import graph of both packages (every import statement, function-level ones too)
and real interpreters importing the operator; nothing is faked.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import grimp
import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("hicache_umbp", "hicache_operator")
#: What the operator may load from the backend: the env contract and the launcher's command.
OPERATOR_MAY_LOAD = ("hicache_umbp.contract", "hicache_umbp.launch.command",
                     "hicache_umbp.launch.builtin", "hicache_umbp.launch.errors")
#: Lines above which a product module must say in its docstring why it is one module.
MAX_LINES = 450


def strongly_connected(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one node (the import circles)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def package_graph() -> dict[str, set[str]]:
    graph = grimp.build_graph(*PACKAGES)
    return {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}


def bench_graph() -> dict[str, set[str]]:
    """bench/ scripts import each other by plain module name (the directory is on sys.path)."""
    scripts = {p.stem: p for p in (ROOT / "bench").glob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in scripts.items():
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module.split(".")[0])
        graph[name] = imported & set(scripts)
    return graph


def test_strongly_connected_finds_a_circle() -> None:
    """The check can fail: a circle through three modules is found, a chain is not."""
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [
        ["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_module_imports_itself_through_others() -> None:
    assert strongly_connected(package_graph()) == []


def test_no_bench_script_imports_itself_through_others() -> None:
    assert strongly_connected(bench_graph()) == []


def _loaded_by(*imports: str) -> dict[str, list[str]]:
    code = (
        "import importlib, json, sys\n"
        f"for name in {list(imports)!r}:\n"
        "    importlib.import_module(name)\n"
        f"packages = {list(PACKAGES)!r}\n"
        "print(json.dumps({p: sorted(m for m in sys.modules if m.split('.')[0] == p)\n"
        "                  for p in packages}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout
    loaded: dict[str, list[str]] = json.loads(out)
    return loaded


def _outside_the_contract(modules: Iterable[str]) -> list[str]:
    return [m for m in modules if m not in ("hicache_umbp", "hicache_umbp.launch")
            and not any(m == a or m.startswith(a + ".") for a in OPERATOR_MAY_LOAD)]


def test_planning_loads_only_the_contract_and_the_launch_command() -> None:
    """``import hicache_operator.planner`` used to load 27 backend modules (the store, the tiers,
    write-back, the reaper, the whole launcher) through ``launch/__init__``. Planning a CR (the
    planner's rules, the builders and ``hicache_operator.plan``) now loads the env contract and
    the launcher's command renderer only."""
    loaded = _loaded_by("hicache_operator.planner", "hicache_operator.plan",
                        *(f"hicache_operator.planner.{p.stem}"
                          for p in (ROOT / "operator/hicache_operator/planner").glob("*.py")))
    backend = loaded["hicache_umbp"]
    assert _outside_the_contract(backend) == [], backend
    assert "hicache_umbp.launch.command" in backend  # it really renders the command


def test_the_whole_operator_loads_only_the_contract_and_the_launch_command() -> None:
    base = ROOT / "operator"
    modules = [".".join(p.relative_to(base).with_suffix("").parts)
               for p in (base / "hicache_operator").rglob("*.py")
               if p.name not in ("__main__.py", "__init__.py")]
    backend = _loaded_by(*modules)["hicache_umbp"]
    assert _outside_the_contract(backend) == [], backend


def test_product_modules_stay_small_or_say_why() -> None:
    too_long = []
    for package in ("backend/hicache_umbp", "operator/hicache_operator"):
        for path in (ROOT / package).rglob("*.py"):
            text = path.read_text()
            doc = ast.get_docstring(ast.parse(text)) or ""
            if len(text.splitlines()) > MAX_LINES and "One module because" not in doc:
                too_long.append(str(path.relative_to(ROOT)))
    assert too_long == []
