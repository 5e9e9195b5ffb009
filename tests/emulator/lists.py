"""LIST as a real API server serves it: ``resourceVersion`` semantics, consistent pagination.

What clients like kube-rs' watcher (the router's discovery), client-go's reflector and kopf rely
on, from the Kubernetes API concepts ("Resource versions", "Retrieving large results sets in
chunks"):

- no ``resourceVersion`` (or ``""``): the most recent state; ``metadata.resourceVersion`` of the
  list is the store's current one, which a client then watches from;
- ``resourceVersion=0``: any state (a real server answers from its watch cache): the current
  one here, and ``limit`` is ignored, as the watch cache ignores it;
- ``resourceVersion=N`` with ``resourceVersionMatch=NotOlderThan`` (or no match, the legacy
  form): a state at least as new as N; N newer than the server's state is ``504 Timeout``
  ("Too large resource version") after the server gave up waiting;
- ``resourceVersionMatch=Exact``: the state exactly at N, rebuilt from the watch history
  (every event keeps the object as it was before it), ``410 Expired`` once N is compacted;
- ``limit``/``continue``: every page of one list comes from the same snapshot (the first
  page's resourceVersion, carried in an opaque token), so objects changed between pages are
  neither skipped nor repeated; a token whose snapshot was compacted is ``410 Expired``
  ("The provided continue parameter is too old"); ``remainingItemCount`` counts what is left.

``compact`` stands in for etcd's periodic compaction: older resourceVersions stop being
replayable, so a watch or an Exact list from them gets 410 and the client must list again.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

from .selectors import matches_fields, matches_labels
from .store import ApiError, Obj, ResourceType, Store

Key = tuple[str, str, "str | None", str]


def compact(store: Store, rv: int | None = None) -> int:
    """Make every resourceVersion before ``rv`` (default: the current one) unreplayable."""
    store.compacted_rv = max(store.compacted_rv, store.rv if rv is None else rv)
    return store.compacted_rv


def snapshot(store: Store, rtype: ResourceType, rv: int) -> dict[Any, Obj]:
    """The objects of ``rtype`` as they were at ``rv`` (410 when it was compacted)."""
    if rv < store.compacted_rv:
        raise ApiError(410, "Expired", f"too old resource version: {rv} ({store.compacted_rv})")
    state: dict[Any, Obj] = {k: o for k, o in store.objects.items() if k[:2] == rtype.key}
    for event in reversed(store.history):
        if event.rv <= rv:
            break
        if event.rtype.key != rtype.key:
            continue
        meta = event.object["metadata"]
        key = (rtype.group, rtype.plural, meta.get("namespace") if rtype.namespaced else None,
               meta["name"])
        if event.type == "ADDED":
            state.pop(key, None)
        elif event.prev is not None:
            state[key] = event.prev
    return state


def _token(rv: int, after: tuple[str, str]) -> str:
    raw = json.dumps({"rv": rv, "after": list(after)}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _untoken(token: str) -> tuple[int, tuple[str, str]]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        return int(data["rv"]), (str(data["after"][0]), str(data["after"][1]))
    except (ValueError, KeyError, TypeError, IndexError):
        raise ApiError(400, "BadRequest", f"invalid continue token {token!r}") from None


def serve_list(store: Store, rtype: ResourceType, namespace: str | None,
               params: Mapping[str, str]) -> Obj:
    """The body of ``GET <collection>`` for these query parameters."""
    rv_param = params.get("resourceVersion")
    match = params.get("resourceVersionMatch", "")
    limit = int(params.get("limit") or 0)
    token = params.get("continue") or ""
    after: tuple[str, str] | None = None
    if token:
        if rv_param not in (None, "") or match:
            raise ApiError(400, "BadRequest", "specifying resource version is not allowed "
                           "when using continue")
        at, after = _untoken(token)
        if at < store.compacted_rv:
            raise ApiError(410, "Expired", "The provided continue parameter is too old to "
                           "display a consistent list result. You can start a new list "
                           "without the continue parameter.")
        objects, list_rv = snapshot(store, rtype, at), at
    elif match == "Exact":
        if rv_param in (None, "", "0"):
            raise ApiError(400, "BadRequest", "resourceVersionMatch Exact needs a "
                           "resourceVersion other than 0")
        list_rv = int(rv_param or 0)
        objects = snapshot(store, rtype, list_rv)
    else:
        if match not in ("", "NotOlderThan"):
            raise ApiError(400, "BadRequest", f"unsupported resourceVersionMatch {match!r}")
        if rv_param not in (None, "") and int(rv_param) > store.rv:
            raise ApiError(504, "Timeout", f"Too large resource version: {rv_param}, "
                           f"current resource version: {store.rv}")
        if rv_param == "0":
            limit = 0  # the watch cache ignores limit
        objects = {k: o for k, o in store.objects.items() if k[:2] == rtype.key}
        list_rv = store.rv
    labels, fields = params.get("labelSelector", ""), params.get("fieldSelector", "")
    items = sorted(
        (o for (_, _, ns, _), o in objects.items()
         if (namespace is None or ns == namespace)
         and matches_labels(labels, o["metadata"].get("labels") or {})
         and matches_fields(fields, o)),
        key=lambda o: (o["metadata"].get("namespace") or "", o["metadata"]["name"]))
    if after is not None:
        items = [o for o in items
                 if (o["metadata"].get("namespace") or "", o["metadata"]["name"]) > after]
    meta: dict[str, Any] = {"resourceVersion": str(list_rv)}
    if limit and len(items) > limit:
        last = items[limit - 1]["metadata"]
        meta["continue"] = _token(list_rv, (last.get("namespace") or "", last["name"]))
        meta["remainingItemCount"] = len(items) - limit
        items = items[:limit]
    return {"apiVersion": rtype.api_version, "kind": f"{rtype.kind}List", "metadata": meta,
            "items": items}
