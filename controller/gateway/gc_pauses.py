"""Garbage collection in the gateway process: no full-heap pauses under load, and the pauses that
remain are counted.

Why: the gateway is latency-bound, and CPython's oldest-generation collection walks every tracked
object. After start-up that is ~90,000 objects (the modules of uvicorn, aiohttp, prometheus_client,
pydantic, sqlite3 …) that never die. Measured on the 2-core development host with the benchmark
(``bench/gateway_bench.py``, 64 concurrent non-streaming requests): gen-2 collections of 22 and 45 ms,
each one stalling every request in flight, which was the whole of the gateway's added p99 (+63 ms
against nginx's +12 ms in the same run).

``settle_heap`` is called once the gateway has started (keys loaded, pools built): one full
collection, then ``gc.freeze()`` moves every surviving object to the permanent generation, which the
collector no longer walks (the technique CPython documents for exactly this:
https://docs.python.org/3/library/gc.html#gc.freeze). Objects made later (connections, key cache
entries, per-request state) are still collected as before; the thresholds are Python's own.

Only the gateway's own process does this (``server.run``): a gateway built inside a test or another
program leaves that program's collector alone.
"""

from __future__ import annotations

import gc
from time import perf_counter
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, Histogram

# From a young-generation sweep (tens of µs) to the full-heap pauses this module exists to avoid.
PAUSE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)


def settle_heap() -> int:
    """Collect once, then freeze what survived; the number of objects frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class PauseMeter:
    """``appliance_gateway_gc_pause_seconds`` (histogram; generation): each collection's duration,
    timed from the collector's own start/stop callbacks (two clock reads per collection); and
    ``appliance_gateway_gc_frozen_objects`` (gauge): what ``settle_heap`` took out of collection."""

    def __init__(self, registry: CollectorRegistry, prefix: str) -> None:
        self.frozen = Gauge(
            f"{prefix}gc_frozen_objects",
            "Objects kept out of garbage collection since start-up (gc.freeze)",
            registry=registry,
        )
        self.frozen.set_function(gc.get_freeze_count)
        self.histogram = Histogram(
            f"{prefix}gc_pause_seconds",
            "Garbage collection pauses of the gateway process, by generation",
            ["generation"],
            buckets=PAUSE_BUCKETS,
            registry=registry,
        )
        self._children = [self.histogram.labels(str(g)) for g in range(3)]
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = perf_counter()
        else:
            self._children[info["generation"]].observe(perf_counter() - self._started)

    def install(self) -> None:
        if self not in gc.callbacks:
            gc.callbacks.append(self)

    def remove(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)
