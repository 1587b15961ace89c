"""The controller's event stream: every note goes to the launch store's events table and to the live
subscribers (`GET /events`, the console's stream).

One per controller, shared by everything that notes (the driver, the gateway sync, preflight, the host
and GPU watches, the on-ready proof): per host, not per engine. It exists before the driver does, so
that whatever the driver is built with (service.build) can note from the start.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

from controller.store import Store
from controller.supervisor.clock import Clock


class EventLog:
    def __init__(self, store: Store, clock: Clock) -> None:
        self._store = store
        self._clock = clock
        self._subscribers: set[asyncio.Queue[dict[str, Any]]] = set()

    def note(self, kind: str, message: str, launch_id: str | None = None,
             data: Mapping[str, object] | None = None) -> None:
        record = self._store.add_event(kind, message, self._clock.now(), launch_id, data)
        self.publish({"type": "event", **record.model_dump()})

    def publish(self, event: dict[str, Any]) -> None:
        for queue in list(self._subscribers):
            if queue.full():
                continue  # a stuck client loses events, never blocks the supervisor
            queue.put_nowait(event)

    @contextlib.asynccontextmanager
    async def subscribe(self, maxsize: int = 1000) -> AsyncIterator[asyncio.Queue[dict[str, Any]]]:
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=maxsize)
        self._subscribers.add(queue)
        try:
            yield queue
        finally:
            self._subscribers.discard(queue)
