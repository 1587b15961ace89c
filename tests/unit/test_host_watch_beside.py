"""The host watch follows the engines started beside the primary (engine_set.py): a kernel OOM kill
of one is attributed to its own launch (its exit diagnosis names the OOM killer), the primary's
attribution is unchanged, and every launch's record gets the host's memory marks over its own run."""

from __future__ import annotations

import shutil
from pathlib import Path

from appliance.observe.kmsg import OomEvent, OomEventKind, OomScope
from controller.runtime.base import EngineHandle
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
from tests.unit.test_oom_attribution import REAL_ID, kill_of
from tests.unit.test_supervisor_watch_link import GIB, TP4_HOST, _rig

BESIDE_ROOT = 4242  # the victim pid of global_rate_limited_kill_only.txt


class DockerRuntime(FakeRuntime):
    """A fake engine runtime whose engines run in a container (ContainerScoped)."""

    def __init__(self, clock: FakeClock, container: str) -> None:
        super().__init__(clock)
        self.container = container

    def container_id(self, handle: EngineHandle) -> str | None:
        return self.container


def _host_with_beside_engine(tmp_path: Path) -> Path:
    """The TP=4 fixture host plus one more engine process, pid 4242 (a copy of its EngineCore, a
    child of init), standing for an engine started beside the primary."""
    proc = tmp_path / "proc"
    shutil.copytree(TP4_HOST, proc)
    beside = proc / str(BESIDE_ROOT)
    shutil.copytree(proc / "1001", beside)
    stat = (beside / "stat").read_text()
    head = f"{BESIDE_ROOT} (VLLM::EngineCor) S 1 {BESIDE_ROOT} {BESIDE_ROOT}"
    (beside / "stat").write_text(stat.replace("1001 (VLLM::EngineCor) S 1000 1001 1001", head))
    return proc


async def _beside_rig(tmp_path: Path, runtime: FakeRuntime) -> tuple[Driver, HostWatchLink, Store]:
    """The primary (launch L1, engine tree at pid 1000) and one engine beside it (launch L2)."""
    _primary, link, store, _ = await _rig(tmp_path)
    link.sampler = HostSampler(ProcReader(_host_with_beside_engine(tmp_path)))
    preflight = FakePreflight(make_spec())
    preflight.calls = 1  # its launch is L2
    beside = Driver(runtimes={"process": runtime}, store=store, preflight=preflight,
                    prober=FakeProber(runtime), gateway=RecordingGateway(), clock=runtime.clock,
                    config=DriverConfig(oom_settle_s=0), oom_events=link.oom_events, engine_name="beside")
    beside.submit(Apply("test-recipe"))
    await beside.step()
    await beside.settle()
    runtime.engine_pids = lambda handle: [BESIDE_ROOT]  # type: ignore[method-assign]
    link.beside = lambda: [engine_view(beside)]
    await link._sample_once()
    return beside, link, store


async def test_an_oom_kill_of_an_engine_beside_the_primary_is_its_launchs(tmp_path: Path) -> None:
    beside, link, store = await _beside_rig(tmp_path, FakeRuntime(FakeClock()))
    kill = kill_of("global_rate_limited_kill_only.txt")
    assert kill.pid == BESIDE_ROOT
    link.on_oom(kill)
    assert link.oom_events("L2") == [kill]
    assert link.oom_events("L1") == []
    rec = store.get_launch("L2")
    assert rec is not None and len(rec.oom) == 1 and rec.oom[0]["matched_by"] == "pid"
    primary = store.get_launch("L1")
    assert primary is not None and primary.oom == []

    # The primary's attribution is unchanged beside it: its worker's kill is L1's alone.
    worker = OomEvent(kind=OomEventKind.KILL, scope=OomScope.GLOBAL, constraint="CONSTRAINT_NONE", pid=1003,
                      task="VLLM::Worker_TP", anon_rss_bytes=int(6.76 * GIB))
    link.on_oom(worker)
    assert link.oom_events("L1") == [worker]
    assert link.oom_events("L2") == [kill]

    # The engine beside dies of it: its own driver's exit diagnosis is the OOM kill, not a SIGKILL.
    runtime = beside.runtimes["process"]
    assert isinstance(runtime, FakeRuntime)
    runtime.current().die(signal=9)
    await beside.step()
    await beside.settle()
    rec = store.get_launch("L2")
    assert rec is not None and rec.diagnosis is not None
    assert rec.diagnosis["code"] != "killed_by_signal" and "oom" in rec.diagnosis["code"]


async def test_a_container_oom_of_an_engine_beside_is_matched_by_its_container(tmp_path: Path) -> None:
    # The real capture: a docker container at its memory limit (cgroup v1, kernel 6.18).
    beside, link, store = await _beside_rig(tmp_path, DockerRuntime(FakeClock(), REAL_ID))
    kill = kill_of("memcg_v1_kernel_6.18_docker.txt")
    link.on_oom(kill)
    assert link.oom_events("L2") == [kill] and link.oom_events("L1") == []
    rec = store.get_launch("L2")
    assert rec is not None and rec.oom[0]["matched_by"] == "container_id"
    runtime = beside.runtimes["process"]
    assert isinstance(runtime, FakeRuntime)
    runtime.current().die(signal=9)
    await beside.step()
    await beside.settle()
    rec = store.get_launch("L2")
    assert rec is not None and rec.diagnosis is not None and rec.diagnosis["code"] == "cgroup_oom"


async def test_every_launch_running_gets_the_hosts_marks_and_its_own_process_peaks(tmp_path: Path) -> None:
    _beside, link, store = await _beside_rig(tmp_path, FakeRuntime(FakeClock()))
    for launch_id in ("L1", "L2"):
        rec = store.get_launch(launch_id)
        assert rec is not None and rec.mem_available_min_bytes is not None, launch_id
        # DOMAIN §3, recipe C's bar (the fixture host's numbers): host-wide, so on both records.
        assert abs(rec.mem_available_min_bytes / GIB - 2.35) < 0.01
        assert rec.swap_peak_bytes is not None and abs(rec.swap_peak_bytes / GIB - 5.40) < 0.01
    # RssAnon peaks are each engine's own processes.
    assert set(link.process_peaks("L2")) == {BESIDE_ROOT}
    assert BESIDE_ROOT not in link.process_peaks("L1") and 1001 in link.process_peaks("L1")


async def test_a_launch_beside_that_ends_gets_its_last_marks_and_stays_attributable(tmp_path: Path) -> None:
    _beside, link, store = await _beside_rig(tmp_path, FakeRuntime(FakeClock()))
    link.record_every_s = 3600.0  # the rig's sample wrote; the next ones are not due
    meminfo = tmp_path / "proc" / "meminfo"
    lower = meminfo.read_text().replace("MemAvailable:     2464154 kB", "MemAvailable:     1048576 kB")
    meminfo.write_text(lower)
    await link._sample_once()
    rec = store.get_launch("L2")
    assert rec is not None and rec.mem_available_min_bytes is not None
    assert abs(rec.mem_available_min_bytes / GIB - 2.35) < 0.01  # 1 GiB seen, not written yet
    link.beside = lambda: []  # the engine beside has gone (stopped, or removed from the set)
    await link._sample_once()
    rec = store.get_launch("L2")
    assert rec is not None and rec.mem_available_min_bytes == GIB  # its run's last marks, written as it left
    # A kill record that comes just after still finds it (the victim's pids were read before).
    kill = kill_of("global_rate_limited_kill_only.txt")
    link.on_oom(kill)
    assert link.oom_events("L2") == [kill]
