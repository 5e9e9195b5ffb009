"""The emulator over real loopback HTTP (aiohttp client ↔ kmock server ↔ store): discovery,
CRUD status codes, watch streams with bookmarks and resume, and every kind of injected fault.

Real: the emulator, its HTTP server and an aiohttp client. Nothing is faked.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import pytest

from emulator import EmulatorThread, Fault

pytestmark = pytest.mark.e2e

CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.example.com"},
    "spec": {"group": "example.com", "scope": "Namespaced",
             "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
             "versions": [{"name": "v1", "served": True, "storage": True,
                           "subresources": {"status": {}},
                           "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                               "spec": {"type": "object", "properties": {
                                   "size": {"type": "integer", "minimum": 1}}},
                               "status": {"type": "object",
                                          "x-kubernetes-preserve-unknown-fields": True}}}}}]}}
WIDGETS = "/apis/example.com/v1/namespaces/ns/widgets"


def _run(emu: EmulatorThread, coro_fn: Any) -> Any:
    async def main() -> Any:
        async with aiohttp.ClientSession(emu.url) as session:
            return await coro_fn(session)
    return asyncio.run(main())


@pytest.fixture
def emu() -> Any:
    with EmulatorThread(crds=[CRD], bookmark_interval=0.2) as running:
        yield running


def test_discovery_lists_builtin_and_custom_resources(emu: EmulatorThread) -> None:
    async def go(s: aiohttp.ClientSession) -> tuple[Any, Any, Any]:
        apis = await (await s.get("/apis")).json()
        group = await (await s.get("/apis/example.com/v1")).json()
        core = await (await s.get("/api/v1")).json()
        return apis, group, core
    apis, group, core = _run(emu, go)
    assert {"example.com", "apps", "policy", "kopf.dev"} <= {g["name"] for g in apis["groups"]}
    assert {r["name"] for r in group["resources"]} == {"widgets", "widgets/status"}
    assert {"pods", "services", "configmaps", "events"} <= {r["name"] for r in core["resources"]}


def test_crud_status_codes(emu: EmulatorThread) -> None:
    async def go(s: aiohttp.ClientSession) -> list[int]:
        codes = []
        for body in ({"metadata": {"name": "w"}, "spec": {"size": 1}},
                     {"metadata": {"name": "w"}, "spec": {"size": 1}},
                     {"metadata": {"name": "bad"}, "spec": {"size": 0}}):
            codes.append((await s.post(WIDGETS, json=body)).status)
        codes.append((await s.patch(f"{WIDGETS}/w", data=json.dumps({"spec": {"size": 2}}),
                                    headers={"Content-Type": "application/merge-patch+json"}
                                    )).status)
        stale = {"metadata": {"name": "w", "resourceVersion": "1"}, "spec": {"size": 5}}
        codes.append((await s.put(f"{WIDGETS}/w", json=stale)).status)
        codes.append((await s.get(f"{WIDGETS}/nope")).status)
        codes.append((await s.delete(f"{WIDGETS}/w")).status)
        codes.append((await s.get(f"{WIDGETS}/w")).status)
        return codes
    assert _run(emu, go) == [201, 409, 422, 200, 409, 404, 200, 404]
    assert len(emu.writes()) == 6


def test_watch_streams_events_bookmarks_and_resumes_from_a_version(emu: EmulatorThread) -> None:
    emu.create("example.com/v1", "widgets", {"metadata": {"name": "a"}, "spec": {}}, "ns")
    since = emu.get("example.com/v1", "widgets", "ns", "a")["metadata"]["resourceVersion"]

    async def go(s: aiohttp.ClientSession) -> list[dict[str, Any]]:
        async def later() -> None:
            await asyncio.sleep(0.3)
            await s.post(WIDGETS, json={"metadata": {"name": "b"}, "spec": {}})
        task = asyncio.create_task(later())
        got = []
        params = {"watch": "true", "resourceVersion": since, "allowWatchBookmarks": "true",
                  "timeoutSeconds": "1"}
        async with s.get(WIDGETS, params=params) as response:
            async for line in response.content:
                got.append(json.loads(line))
        await task
        return got
    events = _run(emu, go)
    kinds = [e["type"] for e in events]
    assert "ADDED" in kinds and "BOOKMARK" in kinds
    assert [e["object"]["metadata"]["name"] for e in events if e["type"] == "ADDED"] == ["b"]


def test_injected_errors_delays_and_dropped_watches(emu: EmulatorThread) -> None:
    emu.create("example.com/v1", "widgets", {"metadata": {"name": "a"}, "spec": {}}, "ns")
    emu.add_fault(Fault(method="GET", plural="widgets", name="a", status=500, times=2))
    emu.add_fault(Fault(method="PATCH", plural="widgets", status=409, times=1))
    emu.add_fault(Fault(method="WATCH", plural="widgets", drop_after=1, times=1))
    emu.add_fault(Fault(method="DELETE", plural="widgets", delay=0.3, times=1))

    async def go(s: aiohttp.ClientSession) -> dict[str, Any]:
        gets = [(await s.get(f"{WIDGETS}/a")).status for _ in range(3)]
        patch = (await s.patch(f"{WIDGETS}/a", data="{}", headers={
            "Content-Type": "application/merge-patch+json"})).status
        lines = []
        async with s.get(WIDGETS, params={"watch": "true"}) as response:
            async for line in response.content:  # ends after one event: the server drops it
                lines.append(line)
        started = time.monotonic()
        deleted = (await s.delete(f"{WIDGETS}/a")).status
        return {"gets": gets, "patch": patch, "watched": len(lines),
                "delete": deleted, "delay": time.monotonic() - started}
    result = _run(emu, go)
    assert result["gets"] == [500, 500, 200]
    assert result["patch"] == 409 and result["watched"] == 1 and result["delete"] == 200
    assert result["delay"] >= 0.3


def test_drop_watches_closes_every_open_stream(emu: EmulatorThread) -> None:
    async def go(s: aiohttp.ClientSession) -> int:
        async def watch() -> int:
            count = 0
            async with s.get(WIDGETS, params={"watch": "true"}) as response:
                async for _ in response.content:
                    count += 1
            return count
        tasks = [asyncio.create_task(watch()) for _ in range(3)]
        await asyncio.sleep(0.3)
        dropped = await asyncio.get_running_loop().run_in_executor(None, emu.drop_watches)
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        return int(dropped)
    assert _run(emu, go) == 3
