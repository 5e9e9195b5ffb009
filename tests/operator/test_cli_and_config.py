"""The ``python -m hicache_operator`` CLI (plan, crd, api-docs, config-schema), the operator
configuration loader and quantity parsing. Real: the CLI entry point, files on disk, YAML."""

from __future__ import annotations

import json
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest
import yaml
from hicache_operator.api.config import CONFIG_ENV, OperatorConfig, OperatorConfigError
from hicache_operator.api.crd import crd_manifest
from hicache_operator.api.quantity import QuantityError, format_bytes, parse_bytes
from hicache_operator.cli import main
from shc_testlib import ROOT

DEEPSEEK = str(ROOT / "examples/deepseek-r1-mi355x.yaml")


def test_plan_summary(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "-f", DEEPSEEK, "-o", "summary"]) == 0
    out = capsys.readouterr().out
    for fragment in (
        "hugepages-2Mi 1600Gi",
        "amd.com/gpu 8",
        "/dev/shm   32Gi",
        "single-numa-node compatible: NO",
        "--hicache-size 214",
        "StatefulSet/deepseek-r1",
        "umbp-dram: umbp_standalone_server unix:/var/run/umbp/dram.sock",
        "SSD: engine hicache, tier 3 TiB (3298534883328 B); dirs /mnt/umbp-ssd",
        # 3 TiB / 70,272 B per token (MLA: one copy per pod); 200 GiB / 70,272 B; 512 GiB / ..
        "host pool 3,055,959, UMBP DRAM 7,823,255, SSD 46,939,533",
    ):
        assert fragment in out, fragment
    assert "ssd.sock" not in out  # the hicache engine holds the SSD tier: no umbp-ssd sidecar


def test_plan_yaml_is_applyable_manifests(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "-f", DEEPSEEK, "-o", "yaml"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["kind"] for d in docs] == [
        "ConfigMap",
        "Service",
        "Service",
        "StatefulSet",
    ]  # one replica: no PodDisruptionBudget


def test_invalid_cr_prints_every_problem_and_exits_nonzero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cr = yaml.safe_load(Path(DEEPSEEK).read_text())
    cr["spec"]["hiCache"]["memLayout"] = "layer_first"
    cr["spec"]["engine"]["extraArgs"] = ["--page-size=32"]
    cr["spec"]["l3"]["ssd"]["capacity"] = "4Ti"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(cr))
    assert main(["plan", "-f", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "3 problem(s)" in err
    assert "spec.hiCache.memLayout: memLayout layer_first is not allowed" in err
    assert "spec.engine.extraArgs[0]: --page-size" in err
    assert "spec.l3.ssd.capacity: 4Ti" in err


def test_node_facts_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    facts = tmp_path / "facts.yaml"
    facts.write_text("numaNodes: 1\ngpusPerNumaNode: 8\nmemory: 4Ti\n")
    assert main(["plan", "-f", DEEPSEEK, "--node-facts", str(facts)]) == 0
    assert "single-numa-node compatible: yes" in capsys.readouterr().out


def test_bad_node_facts_name_each_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    facts = tmp_path / "facts.yaml"
    facts.write_text("gpusPerNode: 0\nnumaNode: 2\n")
    assert main(["plan", "-f", DEEPSEEK, "--node-facts", str(facts)]) == 2
    err = capsys.readouterr().err
    assert f"{facts}: invalid node facts: gpusPerNode: Input should be greater" in err
    assert "numaNode: Extra inputs are not permitted" in err
    facts.write_text("- 8\n")
    assert main(["plan", "-f", DEEPSEEK, "--node-facts", str(facts)]) == 2
    assert "node facts must be a mapping" in capsys.readouterr().err


def test_config_file_policy_applies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "operator.yaml"
    cfg.write_text(json.dumps({"policy": {"maxHugepagesPerPod": "1Ti"}}))
    assert main(["plan", "-f", DEEPSEEK, "--config", str(cfg)]) == 1
    assert "maxHugepagesPerPod 1Ti" in capsys.readouterr().err


def test_crd_subcommand_writes_the_generated_crd(tmp_path: Path) -> None:
    out = tmp_path / "crd.yaml"
    assert main(["crd", "-o", str(out)]) == 0
    assert yaml.safe_load(out.read_text()) == crd_manifest()


def test_config_schema_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config-schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert "policy" in schema["properties"]


def test_module_entry_point_runs_from_the_venv() -> None:
    """``python -m hicache_operator plan -f FILE`` as the acceptance check calls it."""
    proc = subprocess.run(
        [sys.executable, "-m", "hicache_operator", "plan", "-f", DEEPSEEK],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "SGLangHiCache inference/deepseek-r1" in proc.stdout


def test_operator_config_from_file_and_env(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "defaultImage: reg/engine:2\npolicy:\n  allowHostIPC: true\n"
        "  allowedHostPathPrefixes: [/mnt]\nnodeFacts:\n  memory: 2Ti\n"
        "watchNamespaces: [a, b]\nlogLevel: DEBUG\n"
    )
    cfg = OperatorConfig.from_env({CONFIG_ENV: str(path)})
    assert cfg.default_image == "reg/engine:2"
    assert cfg.policy.allow_host_ipc is True
    assert cfg.node_facts.memory_bytes == 2 * 1024**4
    assert cfg.watch_namespaces == ["a", "b"]
    assert OperatorConfig.from_env({}) == OperatorConfig()
    # HICACHE_* is the pod's prefix: the operator must not read its config from it.
    assert OperatorConfig.from_env({"HICACHE_OPERATOR_CONFIG": str(path)}) == OperatorConfig()


def test_operator_config_errors_name_the_field(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("policy:\n  maxHugepagesPerPod: 10 Gi\n  allowPrivilegd: true\n")
    with pytest.raises(OperatorConfigError, match=r"policy\.maxHugepagesPerPod") as err:
        OperatorConfig.from_file(path)
    assert "policy.allowPrivilegd" in str(err.value)
    with pytest.raises(OperatorConfigError, match="cannot read"):
        OperatorConfig.from_file(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("200Gi", 200 * 2**30),
        ("3Ti", 3 * 2**40),
        ("1.5Ki", 1536),
        ("500G", 500 * 10**9),
        ("1e9", 10**9),
        ("1E3", 1000),
        (".5Mi", 2**19),
        ("0", 0),
        (1234, 1234),
        ("+1k", 1000),
    ],
)
def test_quantities_parse_exactly(text: str | int, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(
    "bad", ["10 Gi", "10GiB", "1.5", "100m", "-1Gi", "Gi", "", True, 1.5, -1, "1e-3"]
)
def test_bad_quantities_are_rejected(bad: object) -> None:
    with pytest.raises(QuantityError):
        parse_bytes(bad)  # type: ignore[arg-type]


def test_format_bytes_round_trips() -> None:
    for n in (0, 1, 1000, 2**20, 3 * 2**40, 214748364800, 10**12 + 7):
        assert parse_bytes(format_bytes(n)) == n
    assert format_bytes(200 * 2**30) == "200Gi"
    assert Fraction(parse_bytes("2.5Gi")) == Fraction(5 * 2**29)


KEPT_SSD = "SSD pages kept (the hicache SSD tier's slot files and index stay on the volume"


@pytest.mark.parametrize("example,engine,says", [
    ("llama-3.1-70b-mi355x.yaml", "mori", ["engine restart: kept"]),  # standalone sidecars
    ("llama-3.1-405b-mi355x.yaml", "mori", ["engine restart: lost"]),  # embedded DRAM + SSD
    ("llama-3.1-70b-mi355x.yaml", "hicache",
     ["engine restart: DRAM pages kept", f"; {KEPT_SSD}", "pod restart (same node and volume): "
      "DRAM pages lost (every container of the pod starts afresh); " + KEPT_SSD]),
    ("llama-3.1-405b-mi355x.yaml", "hicache",
     ["engine restart: DRAM pages lost", "pod restart (same node and volume): DRAM pages lost "
      "(the DRAM pool lives in the process that restarts); " + KEPT_SSD]),
])
def test_plan_summary_says_what_survives_a_restart(
        example: str, engine: str, says: list[str], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The summary's "Warm L3 cache" line for each SSD engine: mori discards its files at
    start, the hicache engine opens them again (plan only; the restarts themselves are
    measured by the backend's and the pod tier's tests)."""
    cr = yaml.safe_load((ROOT / "examples" / example).read_text())
    cr["spec"]["l3"]["ssd"]["engine"] = engine
    path = tmp_path / example
    path.write_text(yaml.safe_dump(cr))
    assert main(["plan", "-f", str(path), "-o", "summary"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("Warm L3"))
    assert all(s in line for s in says) and "reschedule: lost" in line, line
    assert ("discards" in line) == (engine == "mori"), line
