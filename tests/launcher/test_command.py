"""The rendered SGLang command and environment, the CLI, and the report (fake node trees)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hicache_umbp.contract.load import load_store_config
from hicache_umbp.launch import __main__ as cli
from hicache_umbp.launch.errors import LaunchError
from hicache_umbp.launch.noderoot import NodeRoot
from hicache_umbp.launch.run import plan_launch

from .conftest import io_uring_ok, launch_env
from .fakenode import GIB, MIB, FakeNode

REPO = Path(__file__).resolve().parents[2]


def _plan(node: FakeNode, **env: object):
    return plan_launch(launch_env(**env), NodeRoot(node.root), io_uring_probe=io_uring_ok)


def test_exact_command_and_env_for_eight_gpus_on_two_numa_nodes(mi355x: FakeNode) -> None:
    plan = _plan(mi355x, extra_args=json.dumps(["--mem-fraction-static", "0.85"]))
    extra = (
        '{"backend_name":"umbp","module_path":"hicache_umbp.sglang_adapter",'
        '"class_name":"UMBPHiCacheStorage","interface_v1":1,'
        '"umbp_dram_bytes":68719476736,"umbp_local_ranks":8,"umbp_namespace":"team-a/r1",'
        '"host_numa":[0,0,0,0,1,1,1,1],"umbp_dram_numa":[0,0,0,0,1,1,1,1],'
        # SGLang's own prefetch keys (it pops them before the store sees the object)
        '"prefetch_threshold":256,"prefetch_timeout_base":1.0,"prefetch_timeout_per_ki_token":0.25}'
    )
    assert plan.command.argv == (
        sys.executable, "-m", "hicache_umbp.serve",
        "--model-path", "deepseek-ai/DeepSeek-R1", "--host", "0.0.0.0", "--port", "30000",
        "--tp-size", "8", "--page-size", "64", "--enable-hierarchical-cache",
        "--hicache-size", "214",  # 200 GiB = 214.7 GB, rounded down to whole GB
        "--hicache-mem-layout", "page_first", "--hicache-write-policy", "write_back",
        "--hicache-io-backend", "kernel", "--hicache-storage-prefetch-policy", "timeout",
        "--hicache-storage-backend", "dynamic",
        "--hicache-storage-backend-extra-config", extra,
        "--mem-fraction-static", "0.85",
    )
    assert plan.command.env_overrides == {
        "HICACHE_HOST_NUMA": "0,0,0,0,1,1,1,1",
        "HICACHE_UMBP_DRAM_NUMA": "0,0,0,0,1,1,1,1",
        "SGLANG_SET_CPU_AFFINITY": "0",
        # the default report path's directory (the run volume): SGLang's page-hash build
        "TORCH_EXTENSIONS_DIR": "/var/run/hicache/torch-extensions",
    }
    assert plan.child_env["HICACHE_HOST_NUMA"] == "0,0,0,0,1,1,1,1"
    assert plan.report["numa_placement"] == "bound"
    assert plan.child_env["HICACHE_MODEL_PATH"] == "deepseek-ai/DeepSeek-R1"


def test_extra_config_is_what_the_store_reads_back(mi355x: FakeNode) -> None:
    """The JSON on the command line over the child's env gives the store the launcher's view."""
    plan = _plan(mi355x)
    argv = plan.command.argv
    extra = json.loads(argv[argv.index("--hicache-storage-backend-extra-config") + 1])
    store = load_store_config(extra, plan.child_env)
    assert store.host_numa == (0, 0, 0, 0, 1, 1, 1, 1)
    assert store.umbp_dram_numa == (0, 0, 0, 0, 1, 1, 1, 1)
    assert store.umbp_dram_bytes == (64 * GIB,) * 8
    assert store.umbp_namespace == "team-a/r1"


def test_dp_attention_uses_attn_dp_size_and_sets_dp_size_env(mi355x: FakeNode) -> None:
    plan = _plan(mi355x, dp_size=8, enable_dp_attention=True)
    argv = plan.command.argv
    assert argv[argv.index("--tp-size"):argv.index("--page-size")] == (
        "--tp-size", "8", "--attn-dp-size", "8")
    assert "--dp-size" not in argv and "--enable-dp-attention" not in argv
    assert plan.command.env_overrides["SGLANG_DP_SIZE"] == "8"
    assert "SGLANG_DP_RANK" not in plan.command.env_overrides


def test_plain_data_parallelism_multiplies_ranks(mi355x: FakeNode) -> None:
    plan = _plan(mi355x, tp_size=4, dp_size=2)
    argv = plan.command.argv
    assert argv[argv.index("--tp-size"):argv.index("--page-size")] == (
        "--tp-size", "4", "--dp-size", "2")
    assert "SGLANG_DP_SIZE" not in plan.command.env_overrides


def test_ranks_must_match_tp_and_dp(mi355x: FakeNode) -> None:
    with pytest.raises(LaunchError) as e:
        _plan(mi355x, tp_size=4)
    assert e.value.reason == "InvalidConfig"
    assert str(e.value) == (
        "HICACHE_UMBP_LOCAL_RANKS=8 but HICACHE_TP_SIZE=4 x HICACHE_DP_SIZE=1 runs 4 ranks in "
        "this pod; they must agree (one rank per GPU)")


def test_dp_attention_must_divide_tp(mi355x: FakeNode) -> None:
    with pytest.raises(LaunchError) as e:
        _plan(mi355x, dp_size=3, enable_dp_attention=True)
    assert str(e.value) == (
        "DP attention splits the TP group: HICACHE_TP_SIZE=8 must be a multiple of "
        "HICACHE_DP_SIZE=3")


def test_invalid_variable_is_reported_with_name_value_and_choices(mi355x: FakeNode) -> None:
    env = {**launch_env(), "HICACHE_MEM_LAYOUT": "layer_first"}
    with pytest.raises(LaunchError) as e:
        plan_launch(env, NodeRoot(mi355x.root))
    assert e.value.reason == "InvalidConfig"
    assert "HICACHE_MEM_LAYOUT='layer_first' is not allowed; allowed values: page_first, " \
           "page_first_direct" in str(e.value)


def test_extra_args_may_not_override_rendered_flags(mi355x: FakeNode) -> None:
    with pytest.raises(LaunchError) as e:
        _plan(mi355x, extra_args=json.dumps(["--hicache-size=10", "--tp-size", "2"]))
    assert str(e.value) == (
        "HICACHE_EXTRA_ARGS sets --hicache-size, --tp-size, which the launcher renders from the "
        "CR (spec.engine / spec.hiCache); remove them from spec.engine.extraArgs")


def test_host_pool_size_rules(mi355x: FakeNode) -> None:
    with pytest.raises(LaunchError) as e:
        _plan(mi355x, host_pool_bytes=",".join(["214748364800"] * 7 + ["107374182400"]))
    assert "SGLang takes one --hicache-size for every rank" in str(e.value)
    mi355x.cgroup_v2({2 * MIB: 1600 * GIB})
    with pytest.raises(LaunchError) as e:
        _plan(mi355x, host_pool_bytes=512 * MIB)
    assert str(e.value) == (
        "HICACHE_HOST_POOL_BYTES=536870912 is below 1 GB (10^9 bytes), the unit of SGLang's "
        "--hicache-size; use at least 1000000000 or a ratio")


def test_report_is_written_before_exec(
    mi355x: FakeNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real main() up to the exec; os.execve is replaced by a recorder (the one fake here)."""
    calls: list[tuple[str, list[str], dict[str, str]]] = []

    class Execd(Exception):
        pass

    def fake_execve(path: str, argv: list[str], env: dict[str, str]) -> None:
        calls.append((path, argv, env))
        raise Execd

    monkeypatch.setattr(os, "execve", fake_execve)
    env = launch_env(report_path="/var/run/hicache/report.json")
    with pytest.raises(Execd):
        cli.main(["--node-root", str(mi355x.root)], env)
    path, argv, child_env = calls[0]
    assert path == sys.executable and argv[1:3] == ["-m", "hicache_umbp.serve"]
    assert child_env["HICACHE_HOST_NUMA"] == "0,0,0,0,1,1,1,1"
    report = json.loads(mi355x.p("/var/run/hicache/report.json").read_text())
    assert report["ok"] is True and report["argv"] == argv
    assert report["numa_per_rank"] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_failed_launch_writes_the_reason(mi355x: FakeNode) -> None:
    mi355x.cgroup_v2({2 * MIB: 0})
    env = launch_env(report_path="/var/run/hicache/report.json")
    assert cli.main(["--node-root", str(mi355x.root)], env) == 1
    report = json.loads(mi355x.p("/var/run/hicache/report.json").read_text())
    assert report["ok"] is False and report["reason"] == "HugepagesUnavailable"
    assert report["error"].startswith("host pool needs 8 x 200 GiB = 1600 GiB")
    assert len(report["gpus"]) == 8  # what was resolved before the failure is kept


def _cli(node: FakeNode, *args: str, **env: object) -> subprocess.CompletedProcess[str]:
    child_env = {"PATH": os.environ.get("PATH", ""), **launch_env(**env)}
    return subprocess.run(
        [sys.executable, "-m", "hicache_umbp.launch", "--dry-run", "--node-root",
         str(node.root), *args],
        env=child_env, capture_output=True, text=True, cwd=REPO, timeout=120, check=False)


def test_cli_dry_run_prints_command_and_environment(mi355x: FakeNode) -> None:
    out = _cli(mi355x)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "# command"
    assert lines[1].startswith(f"{sys.executable} -m hicache_umbp.serve --model-path ")
    assert "* HICACHE_HOST_NUMA=0,0,0,0,1,1,1,1" in lines
    assert "  HICACHE_TP_SIZE=8" in lines
    assert not any(line.startswith(("* PATH", "  PATH")) for line in lines)
    steps = [line.split(":")[1].strip() for line in out.stderr.splitlines()]
    assert steps == ["config", "gpus", "standalone", "hugepages", "ssd", "command"]
    assert not mi355x.p("/var/run/hicache").exists()  # a dry run writes no report


def test_cli_dry_run_json_and_exit_code_on_error(mi355x: FakeNode) -> None:
    out = _cli(mi355x, "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["argv"][1:3] == ["-m", "hicache_umbp.serve"]
    assert doc["report"]["ok"] is True and doc["report"]["dry_run"] is True
    bad = _cli(mi355x, tp_size=3)
    assert bad.returncode == 1
    assert bad.stderr.splitlines()[-1].startswith(
        "hicache-launch: error [InvalidConfig]: HICACHE_UMBP_LOCAL_RANKS=8 but HICACHE_TP_SIZE=3")


def test_launcher_rejects_aliases_and_abbreviations_of_owned_flags() -> None:
    """A hand-edited env (not through the planner) gets the same owned-flag rule."""
    from hicache_umbp.launch.command import _check_extra_args
    from hicache_umbp.launch.errors import LaunchError

    for arg in ("--model=/other", "--page-s", "--tp", "--hicache-size=1"):
        with pytest.raises(LaunchError, match="HICACHE_EXTRA_ARGS sets"):
            _check_extra_args((arg,))
    _check_extra_args(("--mem-fraction-static", "0.8", "--trust-remote-code"))


def test_the_page_hash_build_lives_on_the_run_volume_unless_the_image_says_otherwise(
        mi355x: FakeNode) -> None:
    """SGLang JIT-builds its page-hash extension under TORCH_EXTENSIONS_DIR; a restarted
    container has a fresh $HOME, the run volume (the report's directory, an emptyDir) does not
    (hicache_umbp.sglang.page_hash). An image or a CR that sets the variable keeps its own."""
    plan = _plan(mi355x, report_path="/var/run/hicache/launch-report.json")
    assert plan.command.env_overrides["TORCH_EXTENSIONS_DIR"] == "/var/run/hicache/torch-extensions"
    assert plan.child_env["TORCH_EXTENSIONS_DIR"] == "/var/run/hicache/torch-extensions"
    env = launch_env(report_path="/var/run/hicache/launch-report.json")
    env["TORCH_EXTENSIONS_DIR"] = "/opt/sglang-hicache/torch-extensions"
    kept = plan_launch(env, NodeRoot(mi355x.root), io_uring_probe=io_uring_ok)
    assert "TORCH_EXTENSIONS_DIR" not in kept.command.env_overrides
    assert kept.child_env["TORCH_EXTENSIONS_DIR"] == "/opt/sglang-hicache/torch-extensions"
