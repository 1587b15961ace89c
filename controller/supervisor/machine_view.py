"""The supervisor's machine as everyone but the driver sees it: read-only.

The driver is the only writer of its engine's `Machine` (one transition at a time, `Driver.submit`);
it keeps it in a `MachineCell` and hands out a `MachineView` of that cell. The API, the console, the
host and GPU watches, the gateway sync, the hold keeper and the launch recorder read the state through
the view and cannot replace it (a test that once assigned `driver.machine` from outside now cannot).
`Machine` is frozen, so a snapshot taken from `machine` stays consistent while the caller reads it.
One cell and one view per supervised engine: a host that supervises several engines gets several.
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.supervisor.machine import Launch, Machine, State


@dataclass
class MachineCell:
    """The current machine of one engine; only its driver assigns `machine`."""

    machine: Machine


class MachineView:
    """Reads of one engine's current machine (never writes)."""

    def __init__(self, cell: MachineCell) -> None:
        self._cell = cell

    @property
    def machine(self) -> Machine:
        """The current machine, a frozen snapshot."""
        return self._cell.machine

    @property
    def state(self) -> State:
        return self._cell.machine.state

    @property
    def launch(self) -> Launch | None:
        return self._cell.machine.launch

    @property
    def recipe(self) -> str | None:
        return self._cell.machine.recipe

    def ready_launch(self) -> Launch | None:
        """The current launch while the engine is ready (the one the gateway should route to), else None."""
        m = self._cell.machine
        return m.launch if m.state is State.READY else None

    def is_current(self, launch_id: str) -> bool:
        """Whether `launch_id` is the machine's current launch (not an old or forgotten one)."""
        launch = self._cell.machine.launch
        return launch is not None and launch.launch_id == launch_id
