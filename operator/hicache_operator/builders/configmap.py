"""The ConfigMap holding the rendered backend env (HICACHE_*), loaded with envFrom.

With updateStrategy InPlaceIfPossible it holds the engine's environment as one key per
configuration revision instead (``HICACHE_CONFIG_<revision>``, a JSON object): the pod's
``config-hash`` annotation selects one at each engine start (``hicache_umbp.launch.revision``).
The planner renders the desired revision; the controller keeps the keys of revisions pods still
run until the rollout is done.
"""

from __future__ import annotations

import json
from typing import Any

from hicache_umbp.contract.revisions import config_key

from .context import BuildInput


def build_configmap(b: BuildInput) -> dict[str, Any]:
    if b.in_place:
        data = {config_key(b.config_hash()): json.dumps(b.engine_config(), sort_keys=True)}
    else:
        data = dict(sorted(b.engine.env.items()))
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": b.metadata(b.names.configmap, "config"),
        "data": data,
    }
