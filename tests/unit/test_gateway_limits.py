"""Per-key limits with a hand-driven clock."""

from __future__ import annotations

from controller.gateway.keystore import KeyRecord
from controller.gateway.limits import KeyLimiter, Lease, LimitExceeded


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def key(rpm: int | None = None, conc: int | None = None, kid: str = "0123456789ab") -> KeyRecord:
    return KeyRecord(id=kid, name="k", created=0.0, revoked=None, rpm_limit=rpm, max_concurrent=conc)


def test_no_limits_admits_everything() -> None:
    limiter = KeyLimiter(Clock())
    leases = [limiter.try_acquire(key()) for _ in range(1000)]
    assert all(isinstance(x, Lease) for x in leases)
    assert limiter.in_flight("0123456789ab") == 1000


def test_rpm_allows_a_minute_then_refills() -> None:
    clock = Clock()
    limiter = KeyLimiter(clock)
    k = key(rpm=6)
    for _ in range(6):
        lease = limiter.try_acquire(k)
        assert isinstance(lease, Lease)
        lease.release()
    refused = limiter.try_acquire(k)
    assert isinstance(refused, LimitExceeded)
    assert refused.retry_after_s == 10  # 6 per minute: one every 10 s
    assert "6 requests per minute" in refused.reason
    clock.t += 9.0
    assert isinstance(limiter.try_acquire(k), LimitExceeded)
    clock.t += 1.0
    assert isinstance(limiter.try_acquire(k), Lease)


def test_concurrency_counts_in_flight_and_release_is_idempotent() -> None:
    limiter = KeyLimiter(Clock())
    k = key(conc=2)
    a, b = limiter.try_acquire(k), limiter.try_acquire(k)
    assert isinstance(a, Lease) and isinstance(b, Lease)
    third = limiter.try_acquire(k)
    assert isinstance(third, LimitExceeded) and third.retry_after_s >= 1
    a.release()
    a.release()
    assert limiter.in_flight(k.id) == 1
    assert isinstance(limiter.try_acquire(k), Lease)


def test_concurrency_refusal_does_not_spend_rate() -> None:
    limiter = KeyLimiter(Clock())
    k = key(rpm=2, conc=1)
    held = limiter.try_acquire(k)
    assert isinstance(held, Lease)
    for _ in range(5):
        assert isinstance(limiter.try_acquire(k), LimitExceeded)
    held.release()
    assert isinstance(limiter.try_acquire(k), Lease)  # the second token is still there


def test_keys_are_independent() -> None:
    limiter = KeyLimiter(Clock())
    a, b = key(conc=1, kid="aaaaaaaaaaaa"), key(conc=1, kid="bbbbbbbbbbbb")
    assert isinstance(limiter.try_acquire(a), Lease)
    assert isinstance(limiter.try_acquire(b), Lease)
    assert isinstance(limiter.try_acquire(a), LimitExceeded)


def test_an_idle_key_saves_up_at_most_one_minute_of_requests() -> None:
    """The bucket is capped at rpm: a 6 rpm key idle for an hour gets 6 at once, not ~360 (a mutant
    without the cap survived the suite)."""
    clock = Clock()
    limiter = KeyLimiter(clock)
    k = key(rpm=6)
    first = limiter.try_acquire(k)  # the key's state starts here
    assert isinstance(first, Lease)
    first.release()
    clock.t += 3600.0
    admitted = 0
    while isinstance(lease := limiter.try_acquire(k), Lease):
        lease.release()
        admitted += 1
        assert admitted <= 100, "the bucket is not capped"
    assert admitted == 6


# Boundaries the mutation run over this module found unpinned (docs/mutation-testing.md).


def test_a_key_never_seen_has_nothing_in_flight() -> None:
    assert KeyLimiter(Clock()).in_flight("0123456789ab") == 0


def test_a_concurrency_refusal_names_the_limit_and_hints_one_second() -> None:
    limiter = KeyLimiter(Clock())
    k = key(conc=1)
    assert isinstance(limiter.try_acquire(k), Lease)
    refused = limiter.try_acquire(k)
    assert isinstance(refused, LimitExceeded)
    assert refused.reason == "too many concurrent requests for this key (limit 1)"
    assert refused.retry_after_s == 1


def test_retry_after_is_the_wait_for_the_missing_part_of_a_token() -> None:
    clock = Clock()
    limiter = KeyLimiter(clock)
    k = key(rpm=6)  # one token every 10 s
    for _ in range(6):
        lease = limiter.try_acquire(k)
        assert isinstance(lease, Lease)
        lease.release()
    clock.t += 5.0  # half a token back: 5 s to go, not 15
    refused = limiter.try_acquire(k)
    assert isinstance(refused, LimitExceeded) and refused.retry_after_s == 5


def test_retry_after_is_at_least_one_second_and_not_more_than_needed() -> None:
    clock = Clock()
    limiter = KeyLimiter(clock)
    k = key(rpm=60)  # one token a second: an empty bucket waits exactly 1 s
    for _ in range(60):
        lease = limiter.try_acquire(k)
        assert isinstance(lease, Lease)
        lease.release()
    refused = limiter.try_acquire(k)
    assert isinstance(refused, LimitExceeded) and refused.retry_after_s == 1
    clock.t += 0.75  # a quarter of a second left: still a whole second (Retry-After is in whole seconds)
    refused = limiter.try_acquire(k)
    assert isinstance(refused, LimitExceeded) and refused.retry_after_s == 1
