"""Per-key limits: requests per minute (a token bucket) and concurrent in-flight requests.

Pure bookkeeping with an injected clock, so tests drive time by hand. State lives in this process
only: the gateway is a single process, and a restart forgetting a minute of rate history is harmless.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from controller.gateway.keystore import KeyRecord


@dataclass(frozen=True)
class LimitExceeded:
    reason: str
    retry_after_s: int


@dataclass
class _KeyState:
    tokens: float
    stamp: float
    in_flight: int = 0


class Lease:
    """One admitted request; ``release()`` when it ends (idempotent)."""

    __slots__ = ("_released", "_state")

    def __init__(self, state: _KeyState) -> None:
        self._state = state
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._state.in_flight -= 1


class KeyLimiter:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._states: dict[str, _KeyState] = {}

    def in_flight(self, key_id: str) -> int:
        state = self._states.get(key_id)
        return state.in_flight if state else 0

    def standing(self, key: KeyRecord) -> tuple[int, int, float] | None:
        """Where the key stands on requests per minute, for ``x-ratelimit-*``: (limit, remaining,
        seconds until the bucket is full again); None without an rpm limit."""
        if key.rpm_limit is None:
            return None
        state = self._states.get(key.id)
        limit = key.rpm_limit
        rate = limit / 60.0
        if state is None:
            return limit, limit, 0.0
        level = min(float(limit), state.tokens + max(0.0, self._clock() - state.stamp) * rate)
        return limit, max(0, math.floor(level)), (limit - level) / rate

    def try_acquire(self, key: KeyRecord) -> Lease | LimitExceeded:
        now = self._clock()
        state = self._states.get(key.id)
        if state is None:
            state = _KeyState(tokens=float(key.rpm_limit or 0), stamp=now)
            self._states[key.id] = state
        if key.max_concurrent is not None and state.in_flight >= key.max_concurrent:
            # A slot frees when some stream ends; we cannot know when, 1 s is the smallest hint.
            return LimitExceeded(f"too many concurrent requests for this key (limit {key.max_concurrent})", 1)
        if key.rpm_limit is not None:
            # The bucket holds a minute's worth and refills continuously: rpm/60 per second.
            rate = key.rpm_limit / 60.0
            state.tokens = min(float(key.rpm_limit), state.tokens + (now - state.stamp) * rate)
            state.stamp = now
            if state.tokens < 1.0:
                wait = (1.0 - state.tokens) / rate
                return LimitExceeded(
                    f"rate limit exceeded for this key ({key.rpm_limit} requests per minute)",
                    max(1, math.ceil(wait)),
                )
            state.tokens -= 1.0
        state.in_flight += 1
        return Lease(state)
