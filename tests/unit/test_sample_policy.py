"""The host sampler's read policy (the idle footprint): cheap sources every sample, the engine's process
tree and smaps_rollup only when they can change an answer. Fake clock, fake /proc tree."""

from __future__ import annotations

import re
import shutil
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import pytest

from controller.watch.procreader import ProcReader
from controller.watch.sample_policy import (
    ALWAYS,
    MIB,
    FullReason,
    ProcessSampleSchedule,
    SamplingPolicy,
)
from controller.watch.sampler import HostSampler, Watermarks

TP4_HOST = Path(__file__).resolve().parents[1] / "fixtures" / "procfs" / "tp4_graph_host" / "proc"
GIB = 1024**3
ENGINE = 6  # the fixture's engine tree under pid 1000: API server, EngineCore, 4 workers


# --- the pure schedule -------------------------------------------------------------------------------


def test_no_engine_reads_no_processes() -> None:
    assert ProcessSampleSchedule().due(0.0, 8 * GIB, None, starting=False) is None


def test_first_sample_and_every_new_launch_read_the_processes() -> None:
    s = ProcessSampleSchedule()
    assert s.due(0.0, 8 * GIB, "L1", starting=False) is FullReason.NEW_LAUNCH
    s.done(0.0, 8 * GIB, "L1")
    assert s.due(1.0, 8 * GIB, "L1", starting=False) is None
    assert s.due(1.0, 8 * GIB, "L2", starting=False) is FullReason.NEW_LAUNCH


def test_every_sample_reads_while_the_engine_starts() -> None:
    """DOMAIN §3: the peak is the warm-up after KV allocation; per-worker RssAnon every second."""
    s = ProcessSampleSchedule()
    s.done(0.0, 8 * GIB, "L1")
    for t in range(1, 5):
        assert s.due(float(t), 8 * GIB, "L1", starting=True) is FullReason.STARTING
        s.done(float(t), 8 * GIB, "L1")


def test_ready_engine_reads_at_the_slow_cadence() -> None:
    s = ProcessSampleSchedule(SamplingPolicy(full_every_s=30.0))
    s.done(0.0, 8 * GIB, "L1")
    assert [t for t in range(1, 61) if s.due(float(t), 8 * GIB, "L1", starting=False)] == list(range(30, 61))
    s.done(30.0, 8 * GIB, "L1")
    assert s.due(59.0, 8 * GIB, "L1", starting=False) is None
    assert s.due(60.0, 8 * GIB, "L1", starting=False) is FullReason.CADENCE


@pytest.mark.parametrize("delta", [-256 * MIB, 256 * MIB, -3 * GIB])
def test_mem_available_moving_reads_at_once(delta: int) -> None:
    s = ProcessSampleSchedule(SamplingPolicy(mem_move_bytes=256 * MIB))
    s.done(0.0, 8 * GIB, "L1")
    assert s.due(1.0, 8 * GIB + delta, "L1", starting=False) is FullReason.MEM_MOVED


def test_mem_available_jitter_does_not_read() -> None:
    s = ProcessSampleSchedule(SamplingPolicy(mem_move_bytes=256 * MIB))
    s.done(0.0, 8 * GIB, "L1")
    assert s.due(1.0, 8 * GIB - 255 * MIB, "L1", starting=False) is None


def test_always_is_the_old_policy() -> None:
    s = ProcessSampleSchedule(ALWAYS)
    s.done(0.0, 8 * GIB, "L1")
    assert s.due(0.5, 8 * GIB, "L1", starting=False) is FullReason.ALWAYS
    assert s.due(0.5, 8 * GIB, None, starting=False) is FullReason.ALWAYS


# --- the sampler over a fake /proc tree ---------------------------------------------------------------


class CountingReader(ProcReader):
    """The real reader over a copied fixture tree, counting which /proc files it reads."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.reads: Counter[str] = Counter()

    def _text(self, *parts: str) -> str:
        self.reads[parts[-1] if not parts[0].isdigit() else f"<pid>/{parts[-1]}"] += 1
        return super()._text(*parts)

    def set_mem_available(self, value: int) -> None:
        path = self.root / "meminfo"
        text = re.sub(r"^MemAvailable:\s+\d+ kB$", f"MemAvailable: {value // 1024} kB", path.read_text(),
                      flags=re.M)
        path.write_text(text)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def host(tmp_path: Path) -> tuple[CountingReader, Clock]:
    shutil.copytree(TP4_HOST, tmp_path / "proc")
    return CountingReader(tmp_path / "proc"), Clock()


def run(sampler: HostSampler, clock: Clock, seconds: int, *, starting: bool, launch: str = "L1",
        roots: list[int] | None = None) -> list[FullReason | None]:
    reasons = []
    for _ in range(seconds):
        sample = sampler.sample(roots if roots is not None else [1000], launch=launch, starting=starting)
        reasons.append(sample.full_reason)
        clock.t += 1.0
    return reasons


def test_idle_ready_engine_reads_smaps_rollup_at_the_cadence_only(host: tuple[CountingReader, Clock]) -> None:
    reader, clock = host
    sampler = HostSampler(reader, clock=clock, policy=SamplingPolicy(full_every_s=30.0))
    reasons = run(sampler, clock, 60, starting=False)
    assert reasons.count(None) == 58
    assert [r for r in reasons if r] == [FullReason.NEW_LAUNCH, FullReason.CADENCE]
    # Cheap sources every second; the expensive ones twice in a minute.
    assert reader.reads["meminfo"] == 60 and reader.reads["memory"] == 60  # PSI
    assert reader.reads["<pid>/smaps_rollup"] == 2 * ENGINE


def test_old_policy_reads_everything_every_second(host: tuple[CountingReader, Clock]) -> None:
    reader, clock = host
    run(HostSampler(reader, clock=clock), clock, 60, starting=False)
    assert reader.reads["<pid>/smaps_rollup"] == 60 * ENGINE


def test_between_reads_a_sample_carries_the_last_processes_and_says_when(
        host: tuple[CountingReader, Clock]) -> None:
    reader, clock = host
    sampler = HostSampler(reader, clock=clock, policy=SamplingPolicy())
    first = sampler.sample([1000], launch="L1", starting=False)
    clock.t = 5.0
    later = sampler.sample([1000], launch="L1", starting=False)
    assert later.full_reason is None
    assert later.processes == first.processes and len(later.processes) == ENGINE
    assert later.processes_at == 0.0 and later.at == 5.0
    # Peaks fold the carried figures without double counting anything.
    marks = Watermarks("L1")
    marks.update(first)
    marks.update(later)
    assert marks.engine_anon_peak_bytes == first.engine_anon_bytes


def test_mem_available_is_as_fresh_as_before_and_a_drop_reads_the_processes_at_once(
        host: tuple[CountingReader, Clock]) -> None:
    """Same MemAvailable responsiveness: every sample reads meminfo; a 1 GiB drop also re-reads whose
    memory it is in that very sample."""
    reader, clock = host
    sampler = HostSampler(reader, clock=clock, policy=SamplingPolicy())
    marks = Watermarks("L1")
    for _ in range(5):
        marks.update(sampler.sample([1000], launch="L1", starting=False))
        clock.t += 1.0
    before = marks.mem_available_min_bytes
    assert before is not None
    reader.set_mem_available(before - GIB)
    dropped = sampler.sample([1000], launch="L1", starting=False)
    marks.update(dropped)
    assert dropped.full_reason is FullReason.MEM_MOVED
    assert dropped.processes_at == dropped.at
    assert marks.mem_available_min_bytes == before - GIB


def test_starting_engine_reads_every_second(host: tuple[CountingReader, Clock]) -> None:
    reader, clock = host
    sampler = HostSampler(reader, clock=clock, policy=SamplingPolicy())
    reasons = run(sampler, clock, 10, starting=True)
    assert reasons == [FullReason.NEW_LAUNCH] + [FullReason.STARTING] * 9
    assert reader.reads["<pid>/smaps_rollup"] == 10 * ENGINE


def test_engine_pids_are_looked_up_only_when_the_processes_are_read(
        host: tuple[CountingReader, Clock]) -> None:
    reader, clock = host
    sampler = HostSampler(reader, clock=clock, policy=SamplingPolicy(full_every_s=30.0))
    lookups: list[float] = []

    def roots() -> Iterable[int]:
        lookups.append(clock.t)
        return [1000]

    for _ in range(40):
        sampler.sample(roots, launch="L1", starting=False)
        clock.t += 1.0
    assert lookups == [0.0, 30.0]


def test_a_new_launch_drops_the_previous_launchs_processes(host: tuple[CountingReader, Clock]) -> None:
    reader, clock = host
    sampler = HostSampler(reader, clock=clock, policy=SamplingPolicy())
    assert sampler.sample([1000], launch="L1", starting=False).processes
    gone = sampler.sample([1000], launch=None, starting=False)
    assert gone.processes == () and gone.processes_at is None
