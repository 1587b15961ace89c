"""Upstream slot: reject or bounded queue while empty, drain with a deadline across a switch."""

from __future__ import annotations

import asyncio

from controller.gateway.slot import InFlight, NoSlot, NoSlotPolicy, Slot, Upstream


async def test_reject_policy_answers_at_once() -> None:
    slot = Slot(NoSlotPolicy.REJECT, retry_after_s=7)
    got = await slot.acquire()
    assert isinstance(got, NoSlot) and got.retry_after_s == 7
    slot.set("http://127.0.0.1:9/", "m")
    up = await slot.acquire()
    assert isinstance(up, Upstream) and up.url == "http://127.0.0.1:9" and up.served_model == "m"


async def test_queue_waits_for_a_slot_and_is_bounded() -> None:
    slot = Slot(NoSlotPolicy.QUEUE, queue_max=2, queue_timeout_s=5.0)
    waiters = [asyncio.create_task(slot.acquire()) for _ in range(2)]
    await asyncio.sleep(0.01)
    assert slot.waiting == 2
    full = await slot.acquire()  # third: the queue is full, refused without waiting
    assert isinstance(full, NoSlot) and "queue is full" in full.reason
    slot.set("http://a", None)
    results = await asyncio.gather(*waiters)
    assert all(isinstance(r, Upstream) and r.url == "http://a" for r in results)
    assert slot.waiting == 0


async def test_queue_times_out() -> None:
    slot = Slot(NoSlotPolicy.QUEUE, queue_max=4, queue_timeout_s=0.05)
    got = await slot.acquire()
    assert isinstance(got, NoSlot) and "within" in got.reason
    assert slot.waiting == 0


async def test_switch_drains_only_the_old_generation() -> None:
    slot = Slot()
    old = slot.set("http://old", None)
    assert old is not None
    aborted: list[str] = []
    entry = slot.track(old, lambda: aborted.append("old"))

    async def finish_later() -> None:
        await asyncio.sleep(0.05)
        slot.untrack(entry)

    finisher = asyncio.create_task(finish_later())
    new, result = await slot.switch("http://new", None, drain_deadline_s=5.0)
    await finisher
    assert new is not None and new.url == "http://new"
    assert result.drained and result.aborted == 0 and aborted == []
    assert 0.03 < result.waited_s < 5.0
    # A request on the new upstream does not hold a later switch of... itself: re-asserting is a no-op.
    current = slot.track(new, lambda: aborted.append("new"))
    same, again = await slot.switch("http://new/", None, drain_deadline_s=5.0)
    assert same == new and again.drained and again.waited_s == 0.0
    slot.untrack(current)


async def test_drain_deadline_aborts_the_rest() -> None:
    slot = Slot()
    up = slot.set("http://old", None)
    assert up is not None
    entries: list[InFlight] = []

    def make_abort(i: int) -> None:
        # an aborted request unwinds a little later, like a cancelled task does
        asyncio.get_running_loop().call_later(0.01, slot.untrack, entries[i])

    for i in range(3):
        entries.append(slot.track(up, lambda i=i: make_abort(i)))  # type: ignore[misc]
    new, result = await slot.switch(None, None, drain_deadline_s=0.05)
    assert new is None
    assert not result.drained and result.aborted == 3 and result.remaining == 0
    assert slot.in_flight == 0
    assert isinstance(await slot.acquire(), NoSlot)


async def test_drain_without_abort_reports_remaining() -> None:
    slot = Slot()
    up = slot.set("http://x", None)
    assert up is not None
    slot.track(up, lambda: None)
    result = await slot.drain(0.02, abort=False)
    assert not result.drained and result.remaining == 1 and result.aborted == 0


async def test_the_engine_key_header_is_built_once_per_switch_and_never_shown() -> None:
    slot = Slot()
    up = slot.set("http://127.0.0.1:9", "m", upstream_key="eng_k1")
    assert up is not None and up.authorization == "Bearer eng_k1"
    assert "eng_k1" not in repr(up)
    same, _ = await slot.switch("http://127.0.0.1:9", "m", drain_deadline_s=0, upstream_key="eng_k1")
    assert same is up  # re-asserting the same upstream and key changes nothing
    new, _ = await slot.switch("http://127.0.0.1:9", "m", drain_deadline_s=0, upstream_key="eng_k2")
    assert new is not None and new.generation > up.generation and new.authorization == "Bearer eng_k2"
    bare = slot.set("http://127.0.0.1:9", "m")
    assert bare is not None and bare.authorization is None
