"""Where the real router sends each request of a trace slice, and whether that is what the
trace model's router (``trace_model/routing.py``) says smg does.

Real: SGLang's model gateway ``smg`` 1.13.0 with the routing arguments the planner renders, its
string tree and worker selection. Faked: the engines (``sglang_standin``: each records every
prompt; one prompt at a time leaves both idle, as the served replay does).
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

from hicache_operator.planner.trace_model import Trace
from hicache_operator.planner.trace_model.replay import block_sizes
from hicache_operator.planner.trace_model.routing import matched_tokens
from router_load_lib import MODEL, free_port, post, started_router
from sglang_standin import SGLangStandIn


def smg_routes(smg: Path, args: list[str], texts: list[str], log: Path,
               ips: tuple[str, str] = ("127.0.0.60", "127.0.0.61")) -> list[int]:
    """The stand-in (0 or 1) a fresh smg started with ``args`` sent each text to, in order."""
    port = free_port()
    urls = [f"http://{ip}:{port}" for ip in ips]
    routes = []
    with ExitStack() as stack:
        workers = [stack.enter_context(SGLangStandIn(ip, port)) for ip in ips]
        base = stack.enter_context(started_router(smg, args, urls, log))
        for text in texts:
            before = [len(w.texts) for w in workers]
            post(base, "/generate", {"model": MODEL, "text": text,
                                     "sampling_params": {"max_new_tokens": 1}})
            got = [i for i, w in enumerate(workers) if len(w.texts) > before[i]]
            assert len(got) == 1, f"a request reached {len(got)} stand-ins"
            routes.append(got[0])
    return routes


def route_counts(trace: Trace, routes: list[int], threshold: float) -> dict[str, int]:
    """Hits (a pod's tree holds more than ``threshold`` of the prompt) and where they went;
    misses and how many went to the pod with fewer requests so far (ties left out)."""
    trees: list[set[int]] = [set(), set()]
    processed = [0, 0]
    out = dict.fromkeys(("hits", "to_best_match", "misses", "misses_unequal",
                         "misses_to_fewer"), 0)
    for req, pod in zip(trace.requests, routes, strict=True):
        sizes = block_sizes(req.input_length, len(req.blocks), trace.block_tokens)
        matched = [matched_tokens(req.blocks, sizes, tree) for tree in trees]
        if max(matched) / req.input_length > threshold:
            out["hits"] += 1
            out["to_best_match"] += matched[pod] == max(matched)
        else:
            out["misses"] += 1
            if processed[0] != processed[1]:
                out["misses_unequal"] += 1
                out["misses_to_fewer"] += processed[pod] < processed[1 - pod]
        processed[pod] += 1
        trees[pod].update(req.blocks)
    return out
