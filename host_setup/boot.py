"""Boot and driver checks: required kernel parameters, and whether the kernel GRUB will boot next has
the GPU driver module. Checks only — GRUB is never edited by the appliance: a wrong edit there costs
a trip to the console, so the finding says exactly what to change.

DOMAIN §1: the reference host runs `iommu=pt pci=disable_acs_redir=<12 bridges>`; GRUB is pinned
(`GRUB_DEFAULT="1>2"`) to 5.15.0-191 because the installed 5.15.0-194 has no `hydcu` module.
"""

from __future__ import annotations

from dataclasses import dataclass

from appliance.recipe.recipe_model import Platform
from host_setup.grub import (
    MenuEntry,
    effective_spec,
    find_kernel_entry,
    grub_cfg_default,
    parse_grub_cfg,
    parse_grubenv,
    parse_shell_assignments,
    position_spec,
    resolve,
    stable_spec,
)
from host_setup.model import Area, Finding, Severity
from host_setup.procfs import cmdline_tokens
from host_setup.root import HostRoot, read_text

NO_GPU = "DOMAIN §1: a kernel without the GPU driver module boots with no GPU (5.15.0-194 has no hydcu)"
_MODULE_SUFFIXES = (".ko", ".ko.xz", ".ko.zst", ".ko.gz")


@dataclass(frozen=True)
class BootState:
    running_cmdline: tuple[str, ...]
    configured_cmdline: tuple[str, ...] | None  # None: no /etc/default/grub
    running_kernel: str | None
    grub_default: str | None  # GRUB_DEFAULT in /etc/default/grub
    cfg_default: str | None  # `set default=` in grub.cfg
    grubenv: dict[str, str]
    menu: tuple[MenuEntry, ...] | None  # None: no grub.cfg
    installed: tuple[str, ...]  # kernel releases under /lib/modules
    with_module: frozenset[str]  # those that have the driver module
    module: str | None


def default_driver(platform: Platform, cpuinfo: str | None) -> str | None:
    """The GPU driver a platform needs: hydcu on Hygon DCUs, amdgpu on other gfx906 hosts."""
    if platform is Platform.GFX906:
        return "hydcu" if "HygonGenuine" in (cpuinfo or "") else "amdgpu"
    if platform is Platform.CUDA:
        return "nvidia"
    return None


def has_module(root: HostRoot, kernel: str, module: str) -> bool:
    directory = root.lib_modules / kernel
    if not directory.is_dir():
        return False
    wanted = module.replace("-", "_")
    for path in directory.rglob(f"{module[:1]}*.ko*"):
        name = path.name
        for suffix in _MODULE_SUFFIXES:
            if name.endswith(suffix) and name.removesuffix(suffix).replace("-", "_") == wanted:
                return True
    return False


def read_boot_state(root: HostRoot, module: str | None) -> BootState:
    default_files = [read_text(root.etc / "default" / "grub")]
    dropins = root.etc / "default" / "grub.d"
    if dropins.is_dir():
        default_files += [read_text(p) for p in sorted(dropins.glob("*.cfg"))]
    grub_vars = parse_shell_assignments(default_files) if default_files[0] is not None else None
    cfg_text = read_text(root.boot / "grub" / "grub.cfg") or read_text(root.boot / "grub2" / "grub.cfg")
    installed = (
        tuple(sorted(p.name for p in root.lib_modules.iterdir() if p.is_dir()))
        if root.lib_modules.is_dir()
        else ()
    )
    configured = None
    if grub_vars is not None:
        configured = cmdline_tokens(
            grub_vars.get("GRUB_CMDLINE_LINUX", "") + " " + grub_vars.get("GRUB_CMDLINE_LINUX_DEFAULT", "")
        )
    return BootState(
        running_cmdline=cmdline_tokens(read_text(root.proc / "cmdline")),
        configured_cmdline=configured,
        running_kernel=(read_text(root.proc / "sys" / "kernel" / "osrelease") or "").strip() or None,
        grub_default=grub_vars.get("GRUB_DEFAULT") if grub_vars else None,
        cfg_default=grub_cfg_default(cfg_text),
        grubenv=parse_grubenv(read_text(root.boot / "grub" / "grubenv")),
        menu=parse_grub_cfg(cfg_text) if cfg_text is not None else None,
        installed=installed,
        with_module=frozenset(k for k in installed if module and has_module(root, k, module)),
        module=module,
    )


def has_param(tokens: tuple[str, ...], wanted: str) -> bool:
    """`iommu=pt` matches exactly; a value ending in `=` (`pci=disable_acs_redir=`) matches any value;
    `pci=` options may be combined (`pci=noaer,disable_acs_redir=…`)."""
    key, _, value = wanted.partition("=")
    for token in tokens:
        if token == wanted or (wanted.endswith("=") and token.startswith(wanted)):
            return True
        if key == "pci" and token.startswith("pci=") and value:
            for option in token.removeprefix("pci=").split(","):
                if option == value or (value.endswith("=") and option.startswith(value)):
                    return True
    return False


def plan_boot(state: BootState, required: tuple[str, ...]) -> list[Finding]:
    """Pure: the findings about boot parameters and the kernel the next boot lands on."""
    return _param_findings(state, required) + _kernel_findings(state)


def _param_findings(state: BootState, required: tuple[str, ...]) -> list[Finding]:
    findings: list[Finding] = []
    next_args = _next_boot_args(state)
    for param in required:
        running = has_param(state.running_cmdline, param)
        configured = None if state.configured_cmdline is None else has_param(state.configured_cmdline, param)
        at_next = None if next_args is None else has_param(next_args, param)
        shown = param + ("…" if param.endswith("=") else "")
        add = f"add {shown} to GRUB_CMDLINE_LINUX_DEFAULT in /etc/default/grub, run update-grub"
        if running and configured is not False and at_next is not False:
            findings.append(
                Finding(area=Area.BOOT, severity=Severity.OK, message=f"{shown} is on the command line")
            )
        elif running:
            where = "/etc/default/grub" if configured is False else "the next boot's grub.cfg entry"
            findings.append(
                Finding(
                    area=Area.BOOT,
                    severity=Severity.WARN,
                    message=f"{shown} is active now but missing from {where}: a reboot would drop it",
                    fix=add,
                )
            )
        else:
            pending = configured or at_next
            findings.append(
                Finding(
                    area=Area.BOOT,
                    severity=Severity.WARN,
                    message=f"{shown} is not on the running command line"
                    + (" (configured: takes effect at the next reboot)" if pending else ""),
                    fix="reboot" if pending else add + ", reboot",
                )
            )
    return findings


def _next_boot_args(state: BootState) -> tuple[str, ...] | None:
    if state.menu is None:
        return None
    path = resolve(state.menu, effective_spec(state.cfg_default, state.grubenv))
    return path[-1].args if path else None


def _kernel_findings(state: BootState) -> list[Finding]:
    module = state.module
    if module is None:
        return []
    findings: list[Finding] = []
    running = state.running_kernel
    if running and running in state.installed and running not in state.with_module:
        findings.append(
            Finding(
                area=Area.BOOT,
                severity=Severity.WARN,
                message=f"the running kernel {running} has no {module} module under /lib/modules/{running}",
                why=NO_GPU,
            )
        )
    without = [k for k in state.installed if k not in state.with_module]
    if without:
        findings.append(
            Finding(
                area=Area.BOOT,
                severity=Severity.INFO,
                message=f"installed kernels without {module}: {', '.join(without)}",
                why=NO_GPU,
            )
        )
    if state.menu is None:
        findings.append(
            Finding(
                area=Area.BOOT,
                severity=Severity.WARN,
                message="no /boot/grub/grub.cfg: cannot tell which kernel the next boot uses",
                fix="check the boot loader by hand",
            )
        )
        return findings
    choices = [("GRUB_DEFAULT in /etc/default/grub (after update-grub)", state.grub_default)]
    if state.cfg_default is not None and effective_spec(state.cfg_default, state.grubenv) != effective_spec(
        state.grub_default, state.grubenv
    ):
        choices.insert(0, ("grub.cfg `set default` (next boot)", state.cfg_default))
        findings.append(
            Finding(
                area=Area.BOOT,
                severity=Severity.WARN,
                message=(
                    f"grub.cfg boots {state.cfg_default!r} but /etc/default/grub says "
                    f"GRUB_DEFAULT={state.grub_default!r}: grub.cfg is stale"
                ),
                fix="run update-grub after checking GRUB_DEFAULT",
            )
        )
    if state.grubenv.get("next_entry"):
        choices.insert(0, ("grubenv next_entry (one-shot, next boot)", state.grubenv["next_entry"]))
    for source, spec in choices:
        findings.extend(_check_default(state, source, spec, module))
    return findings


def _check_default(state: BootState, source: str, spec: str | None, module: str) -> list[Finding]:
    assert state.menu is not None
    wanted = effective_spec(spec, state.grubenv)
    path = resolve(state.menu, wanted)
    fallback = ""
    if path is None:
        fallback = f" — {wanted!r} matches no menu entry, so GRUB falls back to entry 0"
        path = resolve(state.menu, "0")
    if not path:
        return [
            Finding(
                area=Area.BOOT, severity=Severity.WARN, message=f"grub.cfg has no menu entries ({source})"
            )
        ]
    entry = path[-1]
    kernel = entry.kernel or "an unknown kernel"
    label = f"{source}: {spec or '0'!r} → {entry.title!r}{fallback}"
    if entry.kernel is not None and entry.kernel in state.with_module:
        findings = [
            Finding(
                area=Area.BOOT, severity=Severity.OK, message=f"{label} boots {kernel}, which has {module}"
            )
        ]
        stable = stable_spec(path)
        if any(part.strip().isdigit() for part in wanted.split(">")) and stable:
            findings.append(
                Finding(
                    area=Area.BOOT,
                    severity=Severity.INFO,
                    message=(
                        f"GRUB_DEFAULT pins by menu position ({wanted}); "
                        "installing or removing a kernel shifts it"
                    ),
                    fix=f'pin by id instead: GRUB_DEFAULT="{stable}", then update-grub',
                )
            )
        return findings
    good = sorted(state.with_module, reverse=True)
    target = next((p for k in good if (p := find_kernel_entry(state.menu, k))), None)
    fix = "install the driver for that kernel, or pin GRUB to a kernel that has it"
    if target is not None:
        by_id = stable_spec(target)
        fix = (
            f'pin GRUB_DEFAULT="{position_spec(state.menu, target)}"'
            + (f' (or by id: "{by_id}")' if by_id else "")
            + f" to boot {target[-1].kernel}, then update-grub"
        )
    running = state.running_kernel
    also = f" (the running {running} has it)" if running in state.with_module else ""
    return [
        Finding(
            area=Area.BOOT,
            severity=Severity.WARN,
            message=(
                f"{label} boots {kernel}, which has no {module} module under /lib/modules/{kernel}{also}: "
                "a reboot would leave the host with no GPU"
            ),
            why=NO_GPU,
            fix=fix,
        )
    ]
