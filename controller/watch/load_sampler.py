"""Samples the gateway's and the engine's `/metrics` at a fixed interval into a bounded ring, so the
controller can say how busy the appliance is without a Prometheus (`GET /load`, `appliance status`,
the console's Now page). The figures and their arithmetic are `appliance/observe/load_figures.py`.

The gateway's series come from its control listener (the controller's `--gateway-url`, the address
Prometheus scrapes too); the engine's from the ready engine's own `/metrics` (vLLM serves it without
the API key). A source that does not answer leaves its half of the sample empty and says why in
`problems`; the other half is still kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from appliance.observe.load_figures import ENGINE_WANTED, GATEWAY_WANTED, LoadRing, Sample
from appliance.observe.load_scrape import Scrape, parse

log = logging.getLogger("appliance.load")

INTERVAL_S = 5.0  # 180 samples in the ring's 15 minutes
FETCH_TIMEOUT_S = 3.0  # below the interval: a slow source never stacks scrapes up

Fetch = Callable[[str], Awaitable[str]]


@dataclass(frozen=True)
class EngineTarget:
    """The engine to scrape: the ready launch (its id names the counters' source) and its URL."""

    launch_id: str
    base_url: str


class LoadSampler:
    def __init__(self, gateway_url: str | None, engine: Callable[[], EngineTarget | None], *,
                 fetch: Fetch | None = None, clock: Callable[[], float] = time.time,
                 interval_s: float = INTERVAL_S) -> None:
        self.gateway_url = gateway_url.rstrip("/") if gateway_url else None
        self.engine = engine
        self.clock = clock
        self.interval_s = interval_s
        self.ring = LoadRing()
        self.problems: dict[str, str | None] = {"gateway": None, "engine": None}
        self._fetch = fetch
        self._session: aiohttp.ClientSession | None = None

    async def _get(self, url: str) -> str:
        if self._fetch is not None:
            return await self._fetch(url)
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=FETCH_TIMEOUT_S))
        async with self._session.get(url) as r:
            if r.status != 200:
                raise OSError(f"HTTP {r.status}")
            return await r.text()

    async def _scrape(self, which: str, url: str, source: str, wanted: tuple[str, ...]) -> Scrape | None:
        try:
            text = await self._get(url + "/metrics")
            scrape = parse(text, source, self.clock(), wanted)
        except (OSError, TimeoutError, aiohttp.ClientError, ValueError) as exc:
            self.problems[which] = f"{url}/metrics: {exc or type(exc).__name__}"
            return None
        self.problems[which] = None
        return scrape

    async def sample_once(self) -> Sample:
        target = self.engine()
        gateway = (await self._scrape("gateway", self.gateway_url, self.gateway_url, GATEWAY_WANTED)
                   if self.gateway_url else None)
        engine = (await self._scrape("engine", target.base_url.rstrip("/"), target.launch_id, ENGINE_WANTED)
                  if target is not None else None)
        if target is None:
            self.problems["engine"] = None  # no ready engine: nothing to scrape, nothing wrong
        sample = Sample(self.clock(), gateway, engine)
        self.ring.add(sample)
        return sample

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                await self.sample_once()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.interval_s)
        finally:
            if self._session is not None:
                await self._session.close()
                self._session = None

    def report(self) -> dict[str, Any]:
        """The ring's report (`LoadRing.report`) with the interval and why a source is missing."""
        return {**self.ring.report(), "interval_s": self.interval_s, "problems": dict(self.problems),
                "gateway_attached": self.gateway_url is not None}
