"""The gateway's hold (controller/gateway/hold/queue.py): bounded in count, per key and in time; released in
arrival order; answered with the controller's reason when the switch fails; a client that goes away
is dropped at once.

Time is a manual clock (``ManualTime``) at the hold's two seams, ``clock`` and ``wait_for``: a wait runs
out only when a test moves the clock, and every "it answers at once" is checked within a bounded number
of event-loop turns, so a hold that fails to answer fails its test at once instead of waiting out a
real bound (outcomes only, no wall-clock timing). Two tests keep the loop's real timer
(``wait_on_loop``) with bounds of a few tenths of a second."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from controller.gateway.config import GatewayConfig
from controller.gateway.hold.queue import Hold, HoldPlan, Outcome, Refused, Released, bind_metrics
from controller.gateway.hold.sse import SseAfterHold, wants_stream
from controller.gateway.metrics import GatewayMetrics

T = TypeVar("T")
PLAN = HoldPlan("warm restart", wait_s=30.0, expected_ready_s=35.0)

# Event-loop turns a waiter gets to do what needs no time (queue, take its answer); a few are enough.
_TURNS = 50


class ManualTime:
    """A clock that moves only by ``advance``, and a ``wait_for`` whose timeouts run on it."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now
        self._timers: list[tuple[float, asyncio.Future[None]]] = []

    def clock(self) -> float:
        return self.now

    async def wait_for(self, future: asyncio.Future[str | None], timeout: float) -> bool:
        if future.done() or timeout <= 0:
            return future.done()
        wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        timer = (self.now + timeout, wake)
        self._timers.append(timer)
        try:
            either: list[asyncio.Future[Any]] = [future, wake]
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)  # never cancels them
        finally:
            self._timers.remove(timer)
        return future.done()

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for at, wake in self._timers:
            if at <= self.now and not wake.done():
                wake.set_result(None)


def _hold(time: ManualTime, **kwargs: float) -> Hold:
    return Hold(clock=time.clock, wait_for=time.wait_for, **kwargs)  # type: ignore[arg-type]


async def _turns(n: int = _TURNS) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def _started(hold: Hold, n: int) -> None:
    for _ in range(_TURNS):
        if hold.waiting >= n:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{n} waiters never queued ({hold.waiting})")


async def _answered(*tasks: asyncio.Task[T]) -> list[T]:
    """The tasks' results, which must come within a few loop turns (no clock moves meanwhile)."""
    for _ in range(_TURNS):
        if all(t.done() for t in tasks):
            break
        await asyncio.sleep(0)
    assert all(t.done() for t in tasks), "a waiter was not answered at once"
    return [t.result() for t in tasks]


async def _now(call: Awaitable[T]) -> T:
    """``call``'s result, which must come without a clock move (a refusal at once)."""
    task = asyncio.ensure_future(call)
    return (await _answered(task))[0]


async def test_held_requests_are_released_in_arrival_order() -> None:
    hold = _hold(ManualTime())
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
    await _answered(*tasks)
    assert order == [0, 1, 2, 3, 4]
    assert hold.outcomes[Outcome.RELEASED] == 5
    assert not hold.holding() and hold.waiting == 0


async def test_a_release_on_the_loops_real_timer() -> None:
    hold = Hold()  # time.monotonic and wait_on_loop: the gateway's own seams
    hold.begin(PLAN)
    task = asyncio.create_task(hold.wait("k", 5))
    await _started(hold, 1)
    assert hold.release() == 1
    got = (await _answered(task))[0]
    assert isinstance(got, Released) and got.waited_s >= 0


async def test_a_full_queue_and_a_full_key_share_are_refused_at_once() -> None:
    hold = _hold(ManualTime(), max_waiting=3, per_key_max=2)
    hold.begin(PLAN)
    tasks = [asyncio.create_task(hold.wait("a", 5)) for _ in range(2)]
    await _started(hold, 2)
    same_key = await _now(hold.wait("a", 7))
    assert isinstance(same_key, Refused) and same_key.outcome is Outcome.FULL
    assert same_key.reason == ("no engine is ready (switching: warm restart) and this key already has 2 "
                               "requests waiting")
    assert same_key.retry_after_s == 7 and same_key.waited_s == 0.0
    tasks.append(asyncio.create_task(hold.wait("b", 5)))
    await _started(hold, 3)
    full = await _now(hold.wait("c", 6))
    assert isinstance(full, Refused) and full.outcome is Outcome.FULL
    assert full.reason == ("no engine is ready (switching: warm restart) and the wait queue is full "
                           "(3 requests)")
    assert full.retry_after_s == 6 and full.waited_s == 0.0
    hold.release()
    assert all(isinstance(r, Released) for r in await _answered(*tasks))
    assert hold.outcomes[Outcome.FULL] == 2


async def test_the_queue_and_a_key_share_are_full_at_exactly_their_bound() -> None:
    # One below the bound is admitted, the bound itself is not (>=, not >).
    hold = _hold(ManualTime(), max_waiting=2, per_key_max=2)
    hold.begin(PLAN)
    tasks = [asyncio.create_task(hold.wait("a", 5))]
    await _started(hold, 1)
    tasks.append(asyncio.create_task(hold.wait("a", 5)))  # the key's second: admitted
    await _started(hold, 2)
    third = await _now(hold.wait("b", 5))  # another key, but the queue holds 2 of 2
    assert isinstance(third, Refused) and "queue is full" in third.reason
    assert hold.release() == 2
    await _answered(*tasks)


async def test_a_failed_switch_answers_every_waiter_with_its_reason() -> None:
    time = ManualTime(1000.0)  # far from 0: a wait is a difference of two readings
    hold = _hold(time)
    hold.begin(PLAN)
    tasks = [asyncio.create_task(hold.wait("k", 5)) for _ in range(3)]
    await _started(hold, 3)
    time.advance(2.5)
    assert hold.fail("the new engine failed to start: out of memory while loading the model") == 3
    for got in await _answered(*tasks):
        assert isinstance(got, Refused) and got.outcome is Outcome.FAILED
        assert got.reason == "the new engine failed to start: out of memory while loading the model"
        assert got.retry_after_s == 5 and got.waited_s == 2.5
    assert not hold.holding() and hold.plan is None and hold.waiting == 0
    assert hold.outcomes[Outcome.FAILED] == 3 and hold.longest_wait_s == 2.5


async def test_past_its_wait_a_request_gets_a_refusal_not_a_hang() -> None:
    hold = Hold()  # the loop's real timer: 0.2 s
    hold.begin(HoldPlan("warm restart", wait_s=0.2))
    got = await hold.wait("k", 5)
    assert isinstance(got, Refused) and got.outcome is Outcome.TIMED_OUT
    assert "within 0.2 s" in got.reason


async def test_a_request_waits_its_bound_on_the_clock_and_no_longer() -> None:
    time = ManualTime(100.0)
    hold = _hold(time)
    hold.begin(HoldPlan("warm restart", wait_s=20.0))
    time.advance(5.0)  # arrives 5 s into the hold: its own 20 s run to 125, the lease to 120
    hold.begin(HoldPlan("warm restart", wait_s=20.0))  # renewed: the lease now runs to 125 as well
    task = asyncio.create_task(hold.wait("k", 4))
    await _started(hold, 1)
    time.advance(19.9)
    await _turns()
    assert not task.done(), "refused before its bound"
    time.advance(0.1)  # exactly its bound: the last instant is past it, as for the lease
    got = (await _answered(task))[0]
    assert isinstance(got, Refused) and got.outcome is Outcome.TIMED_OUT
    assert got.reason == ("no engine became ready within 20 s of waiting (switching: warm restart); "
                          "the hold took longer")
    assert got.retry_after_s == 4 and got.waited_s == pytest.approx(20.0)
    assert hold.waiting == 0 and hold.outcomes[Outcome.TIMED_OUT] == 1


async def test_a_lapsed_lease_refuses_a_waiter_before_its_own_bound() -> None:
    time = ManualTime()
    hold = _hold(time)
    hold.begin(HoldPlan("apply", wait_s=10.0))
    time.advance(4.0)
    task = asyncio.create_task(hold.wait("k", 5))  # its own bound: 14; the lease: 10
    await _started(hold, 1)
    time.advance(6.0)
    got = (await _answered(task))[0]
    assert isinstance(got, Refused) and got.outcome is Outcome.TIMED_OUT
    assert got.reason == ("no engine became ready within 10 s of waiting (switching: apply); the hold "
                          "lapsed (the controller did not renew it)")
    assert got.waited_s == 6.0


async def test_a_hold_the_controller_stops_renewing_lapses() -> None:
    time = ManualTime()
    hold = _hold(time)
    hold.begin(HoldPlan("apply", wait_s=10.0))
    assert hold.holding()
    time.now = 10.0  # the lease ends on its last instant, as a waiter's bound does
    assert not hold.holding()
    time.now = 10.5  # no renewal: the controller died
    assert not hold.holding()
    got = await _now(hold.wait("k", 5))
    assert isinstance(got, Refused) and got.outcome is Outcome.TIMED_OUT
    hold.begin(HoldPlan("apply", wait_s=10.0))  # a renewal starts a fresh lease
    assert hold.holding()


async def test_a_wait_is_bounded_by_max_wait_s_and_never_negative() -> None:
    time = ManualTime()
    hold = _hold(time)
    hold.begin(HoldPlan("apply", wait_s=1e9))
    assert hold.plan is not None and hold.plan.wait_s == 3600.0
    time.now = 3599.0
    assert hold.holding()
    time.now = 3600.0
    assert not hold.holding()
    hold.begin(HoldPlan("apply", wait_s=-5.0))
    assert hold.plan is not None and hold.plan.wait_s == 0.0 and not hold.holding()


async def test_a_client_that_goes_away_is_dropped_at_once() -> None:
    time = ManualTime(1000.0)
    hold = _hold(time)
    hold.begin(PLAN)
    task = asyncio.create_task(hold.wait("k", 5))
    await _started(hold, 1)
    time.advance(1.5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert hold.waiting == 0 and hold.outcomes[Outcome.DROPPED] == 1
    assert hold.longest_wait_s == 1.5
    assert hold.release() == 0


async def test_a_streaming_waiter_is_told_why_and_when() -> None:
    time = ManualTime(1000.0)
    hold = _hold(time, tick_interval_s=5.0)
    hold.begin(HoldPlan("warm restart", wait_s=30.0, expected_ready_s=12.0))
    lines: list[str] = []

    async def tick(text: str) -> None:
        lines.append(text)

    task = asyncio.create_task(hold.wait("k", 5, tick))
    await _started(hold, 1)
    await _turns()
    assert lines == ["waiting for the engine (warm restart), ready in ~12 s"]  # at once
    time.advance(4.9)
    await _turns()
    assert len(lines) == 1, "a tick before its interval"
    time.advance(0.1)
    await _turns()
    assert lines[1:] == ["waiting for the engine (warm restart), ready in ~7 s"]  # every 5 s
    time.advance(5.0)
    await _turns()
    time.advance(5.0)
    await _turns()
    assert lines[2:] == ["waiting for the engine (warm restart), ready in ~2 s",
                         "waiting for the engine (warm restart), ready any moment now"]
    hold.release()
    got = (await _answered(task))[0]
    assert isinstance(got, Released) and got.waited_s == 15.0


async def test_no_hold_means_refused_at_once() -> None:
    got = await _now(_hold(ManualTime()).wait("k", 6))
    assert isinstance(got, Refused) and got.waited_s == 0.0
    assert got.outcome is Outcome.TIMED_OUT and got.reason == "no engine is ready" and got.retry_after_s == 6


def test_the_comment_line_says_why_and_when() -> None:
    time = ManualTime()
    hold = _hold(time)
    assert hold.line() == "waiting for the engine (switching)"  # no plan, no estimate
    hold.begin(HoldPlan("apply", wait_s=60.0))
    assert hold.line() == "waiting for the engine (apply)"
    hold.begin(HoldPlan("apply", wait_s=60.0, expected_ready_s=10.0))
    time.now = 9.4  # 0.6 s left: rounds to 1
    assert hold.line() == "waiting for the engine (apply), ready in ~1 s"
    time.now = 9.8  # 0.2 s left: rounds to 0, but "any moment" is only for a passed estimate
    assert hold.line() == "waiting for the engine (apply), ready in ~1 s"
    time.now = 10.0
    assert hold.line() == "waiting for the engine (apply), ready any moment now"
    time.now = 12.0
    assert hold.ready_in_s() == 0.0 and hold.line().endswith("ready any moment now")
    time.now = 7.5
    assert hold.ready_in_s() == 2.5 and hold.line().endswith("ready in ~2 s")


async def test_the_view_shows_the_hold_its_queue_and_its_outcomes() -> None:
    time = ManualTime()
    hold = _hold(time)
    assert hold.view() == {
        "holding": False, "reason": None, "wait_s": None, "ready_in_s": None, "waiting": 0,
        "outcomes": {"released": 0, "timed_out": 0, "dropped": 0, "full": 0, "failed": 0},
        "longest_wait_s": 0.0,
    }
    hold.begin(HoldPlan("switching to cpu-smollm2-eager", wait_s=90.0, expected_ready_s=40.0))
    task = asyncio.create_task(hold.wait("k", 5))
    await _started(hold, 1)
    time.now = 1.23456
    hold.release()
    await _answered(task)
    hold.begin(HoldPlan("switching to cpu-smollm2-eager", wait_s=90.0, expected_ready_s=40.0 - 1.23456))
    time.now = 7.26
    assert hold.view() == {
        "holding": True, "reason": "switching to cpu-smollm2-eager", "wait_s": 90.0, "ready_in_s": 32.7,
        "waiting": 0,
        "outcomes": {"released": 1, "timed_out": 0, "dropped": 0, "full": 0, "failed": 0},
        "longest_wait_s": 1.235,
    }
    hold.release()  # an estimate without a plan is not shown
    view = hold.view()
    assert view["holding"] is False and view["reason"] is None and view["ready_in_s"] is None


async def test_the_view_counts_the_waiters() -> None:
    hold = _hold(ManualTime())
    hold.begin(PLAN)
    tasks = [asyncio.create_task(hold.wait("k", 5)) for _ in range(2)]
    await _started(hold, 2)
    assert hold.view()["waiting"] == 2
    hold.release()
    await _answered(*tasks)
    assert hold.view()["waiting"] == 0


def test_metrics_count_each_outcome() -> None:
    metrics = GatewayMetrics()
    registry = metrics.registry
    hold = _hold(ManualTime())
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


async def _one_held_request(hold: Hold, time: ManualTime, end: str) -> Released | Refused:
    """One request of key "k" through a hold that ends the way ``end`` says."""
    time.advance(100.0)
    hold.begin(PLAN)
    task = asyncio.create_task(hold.wait("k", 5))
    await _started(hold, 1)
    if end == "released":
        hold.release()
    elif end == "failed":
        hold.fail("the new engine did not start")
    elif end == "timed_out":
        time.advance(PLAN.wait_s)  # it waited its bound: refused after it queued
    else:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return Refused(Outcome.DROPPED, "", 5, 0.0)
    return (await _answered(task))[0]


@pytest.mark.parametrize("end", ["released", "failed", "timed_out", "dropped"])
async def test_a_key_is_not_locked_out_after_per_key_max_holds(end: str) -> None:
    # The share is per key and only counts requests waiting *now*: a leaked share would refuse the
    # key (FULL) once it had been held per_key_max times in all, even with nobody waiting.
    time = ManualTime()
    hold = _hold(time)  # the default share: 64 per key
    expected = {"released": Outcome.RELEASED, "failed": Outcome.FAILED, "timed_out": Outcome.TIMED_OUT,
                "dropped": Outcome.DROPPED}[end]
    for _ in range(hold.per_key_max + 2):
        got = await _one_held_request(hold, time, end)
        assert (got.outcome if isinstance(got, Refused) else Outcome.RELEASED) is expected
        assert hold.waiting == 0
    assert hold.outcomes[Outcome.FULL] == 0
    assert hold.outcomes[expected] == hold.per_key_max + 2


async def test_a_key_share_counts_only_its_requests_still_waiting() -> None:
    hold = _hold(ManualTime(), per_key_max=2)
    hold.begin(PLAN)
    first = asyncio.create_task(hold.wait("k", 5))
    second = asyncio.create_task(hold.wait("k", 5))
    await _started(hold, 2)
    first.cancel()  # one of two leaves: the key has one request waiting, room for one more
    with pytest.raises(asyncio.CancelledError):
        await first
    third = asyncio.create_task(hold.wait("k", 5))
    await _started(hold, 2)
    # Second and third wait: the share is full again; a fourth is refused at once.
    refused = await _now(hold.wait("k", 5))
    assert isinstance(refused, Refused) and refused.outcome is Outcome.FULL
    other = asyncio.create_task(hold.wait("other", 5))  # another key has its own share
    await _started(hold, 3)
    assert hold.release() == 3
    assert all(isinstance(r, Released) for r in await _answered(second, third, other))
    hold.begin(PLAN)
    again = [asyncio.create_task(hold.wait("k", 5)) for _ in range(2)]  # nothing leaked
    await _started(hold, 2)
    hold.release()
    assert all(isinstance(r, Released) for r in await _answered(*again))


def test_the_defaults_are_the_gateways_and_the_plan_is_kept_as_given() -> None:
    config = GatewayConfig(keys_db=Path("unused"))
    hold = Hold()
    assert (hold.max_waiting, hold.per_key_max, hold.tick_interval_s) == (
        config.hold_max, config.hold_per_key_max, config.hold_tick_s)
    hold.begin(PLAN)
    assert hold.plan == PLAN


async def test_a_share_of_one_admits_the_keys_first_request() -> None:
    hold = _hold(ManualTime(), per_key_max=1)
    hold.begin(PLAN)
    first = asyncio.create_task(hold.wait("k", 5))
    await _started(hold, 1)
    second = await _now(hold.wait("k", 5))
    assert isinstance(second, Refused) and second.outcome is Outcome.FULL
    hold.release()
    assert isinstance((await _answered(first))[0], Released)


async def test_a_request_with_under_a_second_of_lease_left_still_waits() -> None:
    time = ManualTime()
    hold = _hold(time)
    hold.begin(HoldPlan("apply", wait_s=10.0))
    time.advance(9.5)
    task = asyncio.create_task(hold.wait("k", 5))
    await _started(hold, 1)
    await _turns()
    assert not task.done(), "refused with 0.5 s of the lease left"
    hold.release()
    assert isinstance((await _answered(task))[0], Released)


async def test_refusals_and_waits_reach_the_metrics() -> None:
    metrics = GatewayMetrics()
    time = ManualTime(1000.0)
    hold = _hold(time)
    bind_metrics(hold, metrics)
    await _now(hold.wait("k", 5))  # no hold: refused (timed_out, 0 s)
    hold.begin(PLAN)
    task = asyncio.create_task(hold.wait("k", 5))
    await _started(hold, 1)
    time.advance(4.0)
    hold.release()
    await _answered(task)
    sample = metrics.registry.get_sample_value
    assert sample("appliance_gateway_hold_requests_total", {"outcome": "timed_out"}) == 1
    assert sample("appliance_gateway_hold_requests_total", {"outcome": "released"}) == 1
    assert sample("appliance_gateway_hold_wait_seconds_count") == 2
    assert sample("appliance_gateway_hold_wait_seconds_sum") == 4.0
