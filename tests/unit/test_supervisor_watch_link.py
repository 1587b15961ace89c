"""The host watch tied to the launch: low-water marks into the record, OOM kills attributed to it."""

from __future__ import annotations

from pathlib import Path

from appliance.observe.kmsg import OomEvent, OomEventKind, OomScope
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

TP4_HOST = Path(__file__).resolve().parents[1] / "fixtures" / "procfs" / "tp4_graph_host" / "proc"
GIB = 1024**3


async def _rig(tmp_path: Path) -> tuple[Driver, HostWatchLink, Store, FakeRuntime]:
    clock = FakeClock()
    runtime = FakeRuntime(clock)
    store = Store(tmp_path / "a.sqlite3")
    link = HostWatchLink(store, HostSampler(ProcReader(TP4_HOST)), record_every_s=0.0)
    driver = Driver(runtimes={"process": runtime}, store=store, preflight=FakePreflight(make_spec()),
                    prober=FakeProber(runtime), gateway=RecordingGateway(), clock=clock,
                    config=DriverConfig(oom_settle_s=0), oom_events=link.oom_events)
    link.engine = engine_view(driver)
    driver.submit(Apply("test-recipe"))
    await driver.step()
    await driver.settle()
    # The fixture host's engine tree starts at pid 1000 (API server → EngineCore → 4 workers).
    runtime.engine_pids = lambda handle: [1000]  # type: ignore[method-assign]
    return driver, link, store, runtime


async def test_low_water_marks_reach_the_launch_record(tmp_path: Path) -> None:
    _, link, store, _ = await _rig(tmp_path)
    current = link._current()
    assert current is not None and current[2] == [1000]
    link.on_sample(link.sampler.sample(current[2]), current)
    rec = store.get_launch("L1")
    assert rec is not None and rec.mem_available_min_bytes is not None
    # DOMAIN §3, recipe C's bar: min MemAvailable 2.35 GiB, swap peak 5.40 GiB (the fixture's numbers).
    assert abs(rec.mem_available_min_bytes / GIB - 2.35) < 0.01
    assert rec.swap_peak_bytes is not None and abs(rec.swap_peak_bytes / GIB - 5.40) < 0.01


async def test_an_oom_kill_of_an_engine_worker_is_attributed_and_diagnosed(tmp_path: Path) -> None:
    driver, link, store, runtime = await _rig(tmp_path)
    current = link._current()
    link.on_sample(link.sampler.sample([1000]), current)
    kill = OomEvent(kind=OomEventKind.KILL, scope=OomScope.GLOBAL, constraint="CONSTRAINT_NONE", pid=1003,
                    task="VLLM::Worker_TP", anon_rss_bytes=int(6.76 * GIB))
    link.on_oom(kill)
    stranger = OomEvent(kind=OomEventKind.KILL, scope=OomScope.CGROUP, pid=424242, task="tail")
    link.on_oom(stranger)
    assert link.oom_events("L1") == [kill]
    rec = store.get_launch("L1")
    assert rec is not None and len(rec.oom) == 1 and rec.oom[0]["matched_by"] == "pid"
    messages = [e.message for e in store.events() if e.kind == "oom-kill"]
    assert any("matched by pid" in m for m in messages)
    assert any("not one of our engines" in m for m in messages)
    # The engine dies of it: the exit diagnosis is the global OOM, not "killed by SIGKILL".
    runtime.current().die(signal=9)
    await driver.step()
    await driver.settle()
    rec = store.get_launch("L1")
    assert rec is not None and rec.diagnosis is not None and rec.diagnosis["code"] == "global_oom"
