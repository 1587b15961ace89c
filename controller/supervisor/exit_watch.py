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
from controller.supervisor.launch_run import LaunchRun
from controller.supervisor.machine_view import MachineView

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


def watch_run_exit(rt: Runtime, handle: EngineHandle, run: LaunchRun, view: MachineView, *,
                   on_exit: Callable[[str, ExitInfo], None], recheck_s: float) -> None:
    """One watch per launch (`run.watched`), for as long as the launch is the machine's current one or
    the old one of a blue/green switch."""
    if run.watched:
        return
    run.watched = True

    def current() -> bool:
        m = view.machine
        return any(la is not None and la.launch_id == handle.launch_id for la in (m.launch, m.old))

    def done() -> None:
        run.watched = False

    watch_exit(rt, handle, loop=asyncio.get_running_loop(), still_current=current, on_exit=on_exit,
               on_done=done, recheck_s=recheck_s)
