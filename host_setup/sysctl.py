"""Sysctls a recipe names (vm.swappiness above all): the live value and a persistent file.

Why (S14c, DOMAIN §3): with the same swap, `vm.swappiness` 60→200 raised the memory margin of the
TP=4 graph start-up from 0.29 to 2.71 GiB, with decode unchanged.

The live value is written to `/proc/sys/...` (what `sysctl -w` does) and read back, so a value the
kernel clamps or rejects is an error, not a silent difference. The persistent value goes to
`/etc/sysctl.d/90-appliance.conf`, which the appliance owns. A later file (`99-*.conf`, or
`/etc/sysctl.conf`, which `sysctl --system` reads last) that sets the same key would win at boot;
that is reported, not edited.
"""

from __future__ import annotations

import errno
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from host_setup.commands import HostContext
from host_setup.files import atomic_write
from host_setup.model import Area, Change, Finding, HostSetupError, Severity, SysctlAction, SysctlUndo
from host_setup.root import HostRoot, read_text

CONF_HOST_PATH = "/etc/sysctl.d/90-appliance.conf"
_CONF_HEADER = (
    "# Written by `appliance host apply` from a recipe's host requirements; removed by\n"
    "# `appliance host revert`. Edit the recipe, not this file.\n"
)
_NAME = re.compile(r"^[A-Za-z0-9_-]+([./][A-Za-z0-9_:@+-]+)+$")
_DROPIN_DIRS = (
    "/etc/sysctl.d",
    "/run/sysctl.d",
    "/usr/local/lib/sysctl.d",
    "/usr/lib/sysctl.d",
    "/lib/sysctl.d",
)

WHY = {
    "vm.swappiness": "S14c: vm.swappiness 60→200 raised the memory margin 0.29→2.71 GiB at zero decode cost",
}


@dataclass(frozen=True)
class SysctlValue:
    name: str
    live: str | None  # None: this kernel has no such sysctl
    ours: str | None  # the value in 90-appliance.conf
    later: tuple[tuple[str, str], ...]  # (file, value) read after ours at boot, setting the same key


def normalize_name(name: str) -> str:
    if not _NAME.match(name) or ".." in name:
        raise HostSetupError(f"{name!r} is not a sysctl name (expected dotted form, e.g. vm.swappiness)")
    return name.replace("/", ".")


def normalize_value(value: str | int) -> str:
    return " ".join(str(value).split())


def live_path(root: HostRoot, name: str) -> Path:
    return root.proc / "sys" / Path(*name.split("."))


def parse_conf(text: str | None) -> dict[str, str]:
    """sysctl.d syntax: `key = value`, comments `#`/`;`, a leading `-` means "ignore errors"."""
    out: dict[str, str] = {}
    for raw in (text or "").splitlines():
        line = raw.strip()
        if not line or line[0] in "#;" or "=" not in line:
            continue
        key, value = line.split("=", 1)
        out[key.strip().lstrip("-").replace("/", ".")] = normalize_value(value)
    return out


def read_sysctl_state(root: HostRoot, names: list[str]) -> dict[str, SysctlValue]:
    ours = parse_conf(read_text(root.path(CONF_HOST_PATH)))
    later = _later_files(root)
    state: dict[str, SysctlValue] = {}
    for name in names:
        live = read_text(live_path(root, name))
        state[name] = SysctlValue(
            name=name,
            live=normalize_value(live) if live is not None else None,
            ours=ours.get(name),
            later=tuple((f, conf[name]) for f, conf in later if name in conf),
        )
    return state


def plan_sysctl(
    state: Mapping[str, SysctlValue], wanted: Mapping[str, str]
) -> tuple[list[Change], list[Finding]]:
    """Pure: one change per sysctl whose live value or persistent file differs from the recipe."""
    changes: list[Change] = []
    findings: list[Finding] = []
    for name, raw in wanted.items():
        value = normalize_value(raw)
        current = state[name]
        if current.live is None:
            findings.append(
                Finding(
                    area=Area.SYSCTL,
                    severity=Severity.ERROR,
                    message=f"unknown sysctl {name!r}: this kernel has no /proc/sys/{name.replace('.', '/')}",
                    fix="check the name in the recipe (`sysctl -a | grep …`) or load the module providing it",
                )
            )
            continue
        for path, other in current.later:
            if other != value:
                findings.append(
                    Finding(
                        area=Area.SYSCTL,
                        severity=Severity.WARN,
                        message=(
                            f"{path} sets {name} = {other} and is read after {CONF_HOST_PATH}: "
                            f"after a reboot {name} would be {other}, not {value}"
                        ),
                        fix=f"remove {name} from {path}",
                    )
                )
        if current.live == value and current.ours == value:
            findings.append(Finding(area=Area.SYSCTL, severity=Severity.OK, message=f"{name} = {value}"))
            continue
        persisted = current.ours if current.ours is not None else "not set"
        changes.append(
            Change(
                id=f"sysctl.{name}",
                area=Area.SYSCTL,
                what=f"set {name} live and in {CONF_HOST_PATH}",
                before=f"{name} = {current.live} (in {CONF_HOST_PATH}: {persisted})",
                after=f"{name} = {value}",
                why=WHY.get(name, "named in the recipe's host requirements"),
                action=SysctlAction(name=name, value=value, conf_host_path=CONF_HOST_PATH),
            )
        )
    return changes, findings


# --- executor ----------------------------------------------------------------------------------


def capture_sysctl(action: SysctlAction, ctx: HostContext) -> SysctlUndo:
    live = read_text(live_path(ctx.root, action.name))
    if live is None:
        raise HostSetupError(f"unknown sysctl {action.name!r}: nothing was changed")
    conf = parse_conf(read_text(ctx.root.path(action.conf_host_path)))
    return SysctlUndo(
        name=action.name,
        previous_live=normalize_value(live),
        conf_host_path=action.conf_host_path,
        previous_conf_value=conf.get(action.name),
    )


def apply_sysctl(action: SysctlAction, ctx: HostContext) -> None:
    _write_live(ctx.root, action.name, action.value)
    _set_conf(ctx.root.path(action.conf_host_path), action.name, action.value)


def revert_sysctl(undo: SysctlUndo, ctx: HostContext) -> None:
    if live_path(ctx.root, undo.name).exists():
        _write_live(ctx.root, undo.name, undo.previous_live)
    _set_conf(ctx.root.path(undo.conf_host_path), undo.name, undo.previous_conf_value)


def _write_live(root: HostRoot, name: str, value: str) -> None:
    path = live_path(root, name)
    try:
        path.write_text(value + "\n")
    except OSError as exc:
        hint = " (vm.swappiness above 100 needs Linux ≥ 5.8)" if name == "vm.swappiness" else ""
        if exc.errno == errno.EINVAL:
            raise HostSetupError(f"the kernel rejected {name} = {value}{hint}") from exc
        raise HostSetupError(f"cannot write {path}: {exc.strerror}") from exc
    got = normalize_value(path.read_text())
    if got != value:
        raise HostSetupError(
            f"wrote {name} = {value} but the kernel reports {got}{' — clamped?' if got else ''}"
        )


def _set_conf(path: Path, name: str, value: str | None) -> None:
    """Set (or with None remove) one key in our conf file, keeping the others; no keys → no file."""
    settings = parse_conf(read_text(path))
    if value is None:
        settings.pop(name, None)
    else:
        settings[name] = value
    if not settings:
        path.unlink(missing_ok=True)
        return
    atomic_write(path, _CONF_HEADER + "".join(f"{k} = {v}\n" for k, v in sorted(settings.items())))


def _later_files(root: HostRoot) -> list[tuple[str, dict[str, str]]]:
    """Drop-ins that sort after ours (same name in an earlier dir shadows a later one), then
    /etc/sysctl.conf, which `sysctl --system` reads last."""
    ours = Path(CONF_HOST_PATH).name
    seen: dict[str, str] = {}
    for directory in _DROPIN_DIRS:
        real = root.path(directory)
        if real.is_dir():
            for f in real.glob("*.conf"):
                seen.setdefault(f.name, f"{directory}/{f.name}")
    out: list[tuple[str, dict[str, str]]] = []
    read: set[Path] = set()
    hosts = [host for name, host in sorted(seen.items()) if name > ours] + ["/etc/sysctl.conf"]
    for host in hosts:
        real = root.path(host).resolve()  # Debian: 99-sysctl.conf is a symlink to ../sysctl.conf
        if real not in read:
            read.add(real)
            out.append((host, parse_conf(read_text(real))))
    return out
