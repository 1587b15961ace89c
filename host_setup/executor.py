"""Apply a plan, revert from the journal. The only place where the area executors are called.

Order of apply (DOMAIN-independent, but it is what makes bad input harmless):
1. refuse the whole plan if any area being applied has an error finding;
2. capture every change's undo record (read-only: the original values) — a failure here also
   changes nothing;
3. for each change: journal it (`applying`), make it, mark it `applied`.
A failure in step 3 leaves the journal naming every change that may have been made, and every
revert step tolerates a change that was only half made.

Revert walks the journal backwards (last change undone first) and drops each entry once undone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from host_setup import acs, memlock, swap, sysctl
from host_setup.commands import HostContext
from host_setup.journal import Journal, JournalEntry
from host_setup.model import Area, Change, HostPlan, HostSetupError, PlanRefused, Undo

_Capture = Callable[[Any, HostContext], Undo]
_Perform = Callable[[Any, HostContext], None]
_Revert = Callable[[Any, HostContext], None]

_APPLY: dict[str, tuple[_Capture, _Perform]] = {
    "swapfile": (swap.capture_swapfile, swap.apply_swapfile),
    "sysctl": (sysctl.capture_sysctl, sysctl.apply_sysctl),
    "docker-default-ulimit": (memlock.capture_docker_default, memlock.apply_docker_default),
    "limits-conf": (memlock.capture_file, memlock.apply_file),
    "acs-control": (acs.capture_acs, acs.apply_acs),
    "systemd-unit": (acs.capture_unit, acs.apply_unit),
}
_REVERT: dict[str, _Revert] = {
    "swapfile": swap.revert_swapfile,
    "sysctl": sysctl.revert_sysctl,
    "docker-default-ulimit": memlock.revert_docker_default,
    "file": memlock.revert_file,
    "acs-control": acs.revert_acs,
    "systemd-unit": acs.revert_unit,
}


def apply_plan(
    plan: HostPlan, ctx: HostContext, journal: Journal, areas: Iterable[Area] | None = None
) -> tuple[Change, ...]:
    """Make the plan's changes (only `areas` when given). Returns the changes made."""
    plan = plan.only(areas)
    blockers = plan.blockers()
    if blockers:
        raise PlanRefused(blockers)
    with journal.locked():
        undos = [_APPLY[c.action.kind][0](c.action, ctx) for c in plan.changes]
        for change, undo in zip(plan.changes, undos, strict=True):
            journal.begin(change.id, change.area, plan.recipe, change.action, undo)
            try:
                _APPLY[change.action.kind][1](change.action, ctx)
            except (HostSetupError, OSError) as exc:
                raise HostSetupError(
                    f"{change.id}: {exc}\nChanges made so far are recorded in {journal.path}; "
                    "`appliance host revert --yes` undoes them"
                ) from exc
            journal.mark_applied(change.id)
    return plan.changes


def revert_entries(
    ctx: HostContext,
    journal: Journal,
    areas: Iterable[Area] | None = None,
    select: Callable[[JournalEntry], bool] | None = None,
) -> tuple[JournalEntry, ...]:
    """Undo journaled changes, newest first; each entry is dropped once undone. Returns them."""
    done: list[JournalEntry] = []
    with journal.locked():
        for entry in reversed(journal.entries(areas)):
            if select is not None and not select(entry):
                continue
            try:
                _REVERT[entry.undo.kind](entry.undo, ctx)
            except (HostSetupError, OSError) as exc:
                reverted = ", ".join(e.id for e in done) or "nothing"
                raise HostSetupError(
                    f"reverting {entry.id} failed: {exc}\nReverted so far: {reverted}; the rest stays in "
                    f"{journal.path} — fix the cause and run revert again"
                ) from exc
            journal.remove(entry.id)
            done.append(entry)
    return tuple(done)
