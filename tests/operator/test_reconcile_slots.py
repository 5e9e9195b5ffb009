"""Reconcile slots (``controller.slots``): a new or changed CR does not queue behind the
unchanged CRs an operator restart reconciles. Real asyncio tasks; nothing faked."""

from __future__ import annotations

import asyncio

import pytest
from hicache_operator.controller.slots import PrioritySlots


def test_an_urgent_waiter_takes_the_next_slot_before_earlier_ordinary_ones() -> None:
    async def run() -> list[str]:
        slots, order, gate = PrioritySlots(1), [], asyncio.Event()

        async def job(name: str, urgent: bool, hold: asyncio.Event | None = None) -> None:
            async with slots.slot(urgent):
                order.append(name)
                if hold is not None:
                    await hold.wait()

        first = asyncio.create_task(job("running", False, gate))
        await asyncio.sleep(0)
        waiting = [asyncio.create_task(job(f"old-{i}", False)) for i in range(5)]
        await asyncio.sleep(0)
        new = asyncio.create_task(job("new", True))
        await asyncio.sleep(0)
        assert slots.waiting == 6
        gate.set()
        await asyncio.gather(first, *waiting, new)
        return order

    assert asyncio.run(run()) == ["running", "new", *(f"old-{i}" for i in range(5))]


def test_a_cancelled_waiter_gives_its_turn_away_and_no_slot_leaks() -> None:
    async def run() -> int:
        slots = PrioritySlots(2)
        hold = asyncio.Event()

        async def job(urgent: bool) -> None:
            async with slots.slot(urgent):
                await hold.wait()

        held = [asyncio.create_task(job(False)) for _ in range(2)]
        await asyncio.sleep(0)
        gone = asyncio.create_task(job(True))
        later = asyncio.create_task(job(False))
        await asyncio.sleep(0)
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        hold.set()
        await asyncio.gather(*held, later)
        # every slot is free again: two can enter at once without waiting
        async with slots.slot(False), slots.slot(False):
            return slots.waiting

    assert asyncio.run(run()) == 0
    with pytest.raises(ValueError, match="must be >= 1"):
        PrioritySlots(0)
