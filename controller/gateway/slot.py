"""The upstream slot: which engine new requests go to, and the requests still running on each.

The controller points the slot at the ready engine, or at none while the engine starts, restarts
or backs off (DOMAIN: one engine per host, so a restart always has a gap). With no slot, a new
request is refused at once with 503 + Retry-After, or waits in a bounded queue for a bounded time:
never an unbounded hang. A switch drains: requests already running on the old upstream may finish
until the deadline, then are aborted so that the engine can be stopped.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from enum import Enum


class NoSlotPolicy(Enum):
    REJECT = "reject"
    QUEUE = "queue"


@dataclass(frozen=True)
class Upstream:
    url: str  # base URL, no trailing slash, e.g. http://127.0.0.1:8000
    served_model: str | None
    generation: int
    # "Bearer <the engine's per-launch key>", built once per switch (not per request); sent upstream
    # instead of the client's header. Kept out of repr so that no log line ever shows it.
    authorization: str | None = field(default=None, repr=False)
    # Other names clients may use for the served model (the recipe's `model.aliases`): the gateway
    # rewrites them to `served_model`, and answers 404 for any other name.
    aliases: frozenset[str] = frozenset()


@dataclass(frozen=True)
class NoSlot:
    reason: str
    retry_after_s: int


@dataclass(frozen=True)
class DrainResult:
    drained: bool  # True if every request in scope ended before the deadline
    aborted: int  # requests cut off at the deadline
    remaining: int  # still running when we returned (aborted ones that had not unwound yet)
    waited_s: float

    def as_dict(self) -> dict[str, object]:
        return {
            "drained": self.drained,
            "aborted": self.aborted,
            "remaining": self.remaining,
            "waited_s": round(self.waited_s, 3),
        }


class InFlight:
    """A running proxied request; ``abort`` is how a drain cuts it off."""

    __slots__ = ("abort", "generation")

    def __init__(self, generation: int, abort: Callable[[], None]) -> None:
        self.generation = generation
        self.abort = abort


# How long a drain waits for aborted requests to unwind before returning anyway.
_ABORT_GRACE_S = 2.0


class Slot:
    def __init__(
        self,
        policy: NoSlotPolicy = NoSlotPolicy.REJECT,
        queue_max: int = 64,
        queue_timeout_s: float = 30.0,
        retry_after_s: int = 5,
    ) -> None:
        self.policy = policy
        self.queue_max = queue_max
        self.queue_timeout_s = queue_timeout_s
        self.retry_after_s = retry_after_s
        self._current: Upstream | None = None
        self._generation = 0
        self._available = asyncio.Event()
        self._waiting = 0
        self._in_flight: set[InFlight] = set()
        self._changed = asyncio.Event()  # set whenever an in-flight request ends
        # Why there is no upstream when the controller said so (the diagnosis' one line, "stopped"):
        # the 503 of a request that finds none says it. None: starting, restarting or backing off.
        self.detail: str | None = None
        # Told of every new upstream (or None) as it is set: the hold releases its waiters there.
        self.on_set: Callable[[Upstream | None], None] | None = None

    @property
    def current(self) -> Upstream | None:
        return self._current

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def set(
        self,
        url: str | None,
        served_model: str | None,
        retry_after_s: int | None = None,
        *,
        upstream_key: str | None = None,
        aliases: Iterable[str] = (),
    ) -> Upstream | None:
        """Point new requests at ``url`` (or at nothing). Returns the new upstream."""
        if retry_after_s is not None:
            self.retry_after_s = retry_after_s
        self._generation += 1
        if url is None:
            self._current = None
            self._available.clear()
        else:
            self._current = Upstream(
                url=url.rstrip("/"),
                served_model=served_model,
                generation=self._generation,
                authorization=f"Bearer {upstream_key}" if upstream_key else None,
                aliases=frozenset(aliases),
            )
            self._available.set()
        if self.on_set is not None:
            self.on_set(self._current)
        return self._current

    async def acquire(self) -> Upstream | NoSlot:
        current = self._current
        if current is not None:
            return current
        if self.policy is NoSlotPolicy.REJECT:
            return NoSlot(self.detail or "no engine is ready (starting, restarting or backing off)",
                          self.retry_after_s)
        if self._waiting >= self.queue_max:
            return NoSlot(
                f"no engine is ready and the wait queue is full ({self.queue_max})", self.retry_after_s
            )
        self._waiting += 1
        try:
            async with asyncio.timeout(self.queue_timeout_s):
                while self._current is None:
                    await self._available.wait()
                    # A set(None) may race with the wake-up; loop until a slot is really there.
        except TimeoutError:
            why = f" ({self.detail})" if self.detail else ""
            return NoSlot(f"no engine became ready within {self.queue_timeout_s:g} s{why}",
                          self.retry_after_s)
        finally:
            self._waiting -= 1
        return self._current

    def track(self, upstream: Upstream, abort: Callable[[], None]) -> InFlight:
        entry = InFlight(upstream.generation, abort)
        self._in_flight.add(entry)
        return entry

    def untrack(self, entry: InFlight) -> None:
        self._in_flight.discard(entry)
        self._changed.set()

    async def drain(
        self, deadline_s: float, abort: bool, before_generation: int | None = None
    ) -> DrainResult:
        """Wait until requests in scope end (all, or those older than ``before_generation``),
        at most ``deadline_s``; then, if ``abort``, cut the rest off and give them a moment to unwind."""
        start = time.monotonic()

        def in_scope() -> list[InFlight]:
            if before_generation is None:
                return list(self._in_flight)
            return [e for e in self._in_flight if e.generation < before_generation]

        deadline = start + max(0.0, deadline_s)
        while in_scope():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._changed.clear()
            try:
                async with asyncio.timeout(left):
                    await self._changed.wait()
            except TimeoutError:
                break
        rest = in_scope()
        if not rest or not abort:
            return DrainResult(
                drained=not rest, aborted=0, remaining=len(rest), waited_s=time.monotonic() - start
            )
        for entry in rest:
            entry.abort()
        grace_end = time.monotonic() + _ABORT_GRACE_S
        while in_scope() and time.monotonic() < grace_end:
            self._changed.clear()
            try:
                async with asyncio.timeout(grace_end - time.monotonic()):
                    await self._changed.wait()
            except TimeoutError:
                break
        return DrainResult(
            drained=False, aborted=len(rest), remaining=len(in_scope()), waited_s=time.monotonic() - start
        )

    async def switch(
        self,
        url: str | None,
        served_model: str | None,
        drain_deadline_s: float,
        retry_after_s: int | None = None,
        *,
        upstream_key: str | None = None,
        aliases: Iterable[str] = (),
    ) -> tuple[Upstream | None, DrainResult]:
        """Send new requests to ``url`` at once, then drain the requests still on older upstreams.
        Re-asserting the current upstream changes nothing (a controller retry must not cut streams)."""
        cur = self._current
        if (
            cur is not None
            and url is not None
            and cur.url == url.rstrip("/")
            and cur.served_model == served_model
            and cur.authorization == (f"Bearer {upstream_key}" if upstream_key else None)
        ):
            if retry_after_s is not None:
                self.retry_after_s = retry_after_s
            if cur.aliases != frozenset(aliases):  # names only: the same engine, nothing to drain
                self._current = cur = replace(cur, aliases=frozenset(aliases))
            return cur, DrainResult(drained=True, aborted=0, remaining=0, waited_s=0.0)
        new = self.set(url, served_model, retry_after_s, upstream_key=upstream_key, aliases=aliases)
        result = await self.drain(drain_deadline_s, abort=True, before_generation=self._generation)
        return new, result
