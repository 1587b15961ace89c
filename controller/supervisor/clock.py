"""The driver's time seam: the real clock in production, a fake one in the unit tests (a 40-minute
start runs in milliseconds)."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """Wall-clock seconds: launch records and adopted engines' start times are wall clock too."""

    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
