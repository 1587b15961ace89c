"""A bounded in-process history of host samples, for the operator console's memory charts.

The console must draw MemAvailable, swap and PSI over time without Prometheus (a single appliance
often has no monitoring stack next to it). The host watch already takes one sample a second; this
keeps the few numbers the charts need from each, in a ring buffer (a `deque` with `maxlen`), so
memory stays bounded however long the controller runs: 6 h at 1 Hz is 21,600 points of 7 numbers.

Times are wall clock (`time.time()` when the sample arrived), not the sampler's monotonic clock:
the charts put launch boundaries and OOM kills from the launch store (wall clock) on the same axis.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

from appliance.observe.kmsg import OomEvent, OomEventKind
from controller.watch.sampler import HostSample

DEFAULT_POINTS = 6 * 3600  # 6 h at the watch's 1 Hz


class HostPoint(NamedTuple):
    at: float  # wall clock
    mem_total_bytes: int
    mem_available_bytes: int
    swap_total_bytes: int
    swap_used_bytes: int
    psi_some_avg10: float | None  # /proc/pressure/memory, percent
    psi_full_avg10: float | None


class OomMark(NamedTuple):
    at: float  # wall clock, when the watch read the kill
    scope: str  # global / cgroup / ... (appliance.observe.kmsg.OomScope)
    task: str | None
    pid: int | None


class HostHistory:
    """Thread-safe ring buffer: the sampler appends, console handlers read a copy."""

    def __init__(self, maxlen: int = DEFAULT_POINTS, clock: Callable[[], float] = time.time,
                 max_ooms: int = 256) -> None:
        self._points: deque[HostPoint] = deque(maxlen=maxlen)
        self._ooms: deque[OomMark] = deque(maxlen=max_ooms)
        self._lock = threading.Lock()
        self.clock = clock

    @property
    def maxlen(self) -> int:
        return self._points.maxlen or 0

    def record(self, sample: HostSample) -> None:
        pressure = sample.pressure
        full = pressure.full if pressure is not None else None
        point = HostPoint(
            at=self.clock(),
            mem_total_bytes=sample.meminfo.mem_total_bytes,
            mem_available_bytes=sample.mem_available_bytes,
            swap_total_bytes=sample.swap_total_bytes,
            swap_used_bytes=sample.swap_used_bytes,
            psi_some_avg10=pressure.some.avg10 if pressure is not None else None,
            psi_full_avg10=full.avg10 if full is not None else None,
        )
        with self._lock:
            self._points.append(point)

    def record_oom(self, event: OomEvent) -> None:
        """Every kernel OOM kill, ours or not (an unattributed global OOM still marks the chart)."""
        if event.kind is not OomEventKind.KILL:
            return
        with self._lock:
            self._ooms.append(OomMark(self.clock(), event.scope.value, event.task, event.pid))

    def ooms(self, since: float | None = None) -> list[OomMark]:
        with self._lock:
            return [m for m in self._ooms if since is None or m.at >= since]

    def points(self, since: float | None = None, until: float | None = None) -> list[HostPoint]:
        with self._lock:
            points = list(self._points)
        return [p for p in points if (since is None or p.at >= since) and (until is None or p.at <= until)]

    def __len__(self) -> int:
        with self._lock:
            return len(self._points)


# The controller's one history: fed by the host watch (controller/supervisor/host_memory_watch.py
# `on_sample` and `on_oom`), read by the console. A module-level instance like controller/metrics' registry.
HOST_HISTORY = HostHistory()
