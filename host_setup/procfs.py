"""Small parsers for the /proc files host_setup reads: swaps, mounts, the kernel command line.

The text formats are the kernel's: fields separated by whitespace, with spaces inside paths
escaped as octal (`\\040`), which is why paths are unescaped here.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath

# mkswap keeps one page for its header; /proc/swaps reports the size without it. Counting it back
# makes a 4 GiB /swap.img count as 4 GiB (what the operator allocated), not 4 GiB − 4 KiB.
SWAP_HEADER_BYTES = 4096

_OCTAL = re.compile(r"\\([0-7]{3})")


def unescape(field: str) -> str:
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


@dataclass(frozen=True)
class SwapArea:
    host_path: str
    kind: str  # "file" | "partition"
    size_bytes: int  # including the header page
    used_bytes: int


def parse_swaps(text: str | None) -> tuple[SwapArea, ...]:
    areas: list[SwapArea] = []
    for line in (text or "").splitlines()[1:]:
        fields = line.split()
        if len(fields) < 4:
            continue
        name, kind, size_kib, used_kib = unescape(fields[0]), fields[1], fields[2], fields[3]
        if not (size_kib.isdigit() and used_kib.isdigit()):
            continue
        areas.append(SwapArea(name, kind, int(size_kib) * 1024 + SWAP_HEADER_BYTES, int(used_kib) * 1024))
    return tuple(areas)


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
