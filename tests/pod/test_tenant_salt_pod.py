"""Tenants through the L3 tier: SGLang 0.5.23 seeds a request's storage page-hash chain with its
namespace (``storage_namespace_seed(extra_key, cache_salt)``), so the keys our store sees for
the same prompt differ by ``cache_salt``. After an engine restart (device and host pool empty,
the pages on our SSD tier), a prompt sent under another salt gets no storage hit from the first
tenant's pages, and under the same salt all of them.

Real: as test_ssd_pod.py (the planner's pod for ``examples/cpu/tiny-llama-ssd.yaml``, SGLang
0.5.23 on CPU with our adapter over real mori DRAM and our SSD tier on the pod's claim, strict
pod tier); each request carries its salt in the request body as a gateway would set it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .harness import Client, admin_config, load_cr, plan_pod, start_pod
from .test_restart_pod import restart_engine
from .test_serving_pod import PROMPT, fillers
from .test_ssd_pod import wait_ssd_caught_up

pytestmark = pytest.mark.pod


def _hits(out: dict[str, Any]) -> dict[str, int]:
    details = out["meta_info"].get("cached_tokens_details") or {}
    return {tier: int(details.get(tier) or 0) for tier in ("device", "host", "storage")}


@pytest.mark.timeout(1500)
def test_another_tenants_salt_never_hits_the_first_tenants_l3_pages(
        node: Any, image: Any, workdir: Path, models_dir: Path) -> None:
    cr = load_cr("cpu/tiny-llama-ssd.yaml")
    cr["spec"]["hiCache"]["prefetch"] = {"policy": "wait_complete"}  # see test_ssd_pod.py
    planned = plan_pod(cr, admin_config(node))
    pod = start_pod(planned, node, image, workdir, {"tiny-models": models_dir})
    c = Client(cr["spec"]["engine"]["port"])
    try:
        pod.wait_ready(600)
        cold = c.generate(PROMPT, cache_salt="tenant-a")
        for text in fillers(4):
            c.generate(text, cache_salt="tenant-a")
        wait_ssd_caught_up(c)
        restart_engine(pod)  # only the SSD tier keeps pages now
        full_pages = cold["meta_info"]["prompt_tokens"] // 16 * 16

        other = c.generate(PROMPT, cache_salt="tenant-b")
        assert _hits(other) == {"device": 0, "host": 0, "storage": 0}, other["meta_info"]
        unsalted = c.generate(PROMPT)
        assert _hits(unsalted)["storage"] == 0, unsalted["meta_info"]
        same = c.generate(PROMPT, cache_salt="tenant-a")
        assert _hits(same)["storage"] == full_pages, same["meta_info"]
        assert same["text"] == cold["text"] == other["text"]  # one model: the same answer
    finally:
        pod.close()
