"""GRUB: which kernel the next boot lands on, and with which command line. Pure parsers.

DOMAIN §1: the reference host has GRUB pinned (`GRUB_DEFAULT="1>2"`: entry 2 of submenu 1) to
5.15.0-191 because the installed 5.15.0-194 has no `hydcu` module — rebooting into it leaves the
host with no GPU. Pins by position are fragile (installing or removing a kernel renumbers the
submenu), which is why the resolved entry's stable id is reported too.

Sources:
- `/etc/default/grub` (+ `/etc/default/grub.d/*.cfg`, sourced after it): shell assignments,
  `GRUB_DEFAULT`, `GRUB_CMDLINE_LINUX`, `GRUB_CMDLINE_LINUX_DEFAULT`; what `update-grub` will use;
- `/boot/grub/grub.cfg`: the generated menu (`menuentry`/`submenu` blocks, `linux` lines) and its
  `set default=`: what the next boot uses today;
- `/boot/grub/grubenv`: `saved_entry` (for `GRUB_DEFAULT=saved`) and a one-shot `next_entry`.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field

_ASSIGN = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_VAR = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")


@dataclass(frozen=True)
class MenuEntry:
    title: str
    id: str | None
    kernel_image: str | None  # the `linux` line's image path, e.g. /boot/vmlinuz-5.15.0-191-generic
    args: tuple[str, ...] = ()  # the `linux` line's command line
    children: tuple[MenuEntry, ...] = field(default=())
    is_submenu: bool = False

    @property
    def kernel(self) -> str | None:
        """Kernel release from the image name (`vmlinuz-5.15.0-191-generic` → `5.15.0-191-generic`)."""
        if not self.kernel_image:
            return None
        name = self.kernel_image.rsplit("/", 1)[-1]
        for prefix in ("vmlinuz-", "vmlinux-", "bzImage-", "kernel-"):
            if name.startswith(prefix):
                return name.removeprefix(prefix)
        return None


def parse_shell_assignments(texts: Iterable[str | None]) -> dict[str, str]:
    """`NAME=value` lines of /etc/default/grub and its drop-ins, in order, later ones overriding.
    Handles quoting and `$VAR` references to earlier values (`"$GRUB_CMDLINE_LINUX_DEFAULT iommu=pt"`)."""
    values: dict[str, str] = {}
    for text in texts:
        for line in (text or "").splitlines():
            m = _ASSIGN.match(line)
            if not m:
                continue
            name, raw = m.group(1), m.group(2).strip()
            if not raw.startswith("'"):
                raw = _VAR.sub(lambda v: values.get(v.group(1), ""), raw)
            try:
                words = shlex.split(raw, comments=True)
            except ValueError:
                words = [raw.strip("\"'")]
            values[name] = " ".join(words)
    return values


def parse_grubenv(text: str | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in (text or "").splitlines():
        if line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        out[key.strip()] = value.strip()
    return out


def _words(line: str) -> list[str]:
    try:
        return shlex.split(line, comments=True)
    except ValueError:
        return line.split()


def parse_grub_cfg(text: str | None) -> tuple[MenuEntry, ...]:
    """The menu tree of grub.cfg. Other brace blocks (`function … {`) are skipped."""

    @dataclass
    class Open:
        kind: str  # "menuentry" | "submenu" | "other"
        title: str = ""
        id: str | None = None
        image: str | None = None
        args: tuple[str, ...] = ()
        children: list[MenuEntry] = field(default_factory=list)

    top: list[MenuEntry] = []
    stack: list[Open] = []
    for raw in (text or "").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        words = _words(line)
        if not words:
            continue
        if words[0] in ("menuentry", "submenu") and len(words) > 1:
            stack.append(Open(kind=words[0], title=words[1], id=_entry_id(words)))
            continue
        if words[0] == "}" or line == "}":
            if not stack:
                continue
            done = stack.pop()
            if done.kind == "other":
                continue
            entry = MenuEntry(
                title=done.title,
                id=done.id,
                kernel_image=done.image,
                args=done.args,
                children=tuple(done.children),
                is_submenu=done.kind == "submenu",
            )
            parent = next((o for o in reversed(stack) if o.kind != "other"), None)
            (parent.children if parent else top).append(entry)
            continue
        if line.endswith("{"):
            stack.append(Open(kind="other"))
            continue
        current = next((o for o in reversed(stack) if o.kind == "menuentry"), None)
        if current and words[0] in ("linux", "linux16", "linuxefi") and len(words) > 1:
            current.image, current.args = words[1], tuple(words[2:])
    return tuple(top)


def _entry_id(words: list[str]) -> str | None:
    for i, word in enumerate(words[:-1]):
        if word in ("$menuentry_id_option", "--id", "${menuentry_id_option}"):
            return words[i + 1]
    return None


def grub_cfg_default(text: str | None) -> str | None:
    """The `set default=` of grub.cfg that is not the one-shot `next_entry` branch."""
    value: str | None = None
    for line in (text or "").splitlines():
        words = _words(line.strip())
        if len(words) == 2 and words[0] == "set" and words[1].startswith("default="):
            candidate = words[1].removeprefix("default=")
            if "next_entry" not in candidate:
                value = candidate
    return value


def effective_spec(spec: str | None, grubenv: dict[str, str]) -> str:
    """`saved` / `${saved_entry}` → the saved entry; unset → 0 (GRUB's own default)."""
    if spec is None or spec == "":
        return "0"
    if spec == "saved" or "saved_entry" in spec:
        return grubenv.get("saved_entry") or "0"
    return spec


def resolve(menu: tuple[MenuEntry, ...], spec: str) -> tuple[MenuEntry, ...] | None:
    """`1>2`, a title, an id, or a `>`-path of them → the entries on the way (last = the boot entry).
    A submenu as the target boots its first entry. None when nothing matches."""
    level = menu
    path: list[MenuEntry] = []
    for part in spec.split(">"):
        entry = _pick(level, part.strip())
        if entry is None:
            return None
        path.append(entry)
        level = entry.children
    while path and path[-1].is_submenu:
        if not path[-1].children:
            return None
        path.append(path[-1].children[0])
    return tuple(path)


def _pick(level: tuple[MenuEntry, ...], part: str) -> MenuEntry | None:
    if part.isdigit():
        index = int(part)
        return level[index] if index < len(level) else None
    return next((e for e in level if part in (e.title, e.id)), None)


def stable_spec(path: tuple[MenuEntry, ...]) -> str | None:
    """The same choice by ids instead of positions (survives kernels being added or removed)."""
    if not path or any(e.id is None for e in path):
        return None
    return ">".join(e.id for e in path if e.id)


def find_kernel_entry(menu: tuple[MenuEntry, ...], kernel: str) -> tuple[MenuEntry, ...] | None:
    """The first non-recovery entry booting `kernel` (to tell an operator what to pin)."""

    def walk(level: tuple[MenuEntry, ...], prefix: tuple[MenuEntry, ...]) -> tuple[MenuEntry, ...] | None:
        for entry in level:
            if entry.is_submenu:
                found = walk(entry.children, (*prefix, entry))
                if found:
                    return found
            elif entry.kernel == kernel and "recovery" not in entry.title.lower():
                return (*prefix, entry)
        return None

    return walk(menu, ())


def position_spec(menu: tuple[MenuEntry, ...], path: tuple[MenuEntry, ...]) -> str:
    parts: list[str] = []
    level = menu
    for entry in path:
        parts.append(str(level.index(entry)))
        level = entry.children
    return ">".join(parts)
