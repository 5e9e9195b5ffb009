"""A scaled slice of the Mooncake conversation trace replayed through served CPU pods, beside the
trace model's prediction for the same capacities (issue 26, the served check).

* :func:`served_cr` -- the CPU example with every tier smaller than the slice's working set:
  the device KV pool by ``--max-total-tokens``, the host pool by ``spec.hiCache.hostPoolRatio``
  (``hostPoolPerRank`` is whole GB in SGLang, ~2 M tokens of the tiny model: it could not
  evict), UMBP DRAM by ``spec.l3.dram.capacity``, the SSD tier by ``spec.l3.ssd.capacity``;
* :func:`capacity_of` -- the tiers in tokens as the served pod really has them: the device pool
  and the host pool as SGLang 0.5.23 sizes them, L3 with the planner's own sizing
  (``trace_model.pod_model``), in whole pages;
* :func:`replay` -- the slice's prompts (``trace_model.prompt_ids``) sent one at a time, hits per
  tier from each response's ``meta_info`` and, for the L3 split, the store's
  ``hicache_umbp_l3_read_pages_total{tier}`` on ``/metrics``;
* :func:`with_store_sets` -- the policies with the SSD tier's own page -> set map for the slice
  (:func:`store_set_hash`), from SGLang's page hashes and the key prefixes the pod's store
  logged (:func:`store_key_prefixes`), so the model keeps the pages in the sets the store does
  (``Policy.ssd_set_hash``).
"""

from __future__ import annotations

import ast
import json
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hicache_operator.planner.trace_model import (
    Policy,
    TierTokens,
    Trace,
    load_trace,
    pod_model,
    pressure_capacities,
    prompt_ids,
    scale_trace,
)
from hicache_operator.planner.trace_model.capacity import MORI_DRAM_PAGE_BYTES

from .harness import load_cr

PAGE = 16  # the CPU example's pageSize; one trace block (512 tokens) becomes one page
KV_BYTES_PER_TOKEN = 512  # the tiny Llama: 2 layers x 2 KV heads x head dim 32 x bf16 x (K, V)
L3_TIERS = ("dram", "ssd")


def trace_slice(count: int, start: int = 0) -> Trace:
    """The slice at one page per trace block, each request asking one output token as the
    replay does (the model's router counts a request in flight for its output)."""
    sliced = scale_trace(load_trace("mooncake-conversation"), PAGE, start=start, count=count)
    return replace(sliced, requests=tuple(replace(r, output_length=1) for r in sliced.requests))


def served_cr(trace: Trace, *, name: str = "tiny-llama", port: int = 30000,
              write_policy: str = "write_through") -> dict[str, Any]:
    """The CPU example with its tiers at ``pressure_capacities`` of the slice (the device pool
    at least the longest prompt and 4 pages), the host pool as its ratio to the device pool."""
    cap = pressure_capacities(trace, PAGE)
    longest = max(r.input_length for r in trace.requests)
    device = max(cap.device, -(-longest // PAGE) * PAGE + 4 * PAGE)
    cr = load_cr("cpu/tiny-llama-embedded.yaml")
    cr["metadata"]["name"] = name
    spec = cr["spec"]
    spec["model"].update(attention="mha", kvBytesPerToken=KV_BYTES_PER_TOKEN)
    args = list(spec["engine"]["extraArgs"])
    args[args.index("--max-total-tokens") + 1] = str(device)
    spec["engine"].update(pageSize=PAGE, port=port, extraArgs=args)
    # write_through (SGLang's own default): under the operator's default write_back a page
    # gets a host copy only when the device evicts it, and SGLang asks L3 only past a match
    # ending at a page with a host copy, so behind this trace's hot first block (on the
    # device for good) L3 would never be read (the model knows: trace_model.pod).
    # A pool sized by ratio cannot be backed by hugepages (the operator cannot count them
    # before SGLang sees its device pool): 4 KiB pages, and the memory limit SGLang's
    # host-memory check then wants (its 10 GiB reserve + the process).
    spec["hiCache"] = {"hostPoolRatio": round(cap.host / device, 3),
                       "writePolicy": write_policy,
                       "allowWriteThrough": write_policy != "write_back",
                       "hostAllocator": {"hugePageSize": "none"}}
    spec["resources"]["memory"] = "16Gi"
    l3 = spec["l3"]
    # DRAM -> SSD written inside each put (not by the write-back ring's thread): what the SSD
    # tier holds, and what a read finds in the ring, must not depend on how fast two busy cores
    # drain it (three runs with the ring: 24,048, 24,048 and 25,552 L3 tokens).
    l3["tiering"] = {"writePolicy": "write_through"}
    # mori's DRAM tier takes a whole 64 KiB page per key: the tiny model's 4 KiB K and V parts
    # need 32x their bytes (trace_model.capacity.mori_dram_tokens counts the same way back).
    l3["dram"]["capacity"] = str(cap.l3_dram // PAGE * 2 * MORI_DRAM_PAGE_BYTES)
    l3["ssd"]["capacity"] = str(cap.l3_ssd * KV_BYTES_PER_TOKEN)
    return cr


def device_tokens(cr: dict[str, Any]) -> int:
    """SGLang's device pool: ``--max-total-tokens`` (below the profiled capacity), in pages."""
    args = cr["spec"]["engine"]["extraArgs"]
    return int(args[args.index("--max-total-tokens") + 1]) // PAGE * PAGE


def host_tokens(cr: dict[str, Any]) -> int:
    """SGLang 0.5.23 (``pool_host/base.py``) sizes a pool by ratio as ``int(device * ratio)``
    tokens, rounded down to pages, plus one padding page that never holds a prefix."""
    return int(device_tokens(cr) * float(cr["spec"]["hiCache"]["hostPoolRatio"])) // PAGE * PAGE


def capacity_of(p: Any, cr: dict[str, Any]) -> tuple[TierTokens, Policy]:
    """The tiers (tokens) and policies the model replays for the served pod of plan ``p``
    (``plan()``'s result for ``cr``)."""
    model = pod_model(p.spec, p.sizing, p.gpu_model)
    cap = replace(model.capacity, device=device_tokens(cr), host=host_tokens(cr))
    return cap, model.policy


def _post(base: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(f"{base}/generate", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        out: dict[str, Any] = json.load(r)
    return out


def metrics_text(base: str) -> str:
    with urllib.request.urlopen(f"{base}/metrics", timeout=60) as r:
        return str(r.read().decode())


def l3_read_pages(text: str) -> dict[str, float]:
    """``hicache_umbp_l3_read_pages_total`` by ``tier``, summed over ranks."""
    out = dict.fromkeys(L3_TIERS, 0.0)
    for line in text.splitlines():
        if line.startswith("hicache_umbp_l3_read_pages_total{"):
            labels, value = line.rsplit(" ", 1)
            for tier in L3_TIERS:
                if f'tier="{tier}"' in labels:
                    out[tier] += float(value)
    return out


@dataclass
class Served:
    hit_tokens: dict[str, int]  # device, host, l3_dram, l3_ssd
    storage_tokens: int  # meta_info's storage hits (= l3_dram + l3_ssd when the pages agree)
    prompt_tokens: int
    requests: int
    seconds: float
    per_request: list[tuple[int, int, int]]  # (device, host, storage) of each request
    metrics: str  # the pod's /metrics page after the replay


def single_token_words(model_dir: Path) -> list[str]:
    """Words of the model's byte-level BPE vocabulary (with their leading space) that encode
    to exactly their own token: text made of them is one token a word (``prompt_text``)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    vocab = tok.get_vocab()
    words = sorted(w[1:] for w in vocab if w.startswith("\u0120") and w[1:].isalpha())
    return [f" {w}" for w in words if tok.encode(f" {w}", add_special_tokens=True)
            == [vocab["\u0120" + w]]]


def vocab_size(models_dir: Path) -> int:
    config = json.loads((models_dir / "tiny-llama" / "config.json").read_text())
    return int(config["vocab_size"])


def replay(base: str, trace: Trace, vocab: int, *, model: str = "",
           settle_s: float = 60, gap_s: float = 0.0) -> Served:
    """Send the slice's prompts one at a time (1 output token each), ``gap_s`` apart after each
    response; hits per tier."""
    cache: dict[int, list[int]] = {}
    before = l3_read_pages(metrics_text(base))
    totals = {"device": 0, "host": 0, "storage": 0}
    prompt = 0
    per_request = []
    t0 = time.monotonic()
    for req in trace.requests:
        ids = prompt_ids(req, PAGE, vocab=vocab, cache=cache)
        body: dict[str, Any] = {"input_ids": ids, "sampling_params": {
            "max_new_tokens": 1, "temperature": 0}}
        if model:
            body["model"] = model
        meta = _post(base, body)["meta_info"]
        details = meta.get("cached_tokens_details") or {}
        hit = tuple(int(details.get(t, 0)) for t in ("device", "host", "storage"))
        per_request.append((hit[0], hit[1], hit[2]))
        for t, n in zip(("device", "host", "storage"), hit, strict=True):
            totals[t] += n
        prompt += int(meta["prompt_tokens"])
        if gap_s:
            time.sleep(gap_s)
    seconds = time.monotonic() - t0
    # The store's counters reach /metrics when SGLang next asks the backend for its stats:
    # wait until the pages they count cover the storage hits the responses reported.
    deadline = time.monotonic() + settle_s
    while True:
        after = l3_read_pages(metrics_text(base))
        pages = {t: round(after[t] - before[t]) for t in L3_TIERS}
        if sum(pages.values()) * PAGE >= totals["storage"] or time.monotonic() > deadline:
            break
        time.sleep(1)
    return Served({"device": totals["device"], "host": totals["host"],
                   "l3_dram": pages["dram"] * PAGE, "l3_ssd": pages["ssd"] * PAGE},
                  totals["storage"], prompt, len(trace.requests), seconds, per_request,
                  metrics_text(base))


def store_key_prefixes(engine_log: str) -> list[str]:
    """The key prefix of each page part, in part order, as the pod's store logged them when
    SGLang registered its host pool (``UMBPHiCacheStorage: ... keys [[<prefix><page>, ...]]``)."""
    marker = "UMBPHiCacheStorage: page part "
    line = next((x for x in engine_log.splitlines() if marker in x), None)
    if line is None:
        raise AssertionError("the engine log has no key line from the store "
                             f"({marker!r}): cannot map pages to SSD sets")
    (keys,) = ast.literal_eval(line[line.index(", keys ") + len(", keys "):].strip())
    return [str(k).removesuffix("<page>") for k in keys]


def store_set_hash(trace: Trace, prefixes: list[str], vocab: int) -> Callable[[int, int], int]:
    """(block, part) -> the set hash of that page part's key in our SSD tier: SGLang's chained
    page hash of the block's prompt tokens (``get_hash_str``, what the radix tree and the
    prefetch key pages by) after the part's key prefix, digested as the tier does
    (``disk.layout.key_digest``, ``disk.index.set_hash``). One drive: the first 8 digest bytes
    would pick among several."""
    from hicache_umbp.disk.index import set_hash
    from hicache_umbp.disk.layout import key_digest
    from sglang.srt.mem_cache.utils import get_hash_str

    page_hash: dict[int, str] = {}
    cache: dict[int, list[int]] = {}
    for req in trace.requests:
        ids = prompt_ids(req, PAGE, vocab=vocab, cache=cache)
        pages = len(ids) // PAGE
        known = 0
        while known < pages and req.blocks[known] in page_hash:
            known += 1
        if known == pages:
            continue
        prior = page_hash[req.blocks[known - 1]] if known else None
        hashes = get_hash_str(ids[known * PAGE:pages * PAGE], prior, page_size=PAGE)
        for block, h in zip(req.blocks[known:pages], hashes, strict=True):
            if page_hash.setdefault(block, h) != h:
                raise AssertionError(f"trace block {block} has two prefixes")
    table = {(block, part): set_hash(key_digest(prefix + h))
             for block, h in page_hash.items() for part, prefix in enumerate(prefixes)}
    return lambda block, part: table[block, part]


def with_store_sets(policy: Policy, trace: Trace, engine_log: str, vocab: int) -> Policy:
    """``policy`` with the store's own SSD map for ``trace``, from the pod's engine log (read
    it before the pod goes)."""
    return replace(policy, ssd_set_hash=store_set_hash(
        trace, store_key_prefixes(engine_log), vocab))
