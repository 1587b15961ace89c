"""Who owns what around the driver (issue 32, "the driver drives"): the machine is written by the
driver alone and read through a view; service.build hands the driver every seam at construction."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from controller.service import ServiceConfig, build
from controller.supervisor.machine import State
from controller.supervisor.machine_view import MachineView
from tests.unit.supervisor_helpers import FakeClock, FakeRuntime
from tests.unit.test_supervisor_driver import make_rig

REPO = Path(__file__).resolve().parents[2]


def test_the_machine_cannot_be_replaced_from_outside_the_driver(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    with pytest.raises(AttributeError):
        rig.driver.machine = dataclasses.replace(rig.driver.machine, state=State.READY)  # type: ignore[misc]
    assert isinstance(rig.driver.view, MachineView)
    with pytest.raises(AttributeError):
        rig.driver.view.state = State.READY  # type: ignore[misc]
    assert rig.driver.view.machine is rig.driver.machine


def test_service_build_hands_the_driver_its_seams_at_construction(tmp_path: Path) -> None:
    """The on-ready proof, the per-process peaks and the missing runtimes' reasons were assigned to
    the driver after it was built; now they are constructor arguments, fixed in its `HostSeams`."""
    runtime = FakeRuntime(FakeClock())
    svc = build(ServiceConfig(home=tmp_path, recipes_dir=REPO / "recipes", docker=False),
                runtimes={"process": runtime})
    host = svc.driver.host
    assert host.on_ready is not None
    assert host.process_peaks == svc.watch.process_peaks
    assert dict(host.unavailable_runtimes) == {}
    with pytest.raises(dataclasses.FrozenInstanceError):
        host.on_ready = None  # type: ignore[misc]
    # The on-ready hook notes through the same event stream the driver does.
    assert svc.driver.note == host.events.note
