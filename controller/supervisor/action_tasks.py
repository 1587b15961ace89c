"""The driver's slow work in flight: each action that waits (runtime calls, probes, preflight, gateway
calls) runs as a task that answers with an observation. Per engine: its driver's tasks, cancelled at
controller exit (the engine keeps running, to be adopted next time)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from controller.supervisor.events import EventLog

# The driver's logger: a failed action is the supervisor's, where operators already filter for it.
log = logging.getLogger("controller.supervisor.driver")


class ActionTasks:
    def __init__(self, events: EventLog) -> None:
        self._events = events
        self._tasks: set[asyncio.Task[None]] = set()

    def spawn(self, coro: Coroutine[Any, Any, None], what: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=what)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            # A bug in an action must be seen, not swallowed: logged with its traceback and put in
            # the event stream. The machine stays consistent (the answer just never comes).
            log.error("supervisor task %s failed", task.get_name(), exc_info=exc)
            self._events.note("internal-error", f"{task.get_name()}: {exc!r}")

    async def settle(self) -> None:
        """Wait for every action task (tests; shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def shutdown(self) -> None:
        """Controller exit: cancel the tasks."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
