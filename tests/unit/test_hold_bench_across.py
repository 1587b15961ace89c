"""bench.hold_bench.across: the switch waits for answers before it, the load for an answer after it.

On a slow CI machine every first answer took longer than the fixed 5 s warm-up, so all 12 requests
overlapped the restart and the row had no request outside the switch to compare with. The waits are
events now; these tests drive `across` with a load whose answers take longer than the warm-up.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench.hold_bench import Load, Req, across


class SlowLoad(Load):
    """Answers take `answer_s` (longer than the warm-up); no HTTP."""

    answer_s = 0.3

    async def _one(self, session: Any, stream: bool) -> Req:
        t0 = time.monotonic()
        await asyncio.sleep(self.answer_s)
        return Req(t0, time.monotonic(), stream, 200, True)


def _run(load: Load, switch_s: float, **kw: float) -> tuple[float, float]:
    async def switch() -> float | None:
        await asyncio.sleep(switch_s)
        return None

    t0, t1, _ = asyncio.run(across(load, switch, **kw))
    return t0, t1


def test_the_switch_starts_only_after_every_client_had_an_answer() -> None:
    load = SlowLoad("http://unused", "k", clients=3, pause_s=0.0)
    t0, _ = _run(load, 0.05, warmup_s=0.01, settle_s=0.01)
    assert sum(1 for r in load.requests if r.t1 <= t0) >= 3


def test_the_load_stops_only_after_a_request_begun_after_the_switch_ended() -> None:
    load = SlowLoad("http://unused", "k", clients=2, pause_s=0.0)
    _, t1 = _run(load, 0.05, warmup_s=0.01, settle_s=0.01)
    assert any(r.t0 >= t1 for r in load.requests)


def test_a_wait_is_bounded_when_the_event_never_comes() -> None:
    load = SlowLoad("http://unused", "k", clients=1, pause_s=0.0)
    load.answer_s = 3600.0  # no answer ever comes within the test

    async def go() -> tuple[float, float]:
        async def switch() -> float | None:
            return None

        task = asyncio.create_task(across(load, switch, warmup_s=0.0, settle_s=0.0, wait_most_s=0.2))
        # the load never ends on its own (its one request sleeps an hour): cancel it once both waits
        # have run out, which they must do after about 0.2 s each
        while not load.stop.is_set():
            await asyncio.sleep(0.05)
        task.cancel()
        return 0.0, 0.0

    asyncio.run(go())
    assert load.stop.is_set()  # reached only if both waits gave up (an unbounded one hangs: timeout)
