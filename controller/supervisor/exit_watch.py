"""A thread per engine blocked in `Runtime.wait` (pidfd / docker), so a death is known at once, not
at the next poll. A daemon thread: a controller exit is never held up by it (the engine
is adopted next time). It reports back on the event loop and ends when its launch is no longer the
current one."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable

from controller.runtime.base import EngineHandle, EngineRuntimeError, ExitInfo, Runtime

log = logging.getLogger(__name__)


def watch_exit(
    rt: Runtime,
    handle: EngineHandle,
    *,
    loop: asyncio.AbstractEventLoop,
    still_current: Callable[[], bool],
    on_exit: Callable[[str, ExitInfo], None],
    on_done: Callable[[], None],
    recheck_s: float,
) -> threading.Thread:
    """Start the watch. `still_current()` is re-checked every `recheck_s`; `on_exit(launch_id,
    info)` runs on the loop; `on_done()` runs in the thread when the watch ends, however it ends."""

    def watch() -> None:
        try:
            while still_current() and not loop.is_closed():
                info = rt.wait(handle, recheck_s)
                if not info.running:
                    with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                        loop.call_soon_threadsafe(on_exit, handle.launch_id, info)
                    return
        except (EngineRuntimeError, OSError) as exc:
            log.warning("exit watch of %s ended: %s (the poll still sees it)", handle.launch_id, exc)
        finally:
            on_done()

    thread = threading.Thread(target=watch, name=f"exit-watch {handle.launch_id}", daemon=True)
    thread.start()
    return thread
