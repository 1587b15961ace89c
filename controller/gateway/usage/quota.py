"""Token quotas per key: tokens per minute and tokens per day, as two token buckets.

A bucket holds up to the limit and refills continuously (the minute bucket at limit/60 per second,
the day bucket at limit/86400). A request is let in while its key's buckets are above zero; when it
ends, the tokens the engine reports (prompt + completion, ``usage.meter``) are taken out, which may
take a bucket below zero: a stream is never cut for its quota, the next request waits instead.
A refused request gets ``Retry-After``: the seconds until the emptiest bucket is back above zero.

Post-charge semantics (the default): requests admitted at the same time all see the same level, so
N concurrent requests on a nearly spent key all run, and the key goes as far below zero as they
spend together (then waits that much longer). An operator who needs a hard ceiling turns on
reservation (``GatewayConfig.quota_reserve``, ``--quota-reserve``): each request then takes its
worst case out of the buckets when it is admitted (``reserve``: prompt estimate + ``max_tokens`` ×
n × prompts; a request without ``max_tokens`` takes whatever is left), and the difference to what the
engine counted is given back when it ends (``settle``). Concurrent requests then stop at the level.
Answers to keys with limits carry where the key stands (``standing`` → ``ratelimit_headers``).

Wall-clock time, not monotonic: the levels are saved with the usage (``usage.store``) and restored
at start-up, refilled for the time the gateway was down, so a restart does not hand out a new day.
Pure bookkeeping with an injected clock (tests drive time by hand); the event loop is its only
caller, so no locks.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from controller.gateway.keystore import KeyRecord
from controller.gateway.limits import LimitExceeded

WINDOWS: dict[str, float] = {"minute": 60.0, "day": 86400.0}


@dataclass
class Bucket:
    level: float
    stamp: float  # wall-clock time of ``level``


@dataclass(frozen=True)
class BucketState:
    """One bucket as saved: key id, window ("minute" or "day"), level, wall-clock stamp."""

    key_id: str
    window: str
    level: float
    stamp: float


def _limits(key: KeyRecord) -> tuple[tuple[str, int], ...]:
    out: list[tuple[str, int]] = []
    if key.tpm_limit is not None:
        out.append(("minute", key.tpm_limit))
    if key.tpd_limit is not None:
        out.append(("day", key.tpd_limit))
    return tuple(out)


class TokenQuotas:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._buckets: dict[tuple[str, str], Bucket] = {}
        self.dirty = False  # charged since the last snapshot (the writer saves only then)

    def _bucket(self, key_id: str, window: str, limit: int, now: float) -> Bucket:
        b = self._buckets.get((key_id, window))
        if b is None:
            b = self._buckets[(key_id, window)] = Bucket(float(limit), now)
            return b
        rate = limit / WINDOWS[window]
        # A clock that stepped back must not drain a bucket; a lowered limit caps the level.
        b.level = min(float(limit), b.level + max(0.0, now - b.stamp) * rate)
        b.stamp = now
        return b

    def check(self, key: KeyRecord) -> LimitExceeded | None:
        """None if the key may send a request now; otherwise the refusal with its Retry-After."""
        limits = _limits(key)
        if not limits:
            return None
        now = self._clock()
        worst: tuple[float, str, int] | None = None
        for window, limit in limits:
            b = self._bucket(key.id, window, limit, now)
            if b.level <= 0.0:
                wait = -b.level / (limit / WINDOWS[window])
                if worst is None or wait > worst[0]:
                    worst = (wait, window, limit)
        if worst is None:
            return None
        wait, window, limit = worst
        # +1 token's worth rounds up past the instant the bucket is back at exactly zero.
        retry = max(1, math.ceil(wait + WINDOWS[window] / limit))
        return LimitExceeded(
            f"token quota spent for this key ({limit} tokens per {window}); retry in {retry} s", retry
        )

    def reserve(self, key: KeyRecord, tokens: int | None) -> int | LimitExceeded:
        """Take ``tokens`` (a request's worst case; None: all that is left) out of the key's
        buckets before it goes upstream, if every bucket is above zero; the tokens taken (0 for a
        key without a quota), or the refusal. Checked again here, not only before the body was
        read: requests admitted meanwhile have reserved since."""
        limits = _limits(key)
        if not limits:
            return 0
        refused = self.check(key)
        if refused is not None:
            return refused
        now = self._clock()
        buckets = [self._bucket(key.id, window, limit, now) for window, limit in limits]
        if tokens is None:
            tokens = max(1, math.floor(min(b.level for b in buckets)))
        for b in buckets:
            b.level -= tokens
        self.dirty = True
        return tokens

    def settle(self, key: KeyRecord, reserved: int, tokens: int) -> None:
        """The request ended: ``tokens`` counted by the engine replace the ``reserved`` ones."""
        if reserved <= 0:
            self.charge(key, tokens)
            return
        now = self._clock()
        for window, limit in _limits(key):
            b = self._bucket(key.id, window, limit, now)
            b.level = min(float(limit), b.level - (tokens - reserved))
            self.dirty = True

    def standing(self, key: KeyRecord) -> tuple[int, int, float] | None:
        """Where the key stands on tokens, for ``x-ratelimit-*``: (limit, remaining, seconds until
        the bucket is full again) of the minute bucket, or of the day bucket without one."""
        limits = _limits(key)
        if not limits:
            return None
        window, limit = limits[0]
        b = self._bucket(key.id, window, limit, self._clock())
        reset = (limit - b.level) / (limit / WINDOWS[window])
        return limit, max(0, math.floor(b.level)), max(0.0, reset)

    def charge(self, key: KeyRecord, tokens: int) -> None:
        """Take ``tokens`` (what the engine counted) out of the key's buckets."""
        if tokens <= 0:
            return
        now = self._clock()
        for window, limit in _limits(key):
            self._bucket(key.id, window, limit, now).level -= tokens
            self.dirty = True

    def level(self, key_id: str, window: str) -> float | None:
        b = self._buckets.get((key_id, window))
        return None if b is None else b.level

    def snapshot(self) -> list[BucketState]:
        self.dirty = False
        return [BucketState(k, w, b.level, b.stamp) for (k, w), b in self._buckets.items()]

    def restore(self, states: Iterable[BucketState]) -> None:
        """Levels saved by an earlier run (refilled on their next use for the time in between)."""
        for s in states:
            if s.window in WINDOWS:
                self._buckets[(s.key_id, s.window)] = Bucket(s.level, s.stamp)
