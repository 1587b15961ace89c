"""Holding requests while the controller switches the engine on purpose, instead of refusing them.

A restart, an apply of another recipe, the second (warm) start of a warm-up, or a relaunch with a next
try scheduled all leave the gateway without an upstream for the length of an engine start (MEASURED.md:
~40–75 s for a warm CPU restart). The controller says so (``PUT /admin/upstream`` with a ``hold``, or
``PUT /admin/hold`` to renew it with a better estimate), and new requests then wait here:

- bounded in number (``max_waiting``) and per key (``per_key_max``: one client cannot take the queue);
  over either, 503 + Retry-After at once;
- bounded in time: each waits at most the hold's ``wait_s`` from its arrival, and a hold the controller
  stops renewing lapses ``wait_s`` after the last renewal (a controller that died leaves nobody hanging);
  past the bound, 503 + Retry-After as without a hold;
- released in arrival order when the controller points the slot at the new engine;
- answered 503 with the controller's reason at once when the switch fails for good (the diagnosis'
  one line: the new engine did not start) or the engine is stopped.

A client that disconnects while waiting is dropped at once (the proxy's disconnect hook cancels its
task). Pure bookkeeping on the event loop, with an injected clock and timer (``clock``, ``wait_for``) so
that tests drive time by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum

from controller.gateway.metrics import GatewayMetrics

# Waiting for longer than this is never reasonable for a client: bounded even if a caller asks more.
MAX_WAIT_S = 3600.0


class Outcome(StrEnum):
    RELEASED = "released"  # the new engine became ready; the request went on to it
    TIMED_OUT = "timed_out"  # waited its bound (or the hold lapsed): 503 + Retry-After
    DROPPED = "dropped"  # the client went away while waiting
    FULL = "full"  # refused at once: the queue (or the key's share of it) was full
    FAILED = "failed"  # the switch failed or was given up: 503 with the controller's reason


@dataclass(frozen=True)
class HoldPlan:
    """What the controller says when it begins (or renews) a hold."""

    reason: str  # shown to waiting clients, e.g. "warm restart", "switching to cpu-smollm2-eager"
    wait_s: float  # the longest a request waits, from its arrival; also the hold's lease
    expected_ready_s: float | None = None  # from now; None: no estimate


@dataclass(frozen=True)
class Released:
    waited_s: float


@dataclass(frozen=True)
class Refused:
    outcome: Outcome
    reason: str
    retry_after_s: int
    waited_s: float


@dataclass
class _Waiter:
    key_id: str
    arrived: float
    future: asyncio.Future[str | None]  # None: released; a string: refused with that reason


# (text of a comment line without the leading ": ") → sent to a streaming client while it waits.
Tick = Callable[[str], Awaitable[None]]

# Waits for a waiter's answer at most ``timeout`` seconds of ``clock`` time; True when it came. The
# seam beside ``clock``: a test's manual clock must also decide when a wait runs out, or a test that
# moves the clock still waits out real time (and a broken release hangs it until its wall limit).
WaitFor = Callable[[asyncio.Future[str | None], float], Awaitable[bool]]


async def wait_on_loop(future: asyncio.Future[str | None], timeout: float) -> bool:
    """The real timer: the event loop's. Shielded: a timeout must not cancel the waiter's answer."""
    try:
        await asyncio.wait_for(asyncio.shield(future), timeout=max(0.0, timeout))
    except TimeoutError:
        return False
    return True


class Hold:
    def __init__(
        self,
        max_waiting: int = 256,
        per_key_max: int = 64,
        tick_interval_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        wait_for: WaitFor = wait_on_loop,
    ) -> None:
        self.max_waiting = max_waiting
        self.per_key_max = per_key_max
        self.tick_interval_s = tick_interval_s
        self._clock = clock
        self._wait_for = wait_for
        self._plan: HoldPlan | None = None
        self._lease_until = 0.0
        self._ready_at: float | None = None
        self._waiters: deque[_Waiter] = deque()
        self._per_key: dict[str, int] = {}
        self.outcomes: dict[Outcome, int] = dict.fromkeys(Outcome, 0)
        self.longest_wait_s = 0.0
        # Observers: (outcome, seconds waited) for every request that entered or was refused.
        self.on_outcome: Callable[[Outcome, float], None] | None = None

    # ------------------------------------------------------------------------------------------
    # The controller's side

    def begin(self, plan: HoldPlan) -> None:
        """Hold new requests (or renew the hold: a later estimate, a fresh lease)."""
        now = self._clock()
        wait = max(0.0, min(plan.wait_s, MAX_WAIT_S))
        self._plan = HoldPlan(plan.reason, wait, plan.expected_ready_s)
        self._lease_until = now + wait
        self._ready_at = now + plan.expected_ready_s if plan.expected_ready_s is not None else None

    def release(self) -> int:
        """The new engine is ready: every waiter goes on, in arrival order. Returns how many."""
        self._plan = None
        return self._finish(None)

    def fail(self, reason: str) -> int:
        """The switch failed or was given up: every waiter gets 503 with ``reason``; no more holding."""
        self._plan = None
        return self._finish(reason)

    def _finish(self, reason: str | None) -> int:
        n = 0
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.future.done():
                waiter.future.set_result(reason)
                n += 1
        return n

    # ------------------------------------------------------------------------------------------
    # What it looks like

    @property
    def plan(self) -> HoldPlan | None:
        return self._plan

    def holding(self) -> bool:
        """A hold is on and its lease has not lapsed."""
        return self._plan is not None and self._clock() < self._lease_until

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def ready_in_s(self) -> float | None:
        """Seconds until the expected ready time (never below 0); None without an estimate."""
        if self._ready_at is None:
            return None
        return max(0.0, self._ready_at - self._clock())

    def line(self) -> str:
        """A streaming waiter's comment: "waiting for the engine (warm restart), ready in ~35 s"."""
        reason = self._plan.reason if self._plan is not None else "switching"
        eta = self.ready_in_s()
        if eta is None:
            return f"waiting for the engine ({reason})"
        if eta <= 0:
            return f"waiting for the engine ({reason}), ready any moment now"
        return f"waiting for the engine ({reason}), ready in ~{max(1, round(eta))} s"

    def view(self) -> dict[str, object]:
        plan = self._plan
        eta = self.ready_in_s()
        return {
            "holding": self.holding(),
            "reason": plan.reason if plan is not None else None,
            "wait_s": plan.wait_s if plan is not None else None,
            "ready_in_s": round(eta, 1) if eta is not None and plan is not None else None,
            "waiting": self.waiting,
            "outcomes": {o.value: n for o, n in self.outcomes.items()},
            "longest_wait_s": round(self.longest_wait_s, 3),
        }

    # ------------------------------------------------------------------------------------------
    # A request's side

    async def wait(self, key_id: str, retry_after_s: int, tick: Tick | None = None) -> Released | Refused:
        """Wait for the release. ``tick`` (streaming clients) is called at once and every
        ``tick_interval_s`` with the comment line. Cancelled (client gone): dropped, re-raised."""
        plan = self._plan
        now = self._clock()
        if plan is None:
            return self._refused(Outcome.TIMED_OUT, "no engine is ready", retry_after_s, 0.0)
        if len(self._waiters) >= self.max_waiting:
            return self._refused(Outcome.FULL, f"no engine is ready (switching: {plan.reason}) and the wait "
                                 f"queue is full ({self.max_waiting} requests)", retry_after_s, 0.0)
        if self._per_key.get(key_id, 0) >= self.per_key_max:
            return self._refused(Outcome.FULL, f"no engine is ready (switching: {plan.reason}) and this key "
                                 f"already has {self.per_key_max} requests waiting", retry_after_s, 0.0)
        loop = asyncio.get_running_loop()
        waiter = _Waiter(key_id, now, loop.create_future())
        self._waiters.append(waiter)
        self._per_key[key_id] = self._per_key.get(key_id, 0) + 1
        deadline = now + plan.wait_s
        try:
            while True:
                if tick is not None:
                    await tick(self.line())
                now = self._clock()
                left = min(deadline, self._lease_until) - now
                if self._plan is None and not waiter.future.done():
                    left = 0.0  # ended without a word (cannot happen through release/fail: they answer all)
                if left <= 0 and not waiter.future.done():
                    why = "lapsed (the controller did not renew it)" if now < deadline else "took longer"
                    reason = (f"no engine became ready within {plan.wait_s:g} s of waiting "
                              f"(switching: {plan.reason}); the hold {why}")
                    return self._refused(Outcome.TIMED_OUT, reason, retry_after_s, now - waiter.arrived)
                step = left if tick is None else min(left, self.tick_interval_s)
                if not await self._wait_for(waiter.future, step):
                    continue
                answer = waiter.future.result()
                waited = self._clock() - waiter.arrived
                if answer is None:
                    self._count(Outcome.RELEASED, waited)
                    return Released(waited)
                return self._refused(Outcome.FAILED, answer, retry_after_s, waited)
        except asyncio.CancelledError:
            self._count(Outcome.DROPPED, self._clock() - waiter.arrived)
            raise
        finally:
            if not waiter.future.done():
                waiter.future.cancel()
            with contextlib.suppress(ValueError):  # released or failed: already taken off
                self._waiters.remove(waiter)
            left_for_key = self._per_key.get(key_id, 1) - 1
            if left_for_key > 0:
                self._per_key[key_id] = left_for_key
            else:
                self._per_key.pop(key_id, None)

    def _refused(self, outcome: Outcome, reason: str, retry_after_s: int, waited_s: float) -> Refused:
        self._count(outcome, waited_s)
        return Refused(outcome, reason, retry_after_s, waited_s)

    def _count(self, outcome: Outcome, waited_s: float) -> None:
        self.outcomes[outcome] += 1
        self.longest_wait_s = max(self.longest_wait_s, waited_s)
        if self.on_outcome is not None:
            self.on_outcome(outcome, waited_s)



def bind_metrics(hold: Hold, metrics: GatewayMetrics) -> None:
    """Feed the gateway's hold series (``metrics.py``) from this hold."""
    metrics.hold_waiting.set_function(lambda: hold.waiting)
    metrics.hold_active.set_function(lambda: 1 if hold.holding() else 0)
    bind_outcomes(hold, metrics)


def bind_outcomes(hold: Hold, metrics: GatewayMetrics) -> None:
    """Count this hold's outcomes and waits in the gateway's series (one hold per engine: the series
    are the sum over engines; the gauges are fed by the app)."""

    def observe(outcome: Outcome, waited_s: float) -> None:
        metrics.hold_requests.labels(outcome.value).inc()
        if outcome is not Outcome.FULL:
            metrics.hold_wait.observe(waited_s)

    hold.on_outcome = observe
