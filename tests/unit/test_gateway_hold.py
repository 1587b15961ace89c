"""The gateway's hold (controller/gateway/hold/queue.py): bounded in count, per key and in time; released in
arrival order; answered with the controller's reason when the switch fails; a client that goes away
is dropped at once. Waits here are a few tenths of a second of real time (outcomes only, no timing)."""

from __future__ import annotations

import asyncio

import pytest

from controller.gateway.hold.queue import Hold, HoldPlan, Outcome, Refused, Released, bind_metrics
from controller.gateway.hold.sse import SseAfterHold, wants_stream
from controller.gateway.metrics import GatewayMetrics

PLAN = HoldPlan("warm restart", wait_s=30.0, expected_ready_s=35.0)


async def _started(hold: Hold, n: int) -> None:
    for _ in range(200):
        if hold.waiting >= n:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"{n} waiters never queued ({hold.waiting})")


async def test_held_requests_are_released_in_arrival_order() -> None:
    hold = Hold()
    hold.begin(PLAN)
    order: list[int] = []

    async def one(i: int) -> None:
        got = await hold.wait(f"k{i}", 5)
        assert isinstance(got, Released)
        order.append(i)

    tasks = []
    for i in range(5):
        tasks.append(asyncio.create_task(one(i)))
        await _started(hold, i + 1)
    assert hold.release() == 5
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3, 4]
    assert hold.outcomes[Outcome.RELEASED] == 5
    assert not hold.holding() and hold.waiting == 0


async def test_a_full_queue_and_a_full_key_share_are_refused_at_once() -> None:
    hold = Hold(max_waiting=3, per_key_max=2)
    hold.begin(PLAN)
    tasks = [asyncio.create_task(hold.wait("a", 5)) for _ in range(2)]
    await _started(hold, 2)
    same_key = await hold.wait("a", 7)
    assert isinstance(same_key, Refused) and same_key.outcome is Outcome.FULL
    assert "this key already has 2 requests waiting" in same_key.reason and same_key.retry_after_s == 7
    tasks.append(asyncio.create_task(hold.wait("b", 5)))
    await _started(hold, 3)
    full = await hold.wait("c", 5)
    assert isinstance(full, Refused) and "queue is full (3 requests)" in full.reason
    hold.release()
    assert all(isinstance(r, Released) for r in await asyncio.gather(*tasks))
    assert hold.outcomes[Outcome.FULL] == 2


async def test_a_failed_switch_answers_every_waiter_with_its_reason() -> None:
    hold = Hold()
    hold.begin(PLAN)
    tasks = [asyncio.create_task(hold.wait("k", 5)) for _ in range(3)]
    await _started(hold, 3)
    hold.fail("the new engine failed to start: out of memory while loading the model")
    for got in await asyncio.gather(*tasks):
        assert isinstance(got, Refused) and got.outcome is Outcome.FAILED
        assert "out of memory while loading the model" in got.reason
    assert not hold.holding()


async def test_past_its_wait_a_request_gets_a_refusal_not_a_hang() -> None:
    hold = Hold()
    hold.begin(HoldPlan("warm restart", wait_s=0.2))
    got = await hold.wait("k", 5)
    assert isinstance(got, Refused) and got.outcome is Outcome.TIMED_OUT
    assert "within 0.2 s" in got.reason


async def test_a_hold_the_controller_stops_renewing_lapses() -> None:
    now = [0.0]
    hold = Hold(clock=lambda: now[0])
    hold.begin(HoldPlan("apply", wait_s=10.0))
    assert hold.holding()
    now[0] = 10.0  # the lease ends on its last instant, as a waiter's bound does
    assert not hold.holding()
    now[0] = 10.5  # no renewal: the controller died
    assert not hold.holding()
    got = await hold.wait("k", 5)
    assert isinstance(got, Refused) and got.outcome is Outcome.TIMED_OUT
    hold.begin(HoldPlan("apply", wait_s=10.0))  # a renewal starts a fresh lease
    assert hold.holding()


async def test_a_client_that_goes_away_is_dropped_at_once() -> None:
    hold = Hold()
    hold.begin(PLAN)
    task = asyncio.create_task(hold.wait("k", 5))
    await _started(hold, 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert hold.waiting == 0 and hold.outcomes[Outcome.DROPPED] == 1
    assert hold.release() == 0


async def test_a_streaming_waiter_is_told_why_and_when() -> None:
    hold = Hold(tick_interval_s=0.05)
    hold.begin(PLAN)
    lines: list[str] = []

    async def tick(text: str) -> None:
        lines.append(text)

    task = asyncio.create_task(hold.wait("k", 5, tick))
    for _ in range(1000):  # bounded (10 s, 200 ticks' worth), and says what never came
        if len(lines) >= 3:
            break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError(f"3 tick lines expected from a 0.05 s tick; got {lines} in 10 s")
    hold.release()
    assert isinstance(await task, Released)
    assert lines[0].startswith("waiting for the engine (warm restart), ready in ~")
    assert lines[0].endswith(" s")


async def test_no_hold_means_refused_at_once() -> None:
    got = await Hold().wait("k", 5)
    assert isinstance(got, Refused) and got.waited_s == 0.0


def test_metrics_count_each_outcome() -> None:
    metrics = GatewayMetrics()
    registry = metrics.registry
    hold = Hold()
    bind_metrics(hold, metrics)
    assert hold.on_outcome is not None
    hold.on_outcome(Outcome.RELEASED, 3.0)
    hold.on_outcome(Outcome.FULL, 0.0)
    sample = registry.get_sample_value
    assert sample("appliance_gateway_hold_requests_total", {"outcome": "released"}) == 1
    assert sample("appliance_gateway_hold_requests_total", {"outcome": "full"}) == 1
    assert sample("appliance_gateway_hold_wait_seconds_count") == 1
    assert sample("appliance_gateway_hold_wait_seconds_sum") == 3.0  # the released one's, not FULL's
    assert sample("appliance_gateway_hold_waiting") == 0
    assert sample("appliance_gateway_hold_active") == 0
    hold.begin(PLAN)
    assert sample("appliance_gateway_hold_active") == 1
    hold.release()
    assert sample("appliance_gateway_hold_active") == 0


def test_stream_requests_are_recognised() -> None:
    assert wants_stream(b'{"model": "m", "stream": true}', b"")
    assert not wants_stream(b'{"model": "m", "stream": false}', b"")
    assert not wants_stream(b'{"model": "m", "messages": [{"content": "\\"stream\\": true"}]}', b"")
    assert wants_stream(b"", b"text/event-stream")


async def test_after_a_held_stream_started_an_error_answer_becomes_one_data_event() -> None:
    sent: list[dict[str, object]] = []

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    wrapped = SseAfterHold(send)  # type: ignore[arg-type]
    await wrapped({"type": "http.response.start", "status": 400,
                   "headers": [(b"content-type", b"application/json")]})
    body = b'{"error": {"message": "bad"}}'
    await wrapped({"type": "http.response.body", "body": body, "more_body": False})
    assert sent == [{"type": "http.response.body", "body": b'data: {"error": {"message": "bad"}}\n\n',
                     "more_body": False}]


# -- a key's share of the queue is given back when its held request ends, however it ends -------


async def _one_held_request(hold: Hold, now: list[float], end: str) -> Released | Refused:
    """One request of key "k" through a hold that ends the way ``end`` says."""
    now[0] += 100.0
    hold.begin(PLAN)
    if end == "timed_out":
        now[0] += PLAN.wait_s + 1  # the lease lapsed before it arrived: refused after it queued
        return await hold.wait("k", 5)
    task = asyncio.create_task(hold.wait("k", 5))
    await _started(hold, 1)
    if end == "released":
        hold.release()
    elif end == "failed":
        hold.fail("the new engine did not start")
    else:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return Refused(Outcome.DROPPED, "", 5, 0.0)
    return await task


@pytest.mark.parametrize("end", ["released", "failed", "timed_out", "dropped"])
async def test_a_key_is_not_locked_out_after_per_key_max_holds(end: str) -> None:
    # The share is per key and only counts requests waiting *now*: a leaked share would refuse the
    # key (FULL) once it had been held per_key_max times in all, even with nobody waiting.
    now = [0.0]
    hold = Hold(clock=lambda: now[0])  # the default share: 64 per key
    expected = {"released": Outcome.RELEASED, "failed": Outcome.FAILED, "timed_out": Outcome.TIMED_OUT,
                "dropped": Outcome.DROPPED}[end]
    for _ in range(hold.per_key_max + 2):
        got = await _one_held_request(hold, now, end)
        assert (got.outcome if isinstance(got, Refused) else Outcome.RELEASED) is expected
        assert hold.waiting == 0
    assert hold.outcomes[Outcome.FULL] == 0
    assert hold.outcomes[expected] == hold.per_key_max + 2


async def test_a_key_share_counts_only_its_requests_still_waiting() -> None:
    hold = Hold(per_key_max=2)
    hold.begin(PLAN)
    first = asyncio.create_task(hold.wait("k", 5))
    second = asyncio.create_task(hold.wait("k", 5))
    await _started(hold, 2)
    first.cancel()  # one of two leaves: the key has one request waiting, room for one more
    with pytest.raises(asyncio.CancelledError):
        await first
    third = asyncio.create_task(hold.wait("k", 5))
    await _started(hold, 2)
    # Second and third wait: the share is full again. (Awaited as a task: a wrongly admitted fourth
    # would wait out the hold instead of failing at once.)
    fourth = asyncio.create_task(hold.wait("k", 5))
    for _ in range(200):
        if fourth.done() or hold.waiting > 2:
            break
        await asyncio.sleep(0.005)
    assert fourth.done(), "a fourth request of the key was queued past its share of 2"
    refused = fourth.result()
    assert isinstance(refused, Refused) and refused.outcome is Outcome.FULL
    other = asyncio.create_task(hold.wait("other", 5))  # another key has its own share
    await _started(hold, 3)
    assert hold.release() == 3
    assert all(isinstance(r, Released) for r in await asyncio.gather(second, third, other))
    hold.begin(PLAN)
    again = [asyncio.create_task(hold.wait("k", 5)) for _ in range(2)]  # nothing leaked
    await _started(hold, 2)
    hold.release()
    assert all(isinstance(r, Released) for r in await asyncio.gather(*again))
