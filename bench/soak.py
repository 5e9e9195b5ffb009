"""Soak: interleaved reads and writes on the real UMBP store; acknowledged-then-lost pages
counted beside the throughput, for the data path of this checkout and of a baseline commit.

Run as ``.cache/venvs/engine/bin/engine-python bench/soak.py`` (``make bench-soak``). Per
scenario, one store is built by ``build_store`` from the store config the planner renders for a
CR (``HICACHE_UMBP_*``; the DRAM tier cut to 64 MiB so the pages written outnumber it 5:1, the
SSD directory and capacity moved into a temporary directory, sized to keep every page), over the
real amd-mori 1.2.4 (embedded DRAM + SSD node, or the two planned ``umbp_standalone_server``
sidecars). Two threads use it at once, as SGLang's backup and prefetch threads do:

* the writer writes ``rounds`` batches of fresh pages and records which pages each ``batch_set``
  acknowledged;
* the reader, until the writer is done, reads a batch of pages drawn at random from those
  already acknowledged (a hot set: the most recent quarter half of the time), counting pages it
  could not read (``read_misses``: an acknowledged page must stay readable).

Afterwards the store is flushed and every acknowledged page is read back one by one and compared
byte for byte with what was written: ``lost`` counts those that are missing or differ (must be
0). Throughput: bytes acknowledged by the writer per second of its run, bytes read per second of
the reader's; ``not_stored`` counts pages a ``batch_set`` reported not stored (allowed, never
silent). Counts, not times, are the result: the machine is shared.

The baseline is the data path of commit ``--baseline`` (default: the last commit before the
refused-write fix): its ``backend/`` and ``operator/`` (the planner imports the backend's
contract) taken with ``git archive`` and put first on ``PYTHONPATH`` of its child process; mori,
the scenario and this script are this checkout's (the baseline must have this checkout's module
layout). Each scenario runs in its own child process per data path. The last line is one JSON
object: per scenario both results and the throughput ratios (current / baseline).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
BASELINE = "ac810b8"  # main before the refused-write fix (issue 17), same module layout
MIB = 1 << 20
DRAM = 64 * MIB

SCENARIOS: dict[str, dict[str, Any]] = {
    # 1 MiB MHA parts: 262,144 B/token at TP2, 16 tokens per page; 16 pages per batch.
    "embedded-write_back-1MiB": {"mode": "embedded", "policy": "write_back", "page": "mha"},
    "embedded-write_through-1MiB": {"mode": "embedded", "policy": "write_through",
                                    "page": "mha"},
    "embedded-write_back-R1": {"mode": "embedded", "policy": "write_back", "page": "r1"},
    "standalone-write_back-R1": {"mode": "standalone", "policy": "write_back", "page": "r1"},
}
PAGES = {
    # 160 pages of 2 MiB, 48 of 8.6 MiB: five and six times the 64 MiB DRAM tier.
    "mha": {"example": "llama-3.1-70b-mi355x.yaml", "part": MIB, "parts": 2, "batch": 16,
            "rounds": 10, "tp": {"embedded": 2, "standalone": 2},
            "spec": {"model": {"kvBytesPerToken": 262144}, "engine": {"pageSize": 16}}},
    # MLA over TP needs one shared store: embedded runs TP1, the sidecars serve TP2.
    "r1": {"example": "deepseek-r1-mi355x.yaml", "part": 8_994_816, "parts": 1, "batch": 8,
           "rounds": 6, "tp": {"embedded": 1, "standalone": 2},
           "spec": {"engine": {"pageSize": 128}}},
}


# ----------------------------------------------------------------------------- the child


def planned(sc: dict[str, Any]) -> Any:
    from support.planned_l3 import planned_l3

    page = PAGES[sc["page"]]

    def edit(cr: dict[str, Any]) -> None:
        for section, fields in page["spec"].items():
            cr["spec"][section].update(fields)
        cr["spec"]["l3"]["mode"] = sc["mode"]
        cr["spec"]["engine"]["tensorParallelSize"] = page["tp"][sc["mode"]]
        cr["spec"]["l3"]["tiering"] = {"writePolicy": sc["policy"], "queueSize": "512Mi"}

    return planned_l3(page["example"], edit)


def soak(name: str, seed: int) -> dict[str, Any]:
    import numpy as np
    from hicache_umbp.clients.buffers import MoriShmStaging
    from hicache_umbp.contract.page_limits import MHA_PARTS, MLA_PARTS
    from hicache_umbp.store.keys import KeyScheme
    from support.planned_l3 import planned_stores

    sc = SCENARIOS[name]
    page = PAGES[sc["page"]]
    part, width, batch, rounds = page["part"], page["parts"], page["batch"], page["rounds"]
    n = batch * rounds
    tmp = Path(tempfile.mkdtemp(prefix="hicache-soak-", dir="/var/tmp"))
    stack = contextlib.ExitStack()
    buffers: list[Any] = []
    try:
        keys = KeyScheme("soak", "m", 1, 0, MHA_PARTS if width == 2 else MLA_PARTS)
        stores = stack.enter_context(planned_stores(
            planned(sc), tmp, keys=keys, value_bytes=part, dram_bytes=DRAM, ssd_bytes=4 << 30))
        writer, reader = stores[0], stores[-1]
        page_bytes = width * part
        src = MoriShmStaging(n * page_bytes)
        dst = MoriShmStaging(batch * page_bytes)
        buffers += [src, dst]
        view = np.ctypeslib.as_array((ctypes.c_uint8 * src.size).from_address(src.ptr))
        view[:] = np.random.default_rng(seed).integers(0, 256, src.size, dtype=np.uint8)
        out = np.ctypeslib.as_array((ctypes.c_uint8 * dst.size).from_address(dst.ptr))
        for s in stores:
            s.register_buffer(src.ptr, src.size)
            s.register_buffer(dst.ptr, dst.size)

        def ptrs(base: int, idx: list[int] | range) -> list[list[tuple[int, int]]]:
            return [[(base + (i * width + p) * part, part) for p in range(width)] for i in idx]

        hashes = [f"{seed:08d}-{i:056d}" for i in range(n)]
        acked: list[int] = []
        not_stored = 0
        lock = threading.Lock()
        done = threading.Event()
        reads = {"pages": 0, "misses": 0, "s": 0.0}

        def read_loop() -> None:
            rng = random.Random(seed)
            t0 = time.perf_counter()
            while not done.is_set():
                with lock:
                    have = list(acked)
                if not have:
                    time.sleep(0.001)
                    continue
                pool = have[-max(batch, len(have) // 4):] if rng.random() < 0.5 else have
                pick = rng.sample(pool, min(batch, len(pool)))
                got = reader.batch_get([hashes[i] for i in pick], ptrs(dst.ptr, range(len(pick))))
                reads["pages"] += sum(got)
                reads["misses"] += len(got) - sum(got)
            reads["s"] = time.perf_counter() - t0

        t = threading.Thread(target=read_loop)
        t.start()
        t0 = time.perf_counter()
        for r in range(rounds):
            idx = range(r * batch, (r + 1) * batch)
            got = writer.batch_set([hashes[i] for i in idx], ptrs(src.ptr, idx))
            with lock:
                acked += [i for i, ok in zip(idx, got, strict=True) if ok]
            not_stored += len(got) - sum(got)
        write_s = time.perf_counter() - t0
        done.set()
        t.join()
        flushed = writer.flush()
        lost = []
        for i in acked:
            out[:page_bytes] = 0
            ok = writer.batch_get([hashes[i]], ptrs(dst.ptr, [0]))
            if ok != [True] or not np.array_equal(out[:page_bytes],
                                                  view[i * page_bytes:(i + 1) * page_bytes]):
                lost.append(i)
        st = writer.client.tier_stats()
        tiers = {k: v for k, v in vars(st).items()
                 if k.startswith(("writeback", "ssd_re", "ssd_direct", "ssd_hits", "dram_hits"))}
        return {
            "pages_written": n, "acknowledged": len(acked), "not_stored": not_stored,
            "lost": len(lost), "read_misses": reads["misses"], "pages_read": reads["pages"],
            "write_MBps": round(len(acked) * page_bytes / write_s / 1e6, 1),
            "read_MBps": round(reads["pages"] * page_bytes / max(reads["s"], 1e-9) / 1e6, 1),
            "flushed": flushed, "tiers": tiers,
        }
    finally:
        stack.close()  # the stores deregister the buffers, then they go
        for b in buffers:
            b.close()
        shutil.rmtree(tmp, ignore_errors=True)


# ----------------------------------------------------------------------------- the parent


def baseline_tree(ref: str, into: Path) -> list[Path] | None:
    """``backend/`` and ``operator/`` of ``ref`` extracted under ``into`` (the planner and the
    store of one commit: the planner imports the backend's contract), None where git cannot
    give them."""
    archive = into / "baseline.tar"
    try:
        with open(archive, "wb") as f:
            subprocess.run(["git", "-C", str(ROOT), "archive", ref, "backend", "operator"],
                           stdout=f, check=True, stderr=subprocess.PIPE)
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"no baseline: git archive {ref} failed ({e})", file=sys.stderr)
        return None
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return [into / "backend", into / "operator"]


def run_child(name: str, seed: int, code: list[Path] | None) -> dict[str, Any]:
    env = dict(os.environ)
    if code is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            [*map(str, code), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run([sys.executable, __file__, "--child", name, "--seed", str(seed)],
                          env=env, capture_output=True, text=True, timeout=1800)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", choices=list(SCENARIOS))
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--baseline", default=BASELINE, help="commit of the baseline data path")
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--only", nargs="*", choices=list(SCENARIOS), default=list(SCENARIOS))
    args = ap.parse_args()
    if args.child:
        print(json.dumps(soak(args.child, args.seed)))
        return
    tmp = Path(tempfile.mkdtemp(prefix="hicache-soak-base-"))
    try:
        base = None if args.no_baseline else baseline_tree(args.baseline, tmp)
        summary: dict[str, Any] = {}
        for name in args.only:
            row: dict[str, Any] = {}
            for label, code in (("baseline", base), ("current", None)):
                if label == "baseline" and code is None:
                    continue
                r = run_child(name, args.seed, code)
                row[label] = r
                print(f"{name:30s} {label:8s} acknowledged {r['acknowledged']:4d}/"
                      f"{r['pages_written']:<4d} lost {r['lost']:3d} not stored "
                      f"{r['not_stored']:3d} read misses {r['read_misses']:4d}  write "
                      f"{r['write_MBps']:7.1f} MB/s  read {r['read_MBps']:7.1f} MB/s", flush=True)
            if "baseline" in row:
                b, c = row["baseline"], row["current"]
                row["write_ratio"] = round(c["write_MBps"] / b["write_MBps"], 3) \
                    if b["write_MBps"] else None
                row["read_ratio"] = round(c["read_MBps"] / b["read_MBps"], 3) \
                    if b["read_MBps"] else None
            summary[name] = row
        print(json.dumps({"baseline": None if base is None else args.baseline, **summary}))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
