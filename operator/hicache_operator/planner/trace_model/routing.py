"""Which pod a request goes to: smg 1.13.0's policies as the replay sees them.

* ``cache_aware``: smg keeps its own approximate prefix tree per pod (the request text it sent
  there, LRU-evicted to ``--max-tree-size``). When loads are balanced it sends a request to the
  pod whose tree shares the longest prefix if that prefix is more than ``cache_threshold`` of the
  request, else to the least loaded pod, ties broken by the fewest requests routed to it so far
  (smg's ``select_worker``, the key ``(load, processed)``; its header comment's "smallest tree"
  is older than its code). smg 1.13.0's spill gate (its ``--balance-*-threshold`` help) skips a
  matched pod for the least loaded one when the matched pod's in-flight count exceeds the
  pods' mean ``m`` both ``balance_rel_threshold`` times over and by a margin: the smaller of
  ``balance_abs_threshold`` and the count's natural swing at that mean, ``2 * sqrt(m)`` but
  never under 4. The tree is modelled in blocks, ``tree_tokens`` per pod: the
  planner's ``--max-tree-size`` over ``charsPerToken`` (smg evicts each pod's part of the tree
  to that size, ``evict_tenant_by_size``).

  Where pods are equally good (a prefix both pods' trees hold; equal loads and counts), smg's
  choice cannot be predicted: eight runs of the same 500 requests through the real smg 1.13.0
  chose differently every time (``bench/router_replay.py``). The model draws those ties from a
  generator seeded by ``salt``, so one replay is one possible run, and
  :func:`~.served.model_for_slice` averages several. Always taking the first pod instead is a
  bias, not a neutral choice: it piles every shared prefix onto pod 0.
* ``round_robin``: request ``i`` to pod ``i mod N``.
* ``prefix_hash``: a hash of the prompt's first ``prefix_token_count`` tokens (smg's default
  256, within the first block of either trace format) picks the pod.

A request is in flight from its arrival for its estimated service time (uncached prompt tokens
at the prefill rate, then ``output_length`` at ``decode_tokens_per_s``); that is all the load
the spill gate sees.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Container, Sequence
from dataclasses import dataclass
from typing import Literal

from .tiers import LruTier

RouterPolicy = Literal["cache_aware", "round_robin", "prefix_hash"]
ROUTER_POLICIES: tuple[RouterPolicy, ...] = ("cache_aware", "round_robin", "prefix_hash")
_MASK = (1 << 64) - 1


@dataclass(frozen=True)
class RouterConfig:
    policy: RouterPolicy = "cache_aware"
    cache_threshold: float = 0.3  # spec.router.cacheThreshold default (smg --cache-threshold)
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    tree_tokens: int | None = None  # per pod; None: unbounded
    decode_tokens_per_s: float = 30.0  # one request's output rate, for the in-flight count
    salt: int = 0  # seeds the draw among equally good pods


def _mix(key: int) -> int:
    """splitmix64: a fixed hash (Python's hash() of ints is the identity)."""
    z = (key + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def matched_tokens(blocks: Sequence[int], sizes: Sequence[int], held: Container[int]) -> int:
    """Tokens of the longest prefix of ``blocks`` whose blocks are all in ``held`` (a pod's
    tree, as smg matches a request against it)."""
    tokens = 0
    for key, size in zip(blocks, sizes, strict=True):
        if key not in held:
            break
        tokens += size
    return tokens


class Router:
    def __init__(self, config: RouterConfig, pods: int) -> None:
        self.config = config
        self.pods = pods
        self.count = 0
        cap = config.tree_tokens if config.tree_tokens is not None else 1 << 62
        self.trees = [LruTier(cap) for _ in range(pods)]
        self.in_flight = [0] * pods
        self.processed = [0] * pods
        self._ends: list[tuple[float, int]] = []
        self._rng = random.Random(f"router:{config.salt}")

    def _draw(self, candidates: list[int]) -> int:
        return candidates[0] if len(candidates) == 1 else self._rng.choice(candidates)

    def route(self, blocks: tuple[int, ...], sizes: list[int], input_length: int,
              now_s: float) -> int:
        self.count += 1
        if self.pods == 1:
            return 0
        policy = self.config.policy
        if policy == "round_robin":
            return (self.count - 1) % self.pods
        if policy == "prefix_hash":
            return _mix(blocks[0]) % self.pods
        return self._cache_aware(blocks, sizes, input_length, now_s)

    def _cache_aware(self, blocks: tuple[int, ...], sizes: list[int], input_length: int,
                     now_s: float) -> int:
        c = self.config
        ends, flight = self._ends, self.in_flight
        while ends and ends[0][0] <= now_s:
            flight[heapq.heappop(ends)[1]] -= 1
        keys = [(flight[p], self.processed[p]) for p in range(self.pods)]
        least = min(keys)
        least_loaded = [p for p in range(self.pods) if keys[p] == least]
        matched = [matched_tokens(blocks, sizes, tree.entries) for tree in self.trees]
        best = max(matched)
        if best / input_length > c.cache_threshold:
            pod = self._draw([p for p in range(self.pods) if matched[p] == best])
            if self._spills(flight[pod]):
                pod = self._draw(least_loaded)
        else:
            pod = self._draw(least_loaded)
        self.processed[pod] += 1
        tree = self.trees[pod]
        for k in range(len(blocks) - 1, -1, -1):
            tree.add(blocks[k], sizes[k], None)
        return pod

    def _spills(self, load: int) -> bool:
        """smg's spill gate for a matched pod with ``load`` requests in flight."""
        c = self.config
        mean = sum(self.in_flight) / self.pods
        margin = min(c.balance_abs_threshold, max(2 * math.sqrt(mean), 4.0))
        return load > c.balance_rel_threshold * mean and load - mean > margin

    def finished(self, pod: int, start_s: float, computed_tokens: int, output_length: int,
                 prefill_tokens_per_s: float) -> None:
        """Record a routed request's estimated end (only the balance check reads it)."""
        if self.config.policy != "cache_aware" or self.pods == 1:
            return
        end = (start_s + computed_tokens / prefill_tokens_per_s
               + output_length / self.config.decode_tokens_per_s)
        self.in_flight[pod] += 1
        heapq.heappush(self._ends, (end, pod))
