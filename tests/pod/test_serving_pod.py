"""The generated pod, really run: real SGLang serving over real mori from the operator's spec.

Real: the planner's StatefulSet and ConfigMap; the launcher (``python -m hicache_umbp.launch``,
the container's own command) probing the node, then exec'ing SGLang 0.5.23 (``launch_server``)
with our host-allocator hook and UMBP adapter over the real amd-mori 1.2.4; the pod's own
probes; the container's memory cgroup limit; hugepages reserved in the kernel; uid 10001 with
only IPC_LOCK. Faked: the GPUs (sysfs/dev of a MI355X node, see tests/pod/node.py) and the
device SGLang computes on (CPU, via tests/cpu_engine). See tests/pod/runtime.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .harness import Client, load_cr, plan_pod, start_pod

pytestmark = pytest.mark.pod

PROMPT = " ".join(f"word{i} cache page" for i in range(200))


def fillers(n: int) -> list[str]:
    return [" ".join(f"other{i} filler{j} text" for j in range(120)) for i in range(n)]


@pytest.mark.timeout(900)
def test_embedded_pod_serves_with_host_hits(node, image, workdir: Path, models_dir: Path) -> None:
    planned = plan_pod(load_cr("cpu/tiny-llama-embedded.yaml"))
    pod = start_pod(planned, node, image, workdir, {"tiny-models": models_dir})
    try:
        pod.wait_ready(600)
        c = Client(30000)
        cold = c.generate(PROMPT)
        again = c.generate(PROMPT)
        assert again["meta_info"]["cached_tokens_details"]["device"] > 0
        for text in fillers(4):
            c.generate(text)
        host = c.generate(PROMPT)
        assert host["meta_info"]["cached_tokens_details"]["host"] > 0, host["meta_info"]
        assert cold["text"] == again["text"] == host["text"]
    finally:
        pod.close()
