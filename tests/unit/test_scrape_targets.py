"""Prometheus follows the engine (controller/supervisor/scrape_targets.py): the file_sd target list the
driver writes — empty without an engine, the ready engine with its recipe/launch/model labels, both
engines while a blue/green switch drains the old one, the new one alone after it, replaced atomically."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest

from controller.runtime.base import EngineHandle, Provenance
from controller.supervisor import scrape_targets
from controller.supervisor.machine import Machine, State, transition
from controller.supervisor.scrape_targets import ScrapeTargets, engine_targets, write_atomically
from controller.supervisor.signals import Apply, Launched, PreflightOk, ReadyProbed, Stop
from tests.unit.supervisor_helpers import FakeEngine, make_handle, make_spec
from tests.unit.test_supervisor_blue_green import _fits
from tests.unit.test_supervisor_driver import make_rig


def _read(path: Path) -> Any:
    return json.loads(path.read_text())


def _target(port: int, launch: str, recipe: str = "test-recipe") -> dict[str, Any]:
    return {"targets": [f"127.0.0.1:{port}"],
            "labels": {"recipe": recipe, "launch": launch, "model": "smollm2"}}


def test_no_engine_is_an_empty_list_and_a_starting_engine_is_not_listed() -> None:
    assert engine_targets(Machine()) == []
    m, _ = transition(Machine(), Apply("a"), 0)
    m, _ = transition(m, PreflightOk(m.token, "L1", make_spec(recipe="a"), False, False), 1)
    m, _ = transition(m, Launched("L1", make_handle("L1", recipe="a", started_at=1)), 1)
    assert m.state is State.STARTING and engine_targets(m) == []  # its /metrics does not answer yet
    m, _ = transition(m, ReadyProbed("L1"), 50)
    assert engine_targets(m) == [_target(18000, "L1", "a")]
    m, _ = transition(m, Stop(), 60)
    # Stopping: still running, still scraped; gone once stopped (the driver test below).
    assert m.state in (State.DRAINING, State.STOPPING) and engine_targets(m) == [_target(18000, "L1", "a")]


def test_the_file_is_replaced_whole_readable_by_prometheus_and_no_temporary_file_is_left(
    tmp_path: Path,
) -> None:
    path = tmp_path / "prometheus" / "engines.json"  # the directory is made on first write
    write_atomically(path, [_target(18000, "L1")])
    assert _read(path) == [_target(18000, "L1")]
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # Prometheus runs as its own user
    write_atomically(path, [])
    assert _read(path) == []
    assert [p.name for p in path.parent.iterdir()] == ["engines.json"]


def test_a_failed_write_keeps_the_old_file_whole_says_so_once_and_retries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "engines.json"
    writer = ScrapeTargets(path)
    writer.publish(Machine())
    assert _read(path) == []
    m, _ = transition(Machine(), Apply("a"), 0)
    m, _ = transition(m, PreflightOk(m.token, "L1", make_spec(recipe="a"), False, False), 1)
    m, _ = transition(m, Launched("L1", make_handle("L1", recipe="a", started_at=1)), 1)
    m, _ = transition(m, ReadyProbed("L1"), 50)

    def full_disk(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("controller.supervisor.scrape_targets.os.replace", full_disk)
    writer.publish(m)  # never raises into the driver
    writer.publish(m)
    assert _read(path) == []  # the last good list, whole
    assert [p.name for p in tmp_path.iterdir()] == ["engines.json"]
    assert len([r for r in caplog.records if "cannot write the Prometheus engine targets" in r.message]) == 1
    monkeypatch.undo()
    writer.publish(m)
    assert _read(path) == [_target(18000, "L1", "a")]


async def test_the_driver_writes_the_targets_through_a_blue_green_switch_and_a_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "home" / "prometheus" / "engines.json"
    writes: list[list[dict[str, Any]]] = []  # every list written, in order (a switch can pass in one step)
    real_write = scrape_targets.write_atomically

    def spy(to: Path, groups: list[dict[str, Any]]) -> None:
        writes.append(groups)
        real_write(to, groups)

    monkeypatch.setattr(scrape_targets, "write_atomically", spy)
    rig = make_rig(tmp_path, beside=_fits(18001), scrape_targets=path)
    assert _read(path) == []  # written at start: Prometheus drops whatever an older controller left
    rig.runtime.on_start = lambda e: setattr(e, "healthy", True)
    rig.driver.submit(Apply("test-recipe"))
    await rig.run_until(lambda: rig.driver.machine.state is State.READY, 120)
    assert _read(path) == [_target(18000, "L1")]
    assert rig.driver.submit(Apply("test-recipe", force=True)) is None
    await rig.run_until(lambda: rig.driver.machine.state is State.READY and rig.driver.machine.old is None,
                        300)
    assert _read(path) == [_target(18001, "L2")]
    rig.driver.submit(Stop())
    await rig.run_until(lambda: rig.driver.machine.state is State.IDLE, 120)
    assert _read(path) == []
    assert writes == [
        [],
        [_target(18000, "L1")],
        [_target(18000, "L1"), _target(18001, "L2")],  # the new one is ready; the old one drains
        [_target(18001, "L2")],
        [],
    ]
    await rig.driver.shutdown()


async def test_an_adopted_engine_is_listed_once_it_answers(tmp_path: Path) -> None:
    path = tmp_path / "engines.json"
    rig = make_rig(tmp_path, scrape_targets=path)
    spec = make_spec()
    handle = EngineHandle(launch_id="Ladopted", runtime="process", ref="778", recipe="test-recipe",
                          spec_hash=spec.spec_hash, started_at=rig.clock.t - 600)
    rig.runtime.engines["Ladopted"] = FakeEngine(handle, log="INFO Application startup complete.\n",
                                                 healthy=True)
    rig.store.create_launch("Ladopted", spec, "normal", Provenance(), rig.clock.t - 600)
    rig.store.set_handle("Ladopted", handle, rig.clock.t - 600)
    await rig.driver.adopt()
    assert _read(path) == []
    await rig.step()
    assert rig.driver.machine.state is State.READY
    assert _read(path) == [_target(18000, "Ladopted")]
