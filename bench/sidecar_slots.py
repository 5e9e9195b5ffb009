"""How many staging slots one umbp-ssd sidecar needs when the pod's ranks share it.

Run as ``.cache/venvs/engine/bin/engine-python bench/sidecar_slots.py`` (``make
bench-sidecar-slots``). One real ``umbp_standalone_server`` (SSD medium, env from
:func:`hicache_umbp.contract.mori_env.standalone_server_env`) with S staging slots of 1 MiB; N
client processes stand for N ranks of one pod, each with its own client from
:func:`hicache_umbp.clients.factories.make_standalone_client` (one batch in flight per client, as
the store runs). Every round a client puts 16 fresh 1 MiB values in one batch, then reads them back
in one batch, then waits ``gap`` seconds. Puts a batch cannot stage fail (mori 1.2.4), so the failed
puts count how often the ranks starve each other's slots.

Scenarios (the planner's choice of ``2 x 16 x R`` slots, ``planner/sizing.py``):

* ``gap 0.25 s`` (longer than the read lease, see below): cross-rank starvation only;
  16 slots shared vs 16 per rank;
* ``gap 0``: each rank reads and then writes back to back; mori keeps a read batch's slots
  leased for about 0.2 s even with ``UMBP_SSD_READ_LEASE_MS=1``, so a put right after a read
  needs 16 more slots: 16 vs 32 per rank.

Measured 2026-11-30 on a 2-core CPU machine (amd-mori 1.2.4), 10 rounds per client, two runs:
4 ranks, gap 0.25: 16 slots 272-288 of 640 puts failed, 64 slots 0; 8 ranks, gap 0.25: 16 slots
592-640 of 1,280, 128 slots 0; 4 ranks, gap 0: 64 slots 576 of 640, 128 slots 0. Alone, one
client reading 4 batches back to back from 16 slots waits ~0.18 s per batch for the leases, with
UMBP_SSD_READ_LEASE_MS at 1 or 50 alike (1000: ~1.2 s). The last line is one JSON object with
every scenario's failed and total puts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "backend"))

VALUE = 1 << 20
BATCH = 16


def client(sock: str, wid: int, rounds: int, gap: float, start_at: float) -> None:
    """One rank: ``rounds`` x (put 16 values, read them back, sleep ``gap``); prints its count."""
    from hicache_umbp.clients.factories import make_standalone_client
    from hicache_umbp.hostmem.allocator import HostAllocator

    opened = make_standalone_client(sock, "ssd", wait_s=30, value_bytes=VALUE, slot_bytes=VALUE)
    c = opened.client
    alloc = HostAllocator(hugepage_bytes=0, shared=True, prefault=True)
    src, dst = alloc.alloc(BATCH * VALUE), alloc.alloc(BATCH * VALUE)
    c.register_memory(src.ptr, BATCH * VALUE)
    c.register_memory(dst.ptr, BATCH * VALUE)
    while time.time() < start_at:  # every rank starts together
        time.sleep(0.001)
    failed = 0
    for r in range(rounds):
        keys = [f"rank{wid}-round{r}-{i}" for i in range(BATCH)]
        ok = c.batch_put_from_ptr(keys, [src.ptr + i * VALUE for i in range(BATCH)],
                                  [VALUE] * BATCH)
        failed += ok.count(False)
        c.batch_get_into_ptr(keys, [dst.ptr + i * VALUE for i in range(BATCH)], [VALUE] * BATCH)
        time.sleep(gap)
    print(json.dumps({"failed": failed, "puts": rounds * BATCH}), flush=True)
    opened.close()
    src.free()
    dst.free()


def scenario(ranks: int, slots: int, gap: float, rounds: int) -> dict[str, float]:
    """One server with ``slots`` slots and ``ranks`` client processes; failed and total puts."""
    from hicache_umbp.clients.runtime import mori_loader_prefix, standalone_server_binary
    from hicache_umbp.contract.mori_env import standalone_server_env

    with tempfile.TemporaryDirectory(prefix="sidecar-slots-") as tmp:
        sock = os.path.join(tmp, "ssd.sock")
        env = {k: v for k, v in os.environ.items() if not k.startswith("UMBP_")}
        env.update(standalone_server_env(
            "ssd", capacity_bytes=4 << 30, ssd_dir=os.path.join(tmp, "ssd"),
            value_bytes=VALUE, staging_slots=slots,
        ))
        with open(os.path.join(tmp, "server.log"), "wb") as log:
            server = subprocess.Popen(
                [*mori_loader_prefix(), standalone_server_binary(), f"unix:{sock}"],
                env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
        try:
            deadline = time.monotonic() + 60
            while not os.path.exists(sock):
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(Path(tmp, "server.log").read_text(errors="replace"))
                time.sleep(0.05)
            start_at = time.time() + 5 + ranks  # time for every client to connect
            procs = [
                subprocess.Popen(
                    [sys.executable, __file__, "--client", sock, str(w), str(rounds), str(gap),
                     str(start_at)],
                    stdout=subprocess.PIPE, text=True,
                )
                for w in range(ranks)
            ]
            counts = []
            for p in procs:
                out, _ = p.communicate(timeout=600)
                counts.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            server.terminate()
            server.wait(timeout=30)
    return {
        "ranks": ranks, "slots": slots, "gap_s": gap,
        "failed_puts": sum(c["failed"] for c in counts),
        "puts": sum(c["puts"] for c in counts),
    }


SCENARIOS = [(4, 16, 0.25), (4, 64, 0.25), (8, 16, 0.25), (8, 128, 0.25), (4, 64, 0.0),
             (4, 128, 0.0)]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        sock, wid, rounds, gap, start_at = sys.argv[2:7]
        client(sock, int(wid), int(rounds), float(gap), float(start_at))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    results = []
    for ranks, slots, gap in SCENARIOS:
        r = scenario(ranks, slots, gap, args.rounds)
        print(f"{ranks} ranks, {slots} slots ({slots // ranks} per rank), gap {gap} s: "
              f"{r['failed_puts']} of {r['puts']} puts failed", flush=True)
        results.append(r)
    print(json.dumps({"scenarios": results}))


if __name__ == "__main__":
    main()
