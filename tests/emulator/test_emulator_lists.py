"""LIST as a real API server serves it (``emulator.lists``)."""

from __future__ import annotations

import pytest

from .lists import compact, serve_list
from .store import ApiError, ResourceType, Store

pytestmark = pytest.mark.unit


def _store() -> tuple[Store, ResourceType]:
    from .server import BUILTIN_TYPES

    store = Store()
    for rtype in BUILTIN_TYPES:
        store.register(rtype)
    return store, store.find_type("", "v1", "configmaps")


def _cm(name: str, value: str = "1") -> dict:
    return {"metadata": {"name": name}, "data": {"v": value}}


def _names(body: dict) -> list[str]:
    return [o["metadata"]["name"] for o in body["items"]]


def test_pages_come_from_one_snapshot_while_objects_change() -> None:
    store, cms = _store()
    for name in "abcde":
        store.create(cms, "ns", _cm(name))
    first = serve_list(store, cms, "ns", {"limit": "2"})
    assert _names(first) == ["a", "b"] and first["metadata"]["remainingItemCount"] == 3
    store.delete(cms, "ns", "c")  # deleted and created between pages: the list does not see it
    store.create(cms, "ns", _cm("bb"))
    second = serve_list(store, cms, "ns", {"limit": "2",
                                             "continue": first["metadata"]["continue"]})
    assert _names(second) == ["c", "d"]
    assert second["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    third = serve_list(store, cms, "ns", {"continue": second["metadata"]["continue"]})
    assert _names(third) == ["e"] and "continue" not in third["metadata"]
    assert _names(serve_list(store, cms, "ns", {})) == ["a", "b", "bb", "d", "e"]


def test_exact_lists_the_past_and_compaction_expires_it() -> None:
    store, cms = _store()
    store.create(cms, "ns", _cm("a", "old"))
    rv = store.rv
    store.patch(cms, "ns", "a", "application/merge-patch+json", {"data": {"v": "new"}})
    store.create(cms, "ns", _cm("b"))
    past = serve_list(store, cms, "ns", {"resourceVersion": str(rv),
                                         "resourceVersionMatch": "Exact"})
    assert [(o["metadata"]["name"], o["data"]["v"]) for o in past["items"]] == [("a", "old")]
    page = serve_list(store, cms, "ns", {"limit": "1"})
    store.create(cms, "ns", _cm("c"))  # the state moves on, then etcd compacts
    compact(store)
    with pytest.raises(ApiError) as err:
        serve_list(store, cms, "ns", {"resourceVersion": str(rv),
                                      "resourceVersionMatch": "Exact"})
    assert err.value.status == 410
    with pytest.raises(ApiError) as err:
        serve_list(store, cms, "ns", {"continue": page["metadata"]["continue"]})
    assert err.value.status == 410 and "too old" in err.value.message


def test_resource_version_zero_ignores_limit_and_a_future_one_times_out() -> None:
    store, cms = _store()
    for name in "abc":
        store.create(cms, "ns", _cm(name))
    assert _names(serve_list(store, cms, "ns", {"resourceVersion": "0", "limit": "1"})) == \
        ["a", "b", "c"]
    with pytest.raises(ApiError) as err:
        serve_list(store, cms, "ns", {"resourceVersion": str(store.rv + 5)})
    assert err.value.status == 504
    body = serve_list(store, cms, "ns", {"resourceVersion": str(store.rv),
                                         "resourceVersionMatch": "NotOlderThan"})
    assert body["metadata"]["resourceVersion"] == str(store.rv)


def test_a_watch_from_a_compacted_version_is_gone() -> None:
    store, cms = _store()
    store.create(cms, "ns", _cm("a"))
    rv = store.rv
    store.create(cms, "ns", _cm("b"))
    compact(store)
    with pytest.raises(ApiError) as err:
        store.watch(cms, "ns", str(rv))
    assert err.value.status == 410
