"""The planner refuses at admission the values the pod's env contract refuses
(hicache_umbp.contract.settings), on the CR field they come from, with the contract's reason.

Pure: the real planner and the backend's own loader; node facts made large enough that the
node's memory is not what refuses the CR.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hicache_operator.api.config import NodeFacts, OperatorConfig
from hicache_operator.api.spec import Engine, HiCache
from hicache_operator.plan import plan
from hicache_operator.planner.errors import SpecError
from hicache_umbp.contract.settings import BY_KEY, MAX_MEMORY_BYTES

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def _bounds(model: Any, field: str) -> tuple[float | None, float | None]:
    lo = hi = None
    for m in model.model_fields[field].metadata:
        lo = getattr(m, "ge", lo)
        hi = getattr(m, "le", hi)
    return lo, hi


@pytest.mark.parametrize("model, field, key", [
    (Engine, "tensor_parallel_size", "tp_size"),
    (Engine, "data_parallel_size", "dp_size"),
    (Engine, "page_size", "page_size"),
    (Engine, "port", "port"),
    (HiCache, "host_pool_ratio", "host_pool_ratio"),
])
def test_the_crd_bounds_are_the_contracts(model: Any, field: str, key: str) -> None:
    """What the API server admits (the CRD is generated from these models) is exactly what the
    pod's launcher accepts: no CR passes admission to fail in the pod."""
    s = BY_KEY[key]
    assert _bounds(model, field) == (s.minimum, s.maximum)


def test_a_dram_tier_no_host_can_map_is_refused_at_its_field() -> None:
    cr: dict[str, Any] = copy.deepcopy(
        yaml.safe_load((ROOT / "examples" / "deepseek-r1-mi355x.yaml").read_text()))
    cr["spec"]["engine"]["tensorParallelSize"] = 1
    cr["spec"]["l3"]["mode"] = "embedded"
    cr["spec"]["l3"]["dram"]["capacity"] = str(2 * MAX_MEMORY_BYTES)  # one rank
    config = OperatorConfig(node_facts=NodeFacts(memory="1Ei"))
    with pytest.raises(SpecError) as err:
        plan(cr, config)
    fields = {path: message for path, message in err.value.problems}
    assert "spec.l3.dram.capacity" in fields, err.value.problems
    message = fields["spec.l3.dram.capacity"]
    assert BY_KEY["umbp_dram_bytes"].env in message and "address space" in message


def test_a_dram_sidecar_no_host_can_map_is_refused_at_its_field() -> None:
    cr: dict[str, Any] = copy.deepcopy(
        yaml.safe_load((ROOT / "examples" / "deepseek-r1-mi355x.yaml").read_text()))
    assert cr["spec"]["l3"]["mode"] == "standalone"
    cr["spec"]["l3"]["dram"]["capacity"] = str(2 * MAX_MEMORY_BYTES)
    with pytest.raises(SpecError) as err:
        plan(cr, OperatorConfig(node_facts=NodeFacts(memory="1Ei")))
    fields = {path: message for path, message in err.value.problems}
    assert "UMBP_DRAM_CAPACITY" in fields.get("spec.l3.dram.capacity", ""), err.value.problems
