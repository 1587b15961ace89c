"""The controller's sampling loop (HostWatchLink.run_sampler) under its read policy: the
engine's processes are looked up and read every second while it starts, not while it idles ready."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from controller.runtime.base import EngineRuntimeError
from controller.supervisor.host_memory_watch import HostWatchLink
from controller.supervisor.machine import State
from controller.watch.procreader import ProcReader
from controller.watch.sample_policy import FullReason, SamplingPolicy
from controller.watch.sampler import HostSample, HostSampler
from tests.unit.test_supervisor_watch_link import TP4_HOST, _rig


async def _loop(link: HostWatchLink, samples: int) -> list[tuple[HostSample, list[int]]]:
    seen: list[tuple[HostSample, list[int]]] = []
    stop = asyncio.Event()
    on_sample = link.on_sample

    def record(sample: HostSample, current: tuple[str, str, list[int], str | None] | None) -> None:
        on_sample(sample, current)
        seen.append((sample, current[2] if current else []))
        if len(seen) >= samples:
            stop.set()

    link.on_sample = record  # type: ignore[method-assign]
    await link.run_sampler(stop, interval_s=0.0)
    return seen


async def test_starting_engine_is_read_every_sample_ready_one_is_not(tmp_path: Path) -> None:
    driver, link, _, runtime = await _rig(tmp_path)
    link.sampler = HostSampler(ProcReader(TP4_HOST), policy=SamplingPolicy(full_every_s=3600.0))
    lookups: list[int] = []
    runtime.engine_pids = lambda handle: lookups.append(1) or [1000]  # type: ignore[method-assign,func-returns-value]
    assert driver.machine.state is not State.READY

    starting = await _loop(link, 3)
    assert [s.full_reason for s, _ in starting] == [FullReason.NEW_LAUNCH, FullReason.STARTING,
                                                    FullReason.STARTING]
    assert len(lookups) == 3
    assert starting[-1][1] == [1000, 1001, 1002, 1003, 1004, 1005]  # the pids OOM attribution uses

    # The machine is the driver's alone (a read-only view outside): the watch is shown a ready engine.
    assert link.engine is not None
    link.engine = dataclasses.replace(link.engine, state=lambda: State.READY)
    ready = await _loop(link, 5)
    assert [s.full_reason for s, _ in ready] == [None] * 5
    assert len(lookups) == 3  # no process-table scan while it idles ready
    # The last read's pids and figures still stand for OOM attribution and the gauges.
    assert ready[-1][1] == [1000, 1001, 1002, 1003, 1004, 1005]
    assert ready[-1][0].processes_at == starting[-1][0].processes_at


async def test_a_runtime_that_cannot_say_the_pids_does_not_end_the_host_watch(tmp_path: Path) -> None:
    # The Docker runtime asks the daemon for the container's PID; a daemon restarting raised out of
    # the sampling loop and ended the host watch (MemAvailable, swap, PSI: the OOM context) for good.
    _driver, link, _, runtime = await _rig(tmp_path)
    link.sampler = HostSampler(ProcReader(TP4_HOST), policy=SamplingPolicy(full_every_s=3600.0))
    answers = iter([EngineRuntimeError("docker: the daemon did not answer"), OSError("gone"), None])

    def engine_pids(handle: object) -> list[int]:
        exc = next(answers, None)
        if exc is not None:
            raise exc
        return [1000]

    runtime.engine_pids = engine_pids  # type: ignore[method-assign]
    seen = await _loop(link, 3)
    assert [pids for _, pids in seen] == [[], [], [1000, 1001, 1002, 1003, 1004, 1005]]
    assert all(s.mem_available_bytes > 0 for s, _ in seen)  # the host itself was sampled every time

    # Any other failure of one sample is logged, and the next sample still comes.
    calls = {"n": 0}
    real = link._sample_once

    async def failing_once() -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ValueError("a bug")
        await real()

    link._sample_once = failing_once  # type: ignore[method-assign]
    assert len(await _loop(link, 1)) == 1 and calls["n"] == 2
