"""`appliance host …`: the host changes a recipe needs, as plan → apply → revert.

    appliance host facts                          what the appliance knows about this host
    appliance host plan RECIPE                    what apply would change, and why (with the DOMAIN fact)
    appliance host apply RECIPE [--only …] --yes  make the changes, recorded in the journal
    appliance host revert [--only …] --yes        undo exactly what the journal records
    appliance host acs show|apply|revert          PCIe ACS on the bridges above the GPUs (DOMAIN §6)

All take `--json` and `--host-root DIR` (a copied or fixture tree instead of /). Under another root
nothing touches the running kernel: swapon/swapoff edit that tree's proc/swaps, systemctl is only
recorded. The journal defaults to `paths().host_changes` (inside DIR for another root).

Exit codes: 0 done / nothing to do, 1 the plan has errors or a change failed (nothing or only
journaled changes were made), 2 bad input (unknown recipe or area, not root), 3 not confirmed
(no --yes: the plan was printed, nothing changed).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from appliance.recipe.recipe_loader import RecipeError
from appliance.recipe.recipe_model import Recipe
from controller.catalogue import Catalogue
from controller.cli.options import JsonOpt
from controller.settings import paths, recipes_dir
from host_setup import acs as acs_mod
from host_setup.commands import Commands, HostContext, SubprocessCommands
from host_setup.executor import apply_plan, revert_entries
from host_setup.facts import HostFactsError, gather_facts
from host_setup.fixture_commands import FixtureCommands
from host_setup.journal import Journal, JournalEntry
from host_setup.model import Area, BadInput, Change, Finding, HostPlan, HostSetupError, Severity, parse_areas
from host_setup.pci_config import describe_control
from host_setup.planner import plan_acs_only, plan_host
from host_setup.root import DEFAULT_SWAP_DIR, HostRoot

EXIT_ERRORS = 1
EXIT_BAD_INPUT = 2
EXIT_NOT_CONFIRMED = 3

host_app = typer.Typer(
    name="host",
    help="Host facts, and the host changes a recipe needs: plan, apply, revert.",
    no_args_is_help=True,
)
acs_app = typer.Typer(
    name="acs",
    help="PCIe ACS on the bridges above the GPUs (DOMAIN §6): show, apply, revert.",
    no_args_is_help=True,
)
host_app.add_typer(acs_app)

HostRootOpt = Annotated[
    Path,
    typer.Option("--host-root", help="Work on this tree (a copy or fixture) instead of the running host /."),
]
YesOpt = Annotated[
    bool, typer.Option("--yes", help="Really change the host (without it: show what would change).")
]
OnlyOpt = Annotated[
    str | None, typer.Option("--only", help="Comma-separated areas: swap,sysctl,memlock,acs,boot,runtime.")
]
JournalOpt = Annotated[
    Path | None,
    typer.Option("--journal", help="The change journal (default: the appliance's host-changes.json)."),
]
SwapDirOpt = Annotated[
    str, typer.Option("--swap-dir", help="Host directory for the appliance's swapfile (ext4/xfs).")
]
SysctlOpt = Annotated[
    list[str] | None, typer.Option("--sysctl", help="An extra sysctl NAME=VALUE to manage (repeatable).")
]
PciViaOpt = Annotated[
    str, typer.Option("--pci-via", help="How PCI config is read/written: sysfs (config file) or setpci.")
]
ClearOpt = Annotated[
    str,
    typer.Option(
        "--clear",
        help="redirect: clear ReqRedir/CmpltRedir/EgressCtrl (0x001d→0x0011, like the boot parameter); "
        "all: every ACS bit (0x001d→0x0000, like the original setpci script).",
    ),
]
DeviceOpt = Annotated[
    str | None,
    typer.Option("--device", help="Comma-separated bridge addresses instead of those above the GPUs."),
]
UnitOpt = Annotated[
    bool,
    typer.Option("--unit", help="Also install (apply) / remove (revert) the appliance-acs.service unit."),
]


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `appliance` app."""
    app.add_typer(host_app)


# --- plumbing ----------------------------------------------------------------------------------


@contextmanager
def _errors() -> Iterator[None]:
    """Operator-facing errors become one paragraph on stderr and an exit code — never a traceback."""
    try:
        yield
    except (RecipeError, HostFactsError, BadInput) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    except HostSetupError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_ERRORS) from None


def _root(host_root: Path, swap_dir: str) -> HostRoot:
    if not host_root.is_dir():
        raise BadInput(f"--host-root {host_root} is not a directory")
    try:
        return HostRoot.at(host_root, swap_dir=swap_dir)
    except ValueError as exc:
        raise BadInput(str(exc)) from None


def _context(root: HostRoot, pci_via: str = "sysfs") -> HostContext:
    if pci_via not in ("sysfs", "setpci"):
        raise BadInput(f"--pci-via must be sysfs or setpci, not {pci_via!r}")
    via: Literal["sysfs", "setpci"] = "setpci" if pci_via == "setpci" else "sysfs"
    commands: Commands = SubprocessCommands() if root.is_real else FixtureCommands(root)
    return HostContext(root=root, commands=commands, pci_via=via)


def _journal(root: HostRoot, explicit: Path | None) -> Journal:
    if explicit is not None:
        return Journal(explicit, root.base)
    default = paths().host_changes
    return Journal(default if root.is_real else root.path(str(default)), root.base)


def _need_root(root: HostRoot, verb: str) -> None:
    if root.is_real and os.geteuid() != 0:
        typer.echo(
            f"error: `appliance host {verb}` changes the running host (swap, sysctls, PCI config, /etc) "
            "and needs root: run it with sudo, or pass --host-root DIR to work on a copied tree",
            err=True,
        )
        raise typer.Exit(EXIT_BAD_INPUT)


def _recipe(name: str) -> Recipe:
    recipe = Catalogue(recipes_dir()).named(name)
    if recipe.abstract:
        raise BadInput(f"'{name}' is an abstract base recipe (abstract: true); use a recipe that extends it")
    return recipe


def _sysctl_args(values: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values or []:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise BadInput(f"--sysctl expects NAME=VALUE, got {item!r}")
        out[name.strip()] = value.strip()
    return out


def _mode(clear: str) -> acs_mod.Mode:
    if clear == "redirect":
        return "redirect"
    if clear == "all":
        return "all"
    raise BadInput(f"--clear must be redirect or all, not {clear!r}")


def _areas(only: str | None) -> tuple[Area, ...] | None:
    return parse_areas(only)


# --- output ------------------------------------------------------------------------------------

_MARK = {Severity.OK: "ok", Severity.INFO: "info", Severity.WARN: "WARN", Severity.ERROR: "ERROR"}


def _echo_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))


def _echo_change(change: Change, show_why: bool = True) -> None:
    typer.echo(f"  [{change.area}] {change.id}: {change.what}")
    typer.echo(f"      from: {change.before}")
    typer.echo(f"      to:   {change.after}")
    if show_why:
        typer.echo(f"      why:  {change.why}")


def _echo_finding(finding: Finding) -> None:
    typer.echo(f"  {_MARK[finding.severity]:5} [{finding.area}] {finding.message}")
    if finding.fix:
        typer.echo(f"        fix: {finding.fix}")
    if finding.why and finding.severity in (Severity.WARN, Severity.ERROR):
        typer.echo(f"        why: {finding.why}")


def _echo_plan(plan: HostPlan, title: str) -> None:
    typer.echo(f"{title} — host root {plan.host_root}")
    if plan.changes:
        typer.echo(f"Changes ({len(plan.changes)}):")
        previous_why = None
        for change in plan.changes:
            _echo_change(change, show_why=change.why != previous_why)  # 12 ACS bridges share one reason
            previous_why = change.why
    else:
        typer.echo("Changes: none — the host already meets the recipe in these areas.")
    if plan.findings:
        typer.echo("Checks:")
        for finding in plan.findings:
            _echo_finding(finding)


def _plan_json(plan: HostPlan, **extra: Any) -> dict[str, Any]:
    return {**plan.model_dump(mode="json", by_alias=True), **extra}


def _entry_json(entry: JournalEntry) -> dict[str, Any]:
    return entry.model_dump(mode="json", by_alias=True)


# --- commands ----------------------------------------------------------------------------------


@host_app.command("facts")
def facts_cmd(as_json: JsonOpt = False, host_root: HostRootOpt = Path("/")) -> None:
    """What the appliance reads about this host: RAM, swap, swappiness, memlock, GPUs, cgroups, cmdline."""
    with _errors():
        facts = gather_facts(host_root, appliance_home=paths().home)
    if as_json:
        _echo_json(facts.model_dump(mode="json"))
        return
    gib = 1024**3
    memlock = {None: "unknown", -1: "unlimited"}
    typer.echo(f"host root        {host_root}")
    typer.echo(
        f"RAM              {facts.mem_total_bytes / gib:.2f} GiB "
        f"({facts.mem_available_bytes / gib:.2f} available)"
    )
    typer.echo(
        f"swap             {facts.swap_total_bytes / gib:.2f} GiB ({facts.swap_free_bytes / gib:.2f} free)"
    )
    typer.echo(f"vm.swappiness    {facts.swappiness if facts.swappiness is not None else 'unknown'}")
    soft = facts.memlock_soft_bytes
    typer.echo(f"memlock (soft)   {memlock.get(soft, f'{(soft or 0) / 1024**2:.0f} MiB')}")
    typer.echo(f"kernel           {facts.kernel_release or 'unknown'}")
    typer.echo(f"cmdline          {facts.cmdline or '(unknown)'}")
    typer.echo(
        f"cgroup           v{facts.cgroup_version}" if facts.cgroup_version else "cgroup           unknown"
    )
    limit = facts.cgroup_memory_limit_bytes
    typer.echo(f"own memory limit {'none' if limit is None else f'{limit / gib:.2f} GiB'}")
    typer.echo(f"GPUs             {len(facts.gpus)}")
    for gpu in facts.gpus:
        typer.echo(
            f"  {gpu.pci_address}  {gpu.vendor} {gpu.device_id} ({gpu.kind}, driver {gpu.driver or 'none'})"
        )


@host_app.command("plan")
def plan_cmd(
    recipe: Annotated[str, typer.Argument(help="Recipe name (see `appliance recipes list`).")],
    as_json: JsonOpt = False,
    host_root: HostRootOpt = Path("/"),
    only: OnlyOpt = None,
    journal: JournalOpt = None,
    swap_dir: SwapDirOpt = DEFAULT_SWAP_DIR,
    sysctl: SysctlOpt = None,
    clear: ClearOpt = "redirect",
    pci_via: PciViaOpt = "sysfs",
) -> None:
    """What `apply` would change on this host for RECIPE, and why. Exit 1 when the plan has errors."""
    with _errors():
        plan = _plan(recipe, host_root, only, journal, swap_dir, sysctl, clear, pci_via)[0]
    if as_json:
        _echo_json(_plan_json(plan))
    else:
        _echo_plan(plan, f"Host plan for {recipe}")
    if plan.blockers():
        raise typer.Exit(EXIT_ERRORS)


def _plan(
    recipe: str,
    host_root: Path,
    only: str | None,
    journal: Path | None,
    swap_dir: str,
    sysctl: list[str] | None,
    clear: str,
    pci_via: str,
) -> tuple[HostPlan, HostContext, Journal, tuple[Area, ...] | None]:
    areas = _areas(only)
    root = _root(host_root, swap_dir)
    ctx = _context(root, pci_via)
    jrnl = _journal(root, journal)
    plan = plan_host(
        _recipe(recipe),
        ctx,
        jrnl,
        extra_sysctls=_sysctl_args(sysctl),
        acs_mode=_mode(clear),
        appliance_home=paths().home,
    )
    return plan.only(areas), ctx, jrnl, areas


@host_app.command("apply")
def apply_cmd(
    recipe: Annotated[str, typer.Argument(help="Recipe name (see `appliance recipes list`).")],
    yes: YesOpt = False,
    as_json: JsonOpt = False,
    host_root: HostRootOpt = Path("/"),
    only: OnlyOpt = None,
    journal: JournalOpt = None,
    swap_dir: SwapDirOpt = DEFAULT_SWAP_DIR,
    sysctl: SysctlOpt = None,
    clear: ClearOpt = "redirect",
    pci_via: PciViaOpt = "sysfs",
) -> None:
    """Make the changes RECIPE needs (after validating all of them), each recorded in the journal."""
    with _errors():
        plan, ctx, jrnl, areas = _plan(recipe, host_root, only, journal, swap_dir, sysctl, clear, pci_via)
    if not yes:
        _unconfirmed(plan, as_json, f"Host plan for {recipe} (not applied)", ctx.root)
    _need_root(ctx.root, "apply")
    with _errors():
        done = apply_plan(plan, ctx, jrnl, areas)
    _report_applied(plan, done, jrnl, as_json)


def _unconfirmed(plan: HostPlan, as_json: bool, title: str, root: HostRoot) -> None:
    if as_json:
        _echo_json(_plan_json(plan, applied=False, reason="not confirmed: pass --yes"))
    else:
        _echo_plan(plan, title)
        need = " (as root)" if root.is_real and os.geteuid() != 0 else ""
        typer.echo(f"\nNothing changed. Re-run with --yes{need} to apply.", err=True)
    raise typer.Exit(EXIT_NOT_CONFIRMED)


def _report_applied(plan: HostPlan, done: tuple[Change, ...], jrnl: Journal, as_json: bool) -> None:
    if as_json:
        _echo_json(_plan_json(plan, applied=True, journal=str(jrnl.path), applied_ids=[c.id for c in done]))
        return
    if not done:
        typer.echo("Nothing to change: the host already meets the recipe in these areas.")
    for change in done:
        typer.echo(f"  applied [{change.area}] {change.id}: {change.before} → {change.after}")
    attention = [f for f in plan.findings if f.severity in (Severity.WARN, Severity.ERROR)]
    if attention:
        typer.echo("Still needs attention (the appliance does not change these itself):")
        for finding in attention:
            _echo_finding(finding)
    if done:
        typer.echo(f"Recorded in {jrnl.path}; `appliance host revert --yes` undoes it.")


@host_app.command("revert")
def revert_cmd(
    yes: YesOpt = False,
    as_json: JsonOpt = False,
    host_root: HostRootOpt = Path("/"),
    only: OnlyOpt = None,
    journal: JournalOpt = None,
) -> None:
    """Undo what the journal records (newest first), restoring the previous values."""
    with _errors():
        areas = _areas(only)
        root = _root(host_root, DEFAULT_SWAP_DIR)
        ctx = _context(root)
        jrnl = _journal(root, journal)
        entries = jrnl.entries(areas)
    if not yes:
        _unconfirmed_revert(entries, jrnl, as_json)
    _need_root(root, "revert")
    with _errors():
        done = revert_entries(ctx, jrnl, areas)
    _report_reverted(done, jrnl, as_json)


def _unconfirmed_revert(entries: tuple[JournalEntry, ...], jrnl: Journal, as_json: bool) -> None:
    if as_json:
        _echo_json(
            {"journal": str(jrnl.path), "reverted": False, "entries": [_entry_json(e) for e in entries]}
        )
    else:
        typer.echo(f"Journal {jrnl.path}: {len(entries)} change(s) would be reverted")
        for entry in reversed(entries):
            typer.echo(f"  [{entry.area}] {entry.id} ({entry.status}, recipe {entry.recipe or '-'})")
        typer.echo("\nNothing changed. Re-run with --yes to revert.", err=True)
    raise typer.Exit(EXIT_NOT_CONFIRMED)


def _report_reverted(done: tuple[JournalEntry, ...], jrnl: Journal, as_json: bool) -> None:
    if as_json:
        _echo_json({"journal": str(jrnl.path), "reverted": True, "entries": [_entry_json(e) for e in done]})
        return
    if not done:
        typer.echo(f"Nothing to revert: {jrnl.path} records no changes in these areas.")
    for entry in done:
        typer.echo(f"  reverted [{entry.area}] {entry.id}")


# --- acs ---------------------------------------------------------------------------------------


def _devices(device: str | None) -> tuple[str, ...] | None:
    if not device:
        return None
    return tuple(d.strip().lower() for d in device.split(",") if d.strip())


def _unit_text() -> str:
    exe = shutil.which("appliance") or str(Path(sys.argv[0]).resolve())
    return acs_mod.unit_content(exe, str(paths().home))


def _topology_json(topo: acs_mod.AcsTopology) -> dict[str, Any]:
    return {
        "gpus": list(topo.gpus),
        "boot_param": topo.boot_param,
        "unit_installed": topo.unit_content is not None,
        "bridges": [
            {
                "bdf": b.bdf,
                "above": list(b.gpus_below),
                "acs": b.has_acs,
                "control": None if b.control is None else f"0x{b.control:04x}",
                "redirect": b.redirect_on if b.has_acs else None,
                "note": b.note,
            }
            for b in topo.bridges
        ],
    }


@acs_app.command("show")
def acs_show(
    as_json: JsonOpt = False,
    host_root: HostRootOpt = Path("/"),
    device: DeviceOpt = None,
    pci_via: PciViaOpt = "sysfs",
) -> None:
    """The bridges above the GPUs and their ACS control words; the boot parameter and the unit."""
    with _errors():
        ctx = _context(_root(host_root, DEFAULT_SWAP_DIR), pci_via)
        plan, topo = plan_acs_only(ctx, devices=_devices(device))
    if as_json:
        _echo_json({**_topology_json(topo), "plan": _plan_json(plan)})
        return
    typer.echo(f"GPUs: {', '.join(topo.gpus) or 'none found'}")
    for finding in plan.findings:
        if finding.severity in (Severity.WARN, Severity.ERROR):
            _echo_finding(finding)
    for b in topo.bridges:
        if b.has_acs and b.control is not None:
            state = f"{describe_control(b.control)}  redirect {'ON' if b.redirect_on else 'off'}"
        else:
            state = b.note or "no ACS capability"
        typer.echo(f"  {b.bdf}  above {', '.join(b.gpus_below) or '-':14}  {state}")
    param = f"pci=disable_acs_redir={topo.boot_param}" if topo.boot_param is not None else "not set"
    typer.echo(f"boot parameter: {param}")
    typer.echo(f"{acs_mod.UNIT_NAME}: {'installed' if topo.unit_content is not None else 'not installed'}")
    typer.echo(f"note: {acs_mod.P2P_NOTE}")


@acs_app.command("apply")
def acs_apply(
    yes: YesOpt = False,
    as_json: JsonOpt = False,
    host_root: HostRootOpt = Path("/"),
    device: DeviceOpt = None,
    clear: ClearOpt = "redirect",
    unit: UnitOpt = False,
    journal: JournalOpt = None,
    pci_via: PciViaOpt = "sysfs",
) -> None:
    """Turn the ACS redirect bits off on the bridges above the GPUs (originals go to the journal)."""
    with _errors():
        root = _root(host_root, DEFAULT_SWAP_DIR)
        ctx = _context(root, pci_via)
        jrnl = _journal(root, journal)
        plan, _topo = plan_acs_only(
            ctx, devices=_devices(device), mode=_mode(clear), unit=_unit_text() if unit else None
        )
    if not yes:
        _unconfirmed(plan, as_json, "ACS plan (not applied)", root)
    _need_root(root, "acs apply")
    with _errors():
        done = apply_plan(plan, ctx, jrnl)
    _report_applied(plan, done, jrnl, as_json)


@acs_app.command("revert")
def acs_revert(
    yes: YesOpt = False,
    as_json: JsonOpt = False,
    host_root: HostRootOpt = Path("/"),
    unit: UnitOpt = False,
    journal: JournalOpt = None,
    pci_via: PciViaOpt = "sysfs",
) -> None:
    """Restore the ACS control words the appliance changed (and with --unit, remove the unit)."""
    with _errors():
        root = _root(host_root, DEFAULT_SWAP_DIR)
        ctx = _context(root, pci_via)
        jrnl = _journal(root, journal)
        kinds = {"acs-control", "systemd-unit"} if unit else {"acs-control"}
        entries = tuple(e for e in jrnl.entries([Area.ACS]) if e.undo.kind in kinds)
    if not yes:
        _unconfirmed_revert(entries, jrnl, as_json)
    _need_root(root, "acs revert")
    with _errors():
        done = revert_entries(ctx, jrnl, [Area.ACS], select=lambda e: e.undo.kind in kinds)
    _report_reverted(done, jrnl, as_json)
