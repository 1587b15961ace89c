"""PCIe ACS on the bridges above the GPUs: show, turn the redirect bits off, restore.

DOMAIN §6 (S12, S13): on the reference host the 12 bridges above the 4 cards had ACS control
0x001d (SrcValid ReqRedir CmpltRedir UpstreamFwd). Clearing the redirect bits made cross-card
`copy_` 6.95 → 28.3 GB/s (4.1×), with **zero** effect on decode (RCCL uses SHM; all-reduce messages
are KB-sized). It is kept as the deployed state, not as a speed lever. The first fix was setpci
(0x001d → 0x0000, a systemd unit with ExecStop=revert); the persistent one is the boot parameter
`pci=disable_acs_redir=<bridges>`, which leaves 0x0011 — so when it is on the command line it is
reported as the preferred state and the unit is not needed.

`can_device_access_peer` says YES either way and proves nothing: measure P2P with a torch
cross-device `copy_` (≥ 15.75 GB/s can only be direct P2P).

Bridges are found from sysfs topology: `/sys/bus/pci/devices/<gpu>` is a symlink into
`/sys/devices/pci0000:00/<root port>/<switch up>/<switch down>/<gpu>`; every PCI address on that
path above the GPU is a bridge on its way to the root complex.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Literal

from appliance.host_facts import GPU_VENDORS, parse_pci_kind
from host_setup.commands import HostContext
from host_setup.files import atomic_write, restore_file
from host_setup.model import (
    AcsControlAction,
    AcsControlUndo,
    Area,
    Change,
    Finding,
    HostSetupError,
    Severity,
    SystemdUnitAction,
    SystemdUnitUndo,
)
from host_setup.pci_config import REDIRECT_BITS, AcsUnreadable, PciConfigAccess, access_for, describe_control
from host_setup.procfs import cmdline_tokens
from host_setup.root import HostRoot, read_text

_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
UNIT_NAME = "appliance-acs.service"
UNIT_HOST_PATH = f"/etc/systemd/system/{UNIT_NAME}"
WHY = (
    "DOMAIN §6: ACS redirect off lets cross-card copy_ go direct (6.95 → 28.3 GB/s); zero effect on "
    "decode — kept as the deployed state"
)
P2P_NOTE = (
    "measure P2P with a torch cross-device copy_ (≥ 15.75 GB/s can only be direct P2P); "
    "can_device_access_peer says YES either way (DOMAIN §6)"
)
Mode = Literal["redirect", "all"]  # clear RR/CR/EC (= the boot parameter, 0x001d → 0x0011) or all bits


@dataclass(frozen=True)
class Bridge:
    bdf: str
    gpus_below: tuple[str, ...]
    has_acs: bool | None  # None: config space not readable far enough
    control: int | None
    note: str = ""

    @property
    def redirect_on(self) -> bool:
        return self.control is not None and bool(self.control & REDIRECT_BITS)


@dataclass(frozen=True)
class AcsTopology:
    gpus: tuple[str, ...]
    bridges: tuple[Bridge, ...]
    boot_param: str | None  # the value of pci=…disable_acs_redir=…, when on the running cmdline
    unit_content: str | None


def find_gpus(root: HostRoot) -> tuple[str, ...]:
    devices = root.sys / "bus" / "pci" / "devices"
    if not devices.is_dir():
        return ()
    found = []
    for dev in sorted(devices.iterdir()):
        vendor = (read_text(dev / "vendor") or "").strip().lower()
        if vendor in GPU_VENDORS and parse_pci_kind(read_text(dev / "class") or "") is not None:
            found.append(dev.name)
    return tuple(found)


def bridges_above(root: HostRoot, bdf: str) -> tuple[str, ...]:
    """PCI addresses on the sysfs path from the root complex down to `bdf`, excluding `bdf`."""
    link = root.sys / "bus" / "pci" / "devices" / bdf
    parts = os.path.realpath(link).split(os.sep)
    addresses = [p for p in parts if _BDF.match(p)]
    return tuple(addresses[:-1]) if addresses and addresses[-1] == bdf else ()


def disable_acs_redir_param(cmdline: str | None) -> str | None:
    """`pci=noaer,disable_acs_redir=0000:00:01.1;…` → `0000:00:01.1;…` (None when absent)."""
    for token in cmdline_tokens(cmdline):
        if token.startswith("pci="):
            for option in token.removeprefix("pci=").split(","):
                if option.startswith("disable_acs_redir="):
                    return option.removeprefix("disable_acs_redir=")
    return None


def read_acs_topology(
    root: HostRoot, access: PciConfigAccess, only: tuple[str, ...] | None = None
) -> AcsTopology:
    """The GPUs, the bridges above them (each once, root first) and their ACS control words.
    `only`: examine exactly these devices instead (an operator naming bridges)."""
    gpus = find_gpus(root)
    below: dict[str, list[str]] = {}
    if only is not None:
        below = {bdf: [] for bdf in only}
    else:
        for gpu in gpus:
            for bridge in bridges_above(root, gpu):
                below.setdefault(bridge, []).append(gpu)
    bridges = []
    for bdf, under in below.items():
        if not (root.sys / "bus" / "pci" / "devices" / bdf).exists():
            bridges.append(Bridge(bdf, tuple(under), None, None, note="no such PCI device"))
            continue
        try:
            offset = access.acs_offset(bdf)
        except AcsUnreadable as exc:
            bridges.append(Bridge(bdf, tuple(under), None, None, note=str(exc)))
            continue
        control = access.read_control(bdf) if offset is not None else None
        bridges.append(Bridge(bdf, tuple(under), offset is not None, control))
    return AcsTopology(
        gpus=gpus,
        bridges=tuple(bridges),
        boot_param=disable_acs_redir_param(read_text(root.proc / "cmdline")),
        unit_content=read_text(root.path(UNIT_HOST_PATH)),
    )


def target_value(control: int, mode: Mode) -> int:
    return 0 if mode == "all" else control & ~REDIRECT_BITS


def plan_acs(
    topo: AcsTopology, mode: Mode = "redirect", explicit: bool = False
) -> tuple[list[Change], list[Finding]]:
    """Pure: a change per bridge whose redirect bits are on. `explicit`: the operator named the
    devices, so one without ACS (or unreadable) is bad input rather than a fact to report."""
    changes: list[Change] = []
    findings: list[Finding] = []
    if not topo.bridges:
        what = (
            "no GPU found under /sys/bus/pci/devices"
            if not topo.gpus
            else "the GPUs have no bridge above them"
        )
        findings.append(
            Finding(
                area=Area.ACS,
                severity=Severity.ERROR,
                message=f"{what}: nothing to set",
                fix="load the GPU driver / check --host-root, or name the bridges with --device",
            )
        )
        return changes, findings
    if topo.boot_param is not None:
        findings.append(
            Finding(
                area=Area.ACS,
                severity=Severity.INFO,
                message=(
                    f"the boot parameter pci=disable_acs_redir={topo.boot_param} is set: the preferred "
                    "persistent state (the kernel clears the redirect bits at boot; no unit needed)"
                ),
                why="DOMAIN §6",
            )
        )
    for bridge in topo.bridges:
        if not bridge.has_acs:
            reason = bridge.note or "no ACS capability"
            findings.append(
                Finding(
                    area=Area.ACS,
                    severity=Severity.ERROR if explicit or bridge.has_acs is None else Severity.INFO,
                    message=f"{bridge.bdf}: {reason}"
                    + ("" if explicit or bridge.has_acs is None else " (skipped)"),
                    fix="" if not explicit else "name only bridges that have ACS (`appliance host acs show`)",
                )
            )
            continue
        assert bridge.control is not None
        if not bridge.redirect_on:
            findings.append(
                Finding(
                    area=Area.ACS,
                    severity=Severity.OK,
                    message=f"{bridge.bdf}: {describe_control(bridge.control)} — redirect off",
                )
            )
            continue
        value = target_value(bridge.control, mode)
        changes.append(
            Change(
                id=f"acs.{bridge.bdf}",
                area=Area.ACS,
                what=f"ACS control of bridge {bridge.bdf} (above {', '.join(bridge.gpus_below) or 'named'})",
                before=describe_control(bridge.control),
                after=describe_control(value),
                why=WHY,
                action=AcsControlAction(bdf=bridge.bdf, value=value),
            )
        )
    if changes:
        findings.append(Finding(area=Area.ACS, severity=Severity.INFO, message=P2P_NOTE))
    return changes, findings


def unit_content(exec_path: str, appliance_home: str) -> str:
    return (
        "[Unit]\n"
        "Description=Appliance: PCIe ACS redirect off on the bridges above the GPUs (DOMAIN §6)\n"
        "After=systemd-modules-load.service\n\n"
        "[Service]\n"
        "Type=oneshot\n"
        "RemainAfterExit=yes\n"
        f"Environment=APPLIANCE_HOME={appliance_home}\n"
        f"ExecStart={exec_path} host acs apply --yes\n"
        f"ExecStop={exec_path} host acs revert --yes\n\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


def plan_unit(topo: AcsTopology, content: str) -> tuple[list[Change], list[Finding]]:
    """Pure: install the boot-time unit, unless the boot parameter already does the job."""
    if topo.boot_param is not None:
        return [], [
            Finding(
                area=Area.ACS,
                severity=Severity.INFO,
                message=f"{UNIT_NAME} not installed: pci=disable_acs_redir= on the command line is preferred",
            )
        ]
    if topo.unit_content == content:
        return [], [Finding(area=Area.ACS, severity=Severity.OK, message=f"{UNIT_NAME} installed")]
    return [
        Change(
            id="acs.unit",
            area=Area.ACS,
            what=f"install and enable {UNIT_NAME} (ExecStart apply, ExecStop revert)",
            before="absent" if topo.unit_content is None else "different content",
            after=f"{UNIT_HOST_PATH}, enabled",
            why="DOMAIN §6: config-space writes are lost at reboot; the unit re-applies them at boot",
            action=SystemdUnitAction(unit=UNIT_NAME, host_path=UNIT_HOST_PATH, content=content),
        )
    ], []


# --- executor ----------------------------------------------------------------------------------


def capture_acs(action: AcsControlAction, ctx: HostContext) -> AcsControlUndo:
    original = access_for(ctx).read_control(action.bdf)
    return AcsControlUndo(bdf=action.bdf, original=original, written=action.value)


def apply_acs(action: AcsControlAction, ctx: HostContext) -> None:
    access = access_for(ctx)
    access.write_control(action.bdf, action.value)
    got = access.read_control(action.bdf)
    if got != action.value:
        raise HostSetupError(
            f"wrote ACS control {action.value:#06x} to {action.bdf} but it reads back {got:#06x} "
            "(the bridge does not implement those bits as writable)"
        )


def revert_acs(undo: AcsControlUndo, ctx: HostContext) -> None:
    access = access_for(ctx)
    if access.read_control(undo.bdf) != undo.original:
        access.write_control(undo.bdf, undo.original)


def capture_unit(action: SystemdUnitAction, ctx: HostContext) -> SystemdUnitUndo:
    previous = read_text(ctx.root.path(action.host_path))
    return SystemdUnitUndo(unit=action.unit, host_path=action.host_path, previous_content=previous)


def apply_unit(action: SystemdUnitAction, ctx: HostContext) -> None:
    atomic_write(ctx.root.path(action.host_path), action.content)
    ctx.commands.run(["systemctl", "daemon-reload"])
    ctx.commands.run(["systemctl", "enable", action.unit])


def revert_unit(undo: SystemdUnitUndo, ctx: HostContext) -> None:
    if undo.previous_content is None:
        # disable only: `stop` would run ExecStop (= revert the ACS words), which is the operator's call.
        ctx.commands.run(["systemctl", "disable", undo.unit], check=False)
    restore_file(ctx.root.path(undo.host_path), undo.previous_content)
    ctx.commands.run(["systemctl", "daemon-reload"])
