"""Small parsers for the /proc files host_setup reads: mounts and the kernel command line
(`/proc/swaps` is parsed by `appliance.observe.procfs`).

The text formats are the kernel's: fields separated by whitespace, with spaces inside paths
escaped as octal (`\\040`), which is why paths are unescaped here.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath

_OCTAL = re.compile(r"\\([0-7]{3})")


def unescape(field: str) -> str:
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


@dataclass(frozen=True)
class Mount:
    device: str
    mount_point: str
    fs_type: str
    options: tuple[str, ...]


def parse_mounts(text: str | None) -> tuple[Mount, ...]:
    mounts: list[Mount] = []
    for line in (text or "").splitlines():
        fields = line.split()
        if len(fields) >= 4:
            mounts.append(
                Mount(unescape(fields[0]), unescape(fields[1]), fields[2], tuple(fields[3].split(",")))
            )
    return tuple(mounts)


def mount_of(mounts: tuple[Mount, ...], host_path: str) -> Mount | None:
    """The mount a path lives on: the longest mount point that contains it (the last one wins on ties,
    as later mounts hide earlier ones)."""
    target = PurePosixPath(host_path)
    best: Mount | None = None
    for m in mounts:
        point = PurePosixPath(m.mount_point)
        if (target == point or point in target.parents) and (
            best is None or len(point.parts) >= len(PurePosixPath(best.mount_point).parts)
        ):
            best = m
    return best


def cmdline_tokens(text: str | None) -> tuple[str, ...]:
    """Kernel command line → tokens (quotes as the kernel parses them: `a="b c"` is one token)."""
    if not text:
        return ()
    try:
        return tuple(shlex.split(text.strip()))
    except ValueError:
        return tuple(text.split())
