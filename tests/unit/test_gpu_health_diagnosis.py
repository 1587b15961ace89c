"""An engine death with a GPU event on its card, end to end: kernel records → the GPU health link
(real, fed the replayed H200 recording for its PCI map) → the driver's exit diagnosis, with the fake
runtime at its seam (tests/unit/supervisor_helpers.py), the real store and the real diagnosis."""

from __future__ import annotations

from pathlib import Path

from appliance.diagnosis.diagnose import FailureFacts, diagnose
from appliance.diagnosis.scan import scan_text
from appliance.diagnosis.signatures import DiagnosisCode
from appliance.observe.gpu_events import gpu_events_in_text, parse_gpu_line
from appliance.observe.gpu_health import ReplayQueries
from appliance.observe.kmsg import parse_record
from controller.metrics import ControllerMetrics
from controller.store import Store
from controller.supervisor.driver import Driver, DriverConfig
from controller.supervisor.gpu_health_link import GpuHealthLink, LaunchView
from controller.supervisor.machine import Policy, State
from controller.supervisor.signals import Apply
from controller.watch.gpu_health import HealthReader
from tests.unit.supervisor_helpers import (
    FakeClock,
    FakePreflight,
    FakeProber,
    FakeRuntime,
    RecordingGateway,
    make_spec,
)
from tests.unit.test_gpu_health import h200_recording

# The recorded H200 sits at PCI 0000:00:06 (tests/fixtures/gpu_health/h200-2026-12-01).
XID_79 = "3,1201,9000000,-;NVRM: Xid (PCI:0000:00:06): 79, GPU has fallen off the bus."
XID_31 = ("3,1202,9000001,-;NVRM: Xid (PCI:0000:00:06): 31, pid=4242, name=VLLM::EngineCor, "
          "Ch 00000010, intr 10000000. MMU Fault: ENGINE GRAPHICS GPC0 GPCCLIENT_T1_0 faulted @ 0x7f_0000")


# --- the pure diagnosis ----------------------------------------------------------------------------


def test_a_fatal_xid_on_the_engines_card_is_a_gpu_fault_not_retried() -> None:
    event = parse_gpu_line("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.")
    assert event is not None
    d = diagnose(FailureFacts(exit_code=-6, gpu_events=(event.model_copy(update={"card": 1}),),
                              log_tail=("RuntimeError: CUDA error: unspecified launch failure",)))
    assert d.code is DiagnosisCode.GPU_FAULT and not d.retryable
    assert "GPU 1: Xid 79" in d.summary and "not an engine bug" in d.summary
    assert "drain the node" in d.hint


def test_an_application_xid_is_an_engine_fault_with_its_meaning() -> None:
    event = parse_gpu_line("NVRM: Xid (PCI:0000:3b:00): 13, pid=7, name=python3, Graphics Exception")
    assert event is not None
    d = diagnose(FailureFacts(exit_code=1, gpu_events=(event,)))
    assert d.code is DiagnosisCode.GPU_ENGINE_FAULT and d.retryable
    assert "graphics engine exception" in d.summary and "the card is healthy" in d.summary


def test_an_amdgpu_reset_is_a_gpu_fault_and_a_consequence_alone_explains_nothing() -> None:
    lines = ["amdgpu 0000:43:00.0: ring comp_1.1.0 timeout, signaled seq=7, emitted seq=9",
             "amdgpu 0000:43:00.0: amdgpu:  Process python3 pid 77 thread python3:cs0 pid 78",
             "amdgpu 0000:43:00.0: amdgpu: GPU reset begin!"]
    d = diagnose(FailureFacts(exit_code=1, gpu_events=tuple(gpu_events_in_text(lines))))
    assert d.code is DiagnosisCode.GPU_FAULT and "reset" in d.summary and not d.retryable
    cleanup = parse_gpu_line("NVRM: Xid (PCI:0000:3b:00): 45, pid=7, Ch 00000010")
    assert cleanup is not None
    assert diagnose(FailureFacts(exit_code=1, gpu_events=(cleanup,))).code is DiagnosisCode.EXIT_NONZERO


def test_a_kernel_oom_still_decides_before_a_gpu_event() -> None:
    from appliance.diagnosis.scan import oom_events_in_text

    fixture = Path(__file__).parents[1] / "fixtures" / "kmsg" / "global_oom_5.15_cgroup2_tp4_graph.txt"
    kills = oom_events_in_text(fixture.read_text().splitlines())
    event = parse_gpu_line("NVRM: Xid (PCI:0000:3b:00): 43, pid=7, Ch 00000010")
    assert event is not None
    d = diagnose(FailureFacts(exit_code=137, oom_events=tuple(kills), gpu_events=(event,)))
    assert d.code is DiagnosisCode.GLOBAL_OOM


def test_saved_dmesg_text_finds_the_gpu_rows() -> None:
    text = (Path(__file__).parents[1] / "fixtures" / "gpu_health" / "kmsg" / "nvidia_xid.txt").read_text()
    codes = {f.code for f in scan_text(text)}
    assert {DiagnosisCode.GPU_FAULT, DiagnosisCode.GPU_ENGINE_FAULT} <= codes
    boot = (Path(__file__).parents[1] / "fixtures" / "gpu_health" / "h200-2026-12-01" / "dmesg-boot.txt")
    # A healthy H200's boot log has NVRM lines, none of them a fault.
    assert not {DiagnosisCode.GPU_FAULT, DiagnosisCode.GPU_ENGINE_FAULT} & {
        f.code for f in scan_text(boot.read_text())}
    assert gpu_events_in_text(boot.read_text().splitlines()) == []


# --- end to end through the driver ----------------------------------------------------------------


def _rig(tmp_path: Path) -> tuple[Driver, FakeRuntime, FakeClock, GpuHealthLink, list[tuple[str, str]]]:
    clock = FakeClock()
    runtime = FakeRuntime(clock)
    store = Store(tmp_path / "launches.sqlite3")
    spec = make_spec()
    spec = spec.model_copy(update={"env": {**spec.env, "CUDA_VISIBLE_DEVICES": "0"}})
    metrics = ControllerMetrics()
    link = GpuHealthLink(HealthReader(tmp_path, nvml=ReplayQueries(h200_recording())), metrics=metrics,
                         clock=lambda: clock.t)
    driver = Driver(
        runtimes={"process": runtime}, store=store, preflight=FakePreflight(spec, False),
        prober=FakeProber(runtime), gateway=RecordingGateway(), clock=clock, policy=Policy(),
        config=DriverConfig(poll_interval_s=10, probe_interval_s=10, health_interval_s=10, oom_settle_s=0.5,
                            watch_exits=False),
        gpu_events=link.gpu_events, metrics=metrics,
    )
    notes: list[tuple[str, str]] = []

    def note(kind: str, message: str, launch_id: str | None) -> None:
        notes.append((kind, message))
        driver.note(kind, message, launch_id)

    link.view = LaunchView(launch=lambda: driver.machine.launch, pids=lambda _: frozenset({4242}), note=note)
    link.on_cards(link.reader.sample())
    return driver, runtime, clock, link, notes


async def _die_with(tmp_path: Path, *records: str) -> tuple[Driver, GpuHealthLink, list[tuple[str, str]]]:
    driver, runtime, clock, link, notes = _rig(tmp_path)
    driver.submit(Apply("test-recipe"))
    await driver.step()
    await driver.settle()
    engine = runtime.current()
    engine.log = "INFO Available KV cache memory: 16.99 GiB\n"
    for raw in records:
        rec = parse_record(raw)
        assert rec is not None
        link.on_record(rec)
    engine.die(exit_code=1)
    for _ in range(30):
        if driver.machine.state in (State.FAILED, State.BACKOFF):
            break
        await driver.step()
        await driver.settle()
        clock.t += 1
    return driver, link, notes


async def test_engine_death_with_xid_79_on_its_card_stops_as_a_gpu_fault(tmp_path: Path) -> None:
    driver, link, notes = await _die_with(tmp_path, XID_79)
    rec = driver.store.get_launch("L1")
    assert rec is not None and rec.diagnosis is not None
    assert rec.diagnosis["code"] == "gpu_fault"
    assert "GPU 0: Xid 79" in rec.diagnosis["summary"]
    assert driver.machine.state is State.FAILED  # a fatal hardware fault is not retried blindly
    # On the launch's timeline, and the card is now refused for the next launch.
    assert any(kind == "gpu-event" and "Xid 79" in msg for kind, msg in notes)
    assert any(e.kind == "gpu-event" for e in rec.events)
    link.on_cards(link.reader.sample())
    assert [f.check for f in link.findings(frozenset({0}))] == ["fatal-event"]
    body = driver.metrics.render()[0].decode()
    assert 'appliance_gpu_kernel_events_total{fatal="true",gpu="0",kind="xid",side="hardware",xid="79"} 1.0' \
        in body


async def test_engine_death_with_xid_31_from_its_pid_is_an_engine_fault_and_retried(tmp_path: Path) -> None:
    driver, _, _ = await _die_with(tmp_path, XID_31)
    rec = driver.store.get_launch("L1")
    assert rec is not None and rec.diagnosis is not None
    assert rec.diagnosis["code"] == "gpu_engine_fault" and rec.diagnosis["retryable"]
    assert "GPU memory page fault" in rec.diagnosis["summary"]
    assert driver.machine.state is State.BACKOFF


def test_an_event_on_another_card_is_not_the_launchs(tmp_path: Path) -> None:
    _, _, _, link, _ = _rig(tmp_path)
    rec = parse_record("3,5,1,-;NVRM: Xid (PCI:0000:99:00): 79, GPU has fallen off the bus.")
    assert rec is not None
    link.on_record(rec)
    assert link.gpu_events("L1") == []
