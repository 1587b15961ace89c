"""What a host plan is made of: changes the appliance can make, and findings it can only report.

A `Change` is one effect `apply` will have, shown before it happens (`from` → `to`) with the
domain fact that makes it necessary. A `Finding` is something the appliance checked but will not
change itself (a GRUB default, a missing boot parameter, a cgroup layout): it says what is wrong
and what the operator can do. A finding of severity `error` is *bad input* (an unknown sysctl, a
filesystem that cannot hold a swapfile, a device without ACS): it blocks apply of its area, and
apply validates the whole plan before it touches anything, so bad input never leaves a half-done
host.

The `action` of a change carries everything the executor needs to make it; the `Undo` records
written to the journal carry everything revert needs to restore the previous state, so revert works
from the journal alone (after a controller restart, on a different day).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", validate_by_name=True, serialize_by_alias=True)


class Area(StrEnum):
    SWAP = "swap"
    SYSCTL = "sysctl"
    MEMLOCK = "memlock"
    ACS = "acs"
    BOOT = "boot"
    RUNTIME = "runtime"


class Severity(StrEnum):
    OK = "ok"
    INFO = "info"
    WARN = "warn"  # the host is at risk; the appliance cannot or will not fix it itself
    ERROR = "error"  # bad input: blocks apply of this area (nothing is changed)


class HostSetupError(RuntimeError):
    """An operator-facing failure of host setup: the message says what to do."""


# --- actions: what apply does -------------------------------------------------------------------


class SwapfileAction(Frozen):
    kind: Literal["swapfile"] = "swapfile"
    host_path: str  # as the host sees it (fstab, /proc/swaps)
    size_bytes: int = Field(gt=0)
    fstab_line: str


class SysctlAction(Frozen):
    kind: Literal["sysctl"] = "sysctl"
    name: str
    value: str
    conf_host_path: str


class DockerDefaultUlimitAction(Frozen):
    kind: Literal["docker-default-ulimit"] = "docker-default-ulimit"
    daemon_json_host_path: str
    name: str = "memlock"
    soft: int = -1
    hard: int = -1


class LimitsConfAction(Frozen):
    kind: Literal["limits-conf"] = "limits-conf"
    host_path: str
    content: str


class AcsControlAction(Frozen):
    kind: Literal["acs-control"] = "acs-control"
    bdf: str
    value: int = Field(ge=0, le=0xFFFF)


class SystemdUnitAction(Frozen):
    kind: Literal["systemd-unit"] = "systemd-unit"
    unit: str
    host_path: str
    content: str


Action = Annotated[
    SwapfileAction
    | SysctlAction
    | DockerDefaultUlimitAction
    | LimitsConfAction
    | AcsControlAction
    | SystemdUnitAction,
    Field(discriminator="kind"),
]


# --- undo records: what revert restores ---------------------------------------------------------


class SwapfileUndo(Frozen):
    """The swapfile is ours entirely: revert swaps it off, drops our fstab line, deletes it."""

    kind: Literal["swapfile"] = "swapfile"
    host_path: str
    fstab_line: str


class SysctlUndo(Frozen):
    kind: Literal["sysctl"] = "sysctl"
    name: str
    previous_live: str
    conf_host_path: str
    previous_conf_value: str | None  # the key's value in our conf file before us (None: absent)


class DockerDefaultUlimitUndo(Frozen):
    kind: Literal["docker-default-ulimit"] = "docker-default-ulimit"
    daemon_json_host_path: str
    name: str
    file_existed: bool
    previous: dict[str, int | str] | None  # the previous `default-ulimits.<name>` entry


class FileUndo(Frozen):
    """A whole file the appliance wrote: restore the previous content, or delete it if there was none."""

    kind: Literal["file"] = "file"
    host_path: str
    previous_content: str | None


class AcsControlUndo(Frozen):
    kind: Literal["acs-control"] = "acs-control"
    bdf: str
    original: int
    written: int


class SystemdUnitUndo(Frozen):
    kind: Literal["systemd-unit"] = "systemd-unit"
    unit: str
    host_path: str
    previous_content: str | None


Undo = Annotated[
    SwapfileUndo | SysctlUndo | DockerDefaultUlimitUndo | FileUndo | AcsControlUndo | SystemdUnitUndo,
    Field(discriminator="kind"),
]


# --- the plan -----------------------------------------------------------------------------------


class Change(Frozen):
    id: str = Field(description="Stable across runs: the journal key, e.g. `sysctl.vm.swappiness`.")
    area: Area
    what: str
    before: str = Field(alias="from")
    after: str = Field(alias="to")
    why: str = Field(description="The domain fact that makes this change necessary.")
    action: Action


class Finding(Frozen):
    area: Area
    severity: Severity
    message: str
    why: str = ""
    fix: str = ""


class HostPlan(Frozen):
    recipe: str | None
    host_root: str
    changes: tuple[Change, ...] = ()
    findings: tuple[Finding, ...] = ()

    def only(self, areas: Iterable[Area] | None) -> HostPlan:
        if areas is None:
            return self
        wanted = set(areas)
        return self.model_copy(
            update={
                "changes": tuple(c for c in self.changes if c.area in wanted),
                "findings": tuple(f for f in self.findings if f.area in wanted),
            }
        )

    def blockers(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity is Severity.ERROR)


class BadInput(HostSetupError):
    """The operator asked for something that cannot be meant (an unknown area, a malformed option)."""


class PlanRefused(HostSetupError):
    """Apply refused before touching anything because the plan contains bad input."""

    def __init__(self, blockers: tuple[Finding, ...]) -> None:
        self.blockers = blockers
        lines = [f"  [{f.area}] {f.message}" + (f" → {f.fix}" if f.fix else "") for f in blockers]
        super().__init__("nothing was changed: the plan has errors\n" + "\n".join(lines))


def parse_areas(text: str | None) -> tuple[Area, ...] | None:
    """`swap,sysctl` → areas; None/empty → all. Unknown names are an error that lists the valid ones."""
    if not text:
        return None
    out: list[Area] = []
    for raw in text.split(","):
        name = raw.strip().lower()
        if not name:
            continue
        try:
            out.append(Area(name))
        except ValueError:
            valid = ", ".join(a.value for a in Area)
            raise BadInput(f"unknown area {name!r} in --only (valid: {valid})") from None
    return tuple(out)
