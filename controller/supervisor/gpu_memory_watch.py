"""The GPU watch tied to the launch it is watching.

Every few seconds: one sample per card (controller/watch/gpu.py) → Prometheus; while an engine is
starting or running, the samples are folded into that launch's peaks by the supervisor's current
phase (appliance/observe/gpu_mem.PhasePeaks: graph capture is where GPU memory jumps) → the launch record.
A host with no readable GPU runs this loop with empty samples and records nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from appliance.observe.gpu_mem import GpuSample, PhasePeaks
from controller.metrics import ControllerMetrics
from controller.store import Store
from controller.supervisor.machine import Launch
from controller.watch.gpu import GpuReader


class GpuWatchLink:
    def __init__(self, store: Store, reader: GpuReader | None = None, record_every_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic,
                 metrics: ControllerMetrics | None = None) -> None:
        self.store = store
        self.metrics = metrics if metrics is not None else ControllerMetrics()
        self.reader = reader or GpuReader()
        self.record_every_s = record_every_s
        self.clock = clock
        # The launch the supervisor is running (wired to the driver by controller/service.py).
        self.current_launch: Callable[[], Launch | None] = lambda: None
        self._launch_id: str | None = None
        self._peaks = PhasePeaks()
        self._dirty = False
        self._last_record = 0.0

    def on_samples(self, samples: list[GpuSample]) -> None:
        self.metrics.observe_gpus(samples)
        launch = self.current_launch()
        launch_id = launch.launch_id if launch else None
        if launch_id != self._launch_id:
            self._flush()
            self._launch_id, self._peaks = launch_id, PhasePeaks()
        if launch is None or not samples:
            return
        self._dirty |= self._peaks.update(launch.phase, samples)
        if self.clock() - self._last_record >= self.record_every_s:
            self._flush()

    def _flush(self) -> None:
        if self._launch_id is None or not self._dirty:
            return
        self._last_record = self.clock()
        self._dirty = False
        self.store.set_gpu_peaks(self._launch_id, self._peaks.record())

    async def run(self, stop: asyncio.Event, interval_s: float = 2.0) -> None:
        while not stop.is_set():
            samples = await asyncio.to_thread(self.reader.sample)
            self.on_samples(samples)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=interval_s)
        self._flush()
