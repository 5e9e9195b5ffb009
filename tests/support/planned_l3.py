"""The planner's L3 for a CR, run for real outside a pod: the engine's ``HICACHE_UMBP_*`` env from
the planned ConfigMap and the ``umbp-dram`` / ``umbp-ssd`` sidecars started as real
``umbp_standalone_server`` processes with the env of the planned StatefulSet (by PID, always
killed). Used by the mori tier and ``bench/soak.py``; only what a test machine cannot hold is
changed by the caller (capacities, directories, the socket directory).
"""

from __future__ import annotations

import copy
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SIDECARS = ("umbp-dram", "umbp-ssd")


@dataclass
class PlannedL3:
    plan: Any  # hicache_operator's Plan
    engine_env: dict[str, str]  # the ConfigMap's data
    sidecars: dict[str, dict[str, str]]  # container name -> env


def planned_l3(example: str, edit: Callable[[dict[str, Any]], None] | None = None,
               config: Any = None) -> PlannedL3:
    """Plan ``examples/<example>`` after ``edit(cr)``."""
    import yaml
    from hicache_operator.api.config import OperatorConfig
    from hicache_operator.plan import plan

    cr: dict[str, Any] = copy.deepcopy(yaml.safe_load((ROOT / "examples" / example).read_text()))
    if edit is not None:
        edit(cr)
    p = plan(cr, config or OperatorConfig())
    cm = dict(next(o for o in p.objects if o["kind"] == "ConfigMap")["data"])
    pod = next(o for o in p.objects if o["kind"] == "StatefulSet")["spec"]["template"]["spec"]
    sidecars = {c["name"]: {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}
                for c in [*pod.get("initContainers", []), *pod["containers"]]
                if c["name"] in SIDECARS}
    return PlannedL3(p, cm, sidecars)


@contextmanager
def running_sidecars(sidecars: dict[str, dict[str, str]], workdir: Path) -> Iterator[Path]:
    """Start every sidecar on ``<workdir>/<medium>.sock`` (logs beside), wait for its socket,
    yield the socket directory; kill them by PID afterwards, also on failure."""
    from hicache_umbp.clients.runtime import mori_loader_prefix, standalone_server_binary

    procs: list[subprocess.Popen[bytes]] = []
    try:
        for name, env in sidecars.items():
            sock = workdir / f"{name.removeprefix('umbp-')}.sock"
            log_path = workdir / f"{name}.log"
            full = {k: v for k, v in os.environ.items() if not k.startswith("UMBP_")} | env
            with open(log_path, "wb") as log:
                procs.append(subprocess.Popen(
                    [*mori_loader_prefix(), standalone_server_binary(), f"unix:{sock}"],
                    env=full, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
            deadline = time.monotonic() + 60
            while not sock.exists():
                if procs[-1].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{name} did not listen: {log_path.read_text()[-3000:]}")
                time.sleep(0.02)
        yield workdir
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=30)


@contextmanager
def planned_stores(planned: PlannedL3, workdir: Path, *, keys: Any, value_bytes: int,
                   dram_bytes: int, ssd_bytes: int) -> Iterator[list[Any]]:
    """The stores the planned pod's ranks would build (``build_store`` from the ConfigMap's
    ``HICACHE_UMBP_*``), on this machine: the DRAM tier cut to ``dram_bytes`` per rank (or the
    DRAM sidecar to ``dram_bytes``), SSD in ``workdir/ssd`` with ``ssd_bytes``, the sidecars
    running (standalone: one store per rank, sharing them; embedded: rank 0's store only, ranks
    share nothing). Closed afterwards, sidecars killed."""
    from contextlib import ExitStack

    from hicache_umbp.build import build_store
    from hicache_umbp.contract.load import load_store_config
    from hicache_umbp.contract.settings import BY_KEY

    env = {k: v for k, v in planned.engine_env.items() if k.startswith("HICACHE_UMBP_")}
    ranks = int(env[BY_KEY["umbp_local_ranks"].env])
    with ExitStack() as stack:
        if env[BY_KEY["umbp_mode"].env] == "standalone":
            planned.sidecars["umbp-ssd"].update(UMBP_SSD_DIR=str(workdir / "ssd"),
                                                UMBP_SSD_CAPACITY=str(ssd_bytes))
            planned.sidecars["umbp-dram"]["UMBP_DRAM_CAPACITY"] = str(dram_bytes)
            sockets = stack.enter_context(running_sidecars(planned.sidecars, workdir))
            env[BY_KEY["umbp_socket_dir"].env] = str(sockets)
        else:
            env[BY_KEY["umbp_dram_bytes"].env] = str(dram_bytes * ranks)
            env[BY_KEY["umbp_ssd_dir"].env] = str(workdir / "ssd")
            env[BY_KEY["umbp_ssd_bytes"].env] = str(ssd_bytes * ranks)
            ranks = 1
        cfg = load_store_config({}, env)
        stores: list[Any] = []
        try:
            for r in range(ranks):
                stores.append(build_store(cfg.rank(r), keys=keys, value_bytes=value_bytes))
            yield stores
        finally:
            for store in stores:
                store.close()
