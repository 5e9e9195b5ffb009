"""The launcher with SGLang's built-in ``mori`` backend (``HICACHE_L3_BACKEND=sglang-mori``):
the same launch flow (GPUs -> NUMA, hugepages, sidecar wait), SGLang's own flag, extra-config
and variables (fake node trees; SGLang's own parser takes the command in
test_launch_sglang.py, and the pod tier serves with it)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
from hicache_umbp.contract.builtin import PREFAULT_THREADS_REFUSAL, SSD_REFUSAL
from hicache_umbp.contract.settings import (
    PREFETCH_POLICY,
    PREFETCH_THRESHOLD,
    PREFETCH_TIMEOUT_BASE_S,
    PREFETCH_TIMEOUT_PER_KI_S,
)
from hicache_umbp.launch.builtin import scheduler_numa_env
from hicache_umbp.launch.errors import LaunchError
from hicache_umbp.launch.noderoot import NodeRoot
from hicache_umbp.launch.run import plan_launch

from .conftest import io_uring_ok, launch_env, listen_on
from .fakenode import GIB, MIB, FakeNode
from .test_command import REPO

BUILTIN = "sglang-mori"


def _plan(node: FakeNode, **env: object):
    return plan_launch(launch_env(l3_backend=BUILTIN, **env), NodeRoot(node.root),
                       io_uring_probe=io_uring_ok)


def _storage_args(argv: tuple[str, ...]) -> tuple[str, dict[str, object]]:
    backend = argv[argv.index("--hicache-storage-backend") + 1]
    extra = json.loads(argv[argv.index("--hicache-storage-backend-extra-config") + 1])
    # SGLang's own prefetch keys reach the built-in backend's extra-config too (SGLang pops
    # them before the backend sees it): the contract's defaults here.
    prefetch = {k: extra.pop(k) for k in ("prefetch_threshold", "prefetch_timeout_base",
                                          "prefetch_timeout_per_ki_token")}
    assert prefetch == {"prefetch_threshold": PREFETCH_THRESHOLD,
                        "prefetch_timeout_base": PREFETCH_TIMEOUT_BASE_S,
                        "prefetch_timeout_per_ki_token": PREFETCH_TIMEOUT_PER_KI_S}
    assert argv[argv.index("--hicache-storage-prefetch-policy") + 1] == PREFETCH_POLICY
    return backend, extra


def test_embedded_on_two_numa_nodes(mi355x: FakeNode) -> None:
    """One process-wide NUMA variable cannot hold 8 ranks on 2 nodes: it is left out, and the
    per-rank list goes to HICACHE_* for the hook to set in each scheduler."""
    plan = _plan(mi355x)
    argv = plan.command.argv
    assert argv[1:3] == ("-m", "hicache_umbp.serve")
    assert _storage_args(argv) == ("mori", {"ssd_enabled": False,
                                            "dram_capacity_bytes": 64 * GIB})
    assert plan.command.env_overrides == {
        "HICACHE_HOST_NUMA": "0,0,0,0,1,1,1,1",
        "HICACHE_UMBP_DRAM_NUMA": "0,0,0,0,1,1,1,1",
        "SGLANG_HICACHE_HOST_HUGEPAGE": "1",
        "SGLANG_HICACHE_HOST_HUGEPAGE_SIZE": str(2 * MIB),
        "SGLANG_HICACHE_HOST_PREFAULT": "1",
        "UMBP_DRAM_USE_HUGEPAGES": "0",
        "UMBP_DRAM_PREFAULT": "1",
        "SGLANG_SET_CPU_AFFINITY": "0",
        # the default report path's directory (the run volume): SGLang's page-hash build
        "TORCH_EXTENSIONS_DIR": "/var/run/hicache/torch-extensions",
    }
    assert "--hicache-size" in argv and argv[argv.index("--hicache-size") + 1] == "214"


def test_embedded_on_one_numa_node_renders_the_node(mi355x: FakeNode) -> None:
    plan = _plan(mi355x, tp_size=4, umbp_local_ranks=4, host_pool_bytes=100 * GIB,
                 umbp_dram_hugepage_bytes=2 * MIB)
    env = plan.command.env_overrides
    assert env["SGLANG_HICACHE_HOST_NUMA_NODE"] == "0"
    assert env["UMBP_DRAM_NUMA_NODE"] == "0"
    assert env["UMBP_DRAM_USE_HUGEPAGES"] == "1"
    assert env["UMBP_DRAM_HUGEPAGE_SIZE"] == str(2 * MIB)


@pytest.fixture
def sidecar(mi355x: FakeNode, listeners: list[socket.socket]) -> None:
    """A listening DRAM sidecar (both of its sockets) under /run/umbp."""
    for path in ("/run/umbp/dram.sock", "/run/umbp/dram.sock.fd.sock"):
        listen_on(mi355x, path, listeners)


def test_standalone_waits_for_the_dram_sidecar_and_points_every_rank_at_it(
    mi355x: FakeNode, sidecar: None
) -> None:
    plan = _plan(mi355x, umbp_mode="standalone", umbp_dram_bytes=None,
                 umbp_socket_dir="/run/umbp")
    assert plan.report["standalone"]["sockets"] == ["/run/umbp/dram.sock",
                                                    "/run/umbp/dram.sock.fd.sock"]
    assert _storage_args(plan.command.argv) == ("mori", {"ssd_enabled": False})
    env = plan.command.env_overrides
    assert env["UMBP_STANDALONE_ADDRESS"] == "unix:/run/umbp/dram.sock"
    assert env["UMBP_STANDALONE_AUTO_START"] == "0"
    assert not any(k.startswith("UMBP_DRAM_") for k in env)  # the sidecar owns the tier


def test_four_k_fallback_turns_sglangs_hugepages_off(mi355x: FakeNode) -> None:
    mi355x.cgroup_v2({2 * MIB: 0})
    plan = _plan(mi355x, host_allow_4k_fallback=True)
    env = plan.command.env_overrides
    assert env["SGLANG_HICACHE_HOST_HUGEPAGE"] == "0"
    assert "SGLANG_HICACHE_HOST_HUGEPAGE_SIZE" not in env
    assert "hugepages->4KiB" in plan.report["fallbacks"]


def test_short_hugepages_fail_before_sglang_could_demote_silently(mi355x: FakeNode) -> None:
    mi355x.cgroup_v2({2 * MIB: 0})
    with pytest.raises(LaunchError) as e:
        _plan(mi355x)
    assert e.value.reason == "HugepagesUnavailable"


@pytest.mark.parametrize(("env", "needle"), [
    ({"umbp_ssd_enabled": True, "umbp_ssd_dir": "/mnt/umbp-ssd",
      "umbp_ssd_bytes": 1 << 40},
     f"HICACHE_UMBP_SSD_ENABLED=true with HICACHE_L3_BACKEND=sglang-mori: {SSD_REFUSAL}"),
    ({"host_prefault_threads": 8},
     "HICACHE_HOST_PREFAULT_THREADS=8 with HICACHE_L3_BACKEND=sglang-mori: "
     f"{PREFAULT_THREADS_REFUSAL}"),
    ({"umbp_dram_bytes": ",".join([str(64 * GIB)] * 7 + [str(32 * GIB)])},
     "SGLang's built-in backend takes one dram_capacity_bytes for every rank"),
])
def test_what_the_builtin_backend_cannot_do_is_refused(
    mi355x: FakeNode, env: dict[str, object], needle: str
) -> None:
    with pytest.raises(LaunchError) as e:
        _plan(mi355x, **env)
    assert e.value.reason == "InvalidConfig"
    assert needle in str(e.value)


def test_unknown_backend_names_the_choices(mi355x: FakeNode) -> None:
    with pytest.raises(LaunchError) as e:
        plan_launch(launch_env(l3_backend="mori"), NodeRoot(mi355x.root))
    assert "HICACHE_L3_BACKEND='mori' is not allowed; allowed values: umbp, sglang-mori" \
        in str(e.value)


def test_scheduler_numa_env_is_the_ranks_own_node() -> None:
    env = launch_env(umbp_local_ranks=3, host_numa="0,1,-1", umbp_dram_numa="1,0,1")
    assert scheduler_numa_env(env, 1) == {"SGLANG_HICACHE_HOST_NUMA_NODE": "1",
                                          "UMBP_DRAM_NUMA_NODE": "0"}
    assert scheduler_numa_env(env, 2) == {"SGLANG_HICACHE_HOST_NUMA_NODE": None,
                                          "UMBP_DRAM_NUMA_NODE": "1"}
    assert scheduler_numa_env({"PATH": "/bin"}, 0) == {}  # not our launcher: hands off


def test_cli_dry_run_shows_the_builtin_command(mi355x: FakeNode) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "hicache_umbp.launch", "--dry-run", "--node-root",
         str(mi355x.root)],
        env={"PATH": "/usr/bin:/bin", **launch_env(l3_backend=BUILTIN, tp_size=4,
                                                   umbp_local_ranks=4)},
        capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "--hicache-storage-backend mori --hicache-storage-backend-extra-config" in lines[1]
    assert "* SGLANG_HICACHE_HOST_NUMA_NODE=0" in lines
    assert "* SGLANG_HICACHE_HOST_HUGEPAGE_SIZE=2097152" in lines
    assert "L3 sglang-mori embedded" in out.stderr
