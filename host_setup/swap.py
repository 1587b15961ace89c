"""Swap: bring the host's total swap up to a recipe's target with one extra swapfile of our own.

Why (DOMAIN §3, S14c): swap only bridges the start-up transient of the TP=4 graph recipe (7.4–8.8 GB
swapped out at start, ~0.4 GB after), and on the reference host the existing `/swap.img` (4 GiB) is
not enough: without the extra 4 GiB swapfile the best margin was 1.78 GiB with swap 100 % full;
with it recipe C met its bar (min MemAvailable 2.35 GiB, swap peak 5.40 GiB).

Rules: existing swap is never touched (not resized, not swapped off); the appliance owns exactly
one file (`<swap dir>/appliance.swap`), recorded in the journal, and only that file is ever
removed. A target below the swap the host already has is left alone and said so.
"""

from __future__ import annotations

import array
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

from appliance.observe.procfs import SwapArea, parse_swaps
from host_setup.commands import CommandError, HostContext
from host_setup.files import atomic_write
from host_setup.journal import Journal
from host_setup.model import Area, Change, Finding, HostSetupError, Severity, SwapfileAction, SwapfileUndo
from host_setup.procfs import mount_of, parse_mounts
from host_setup.root import HostRoot, read_text

GIB = 1024**3
MIB = 1024**2
# mkswap keeps one page for its header and /proc/swaps reports the size without it; counting it
# back makes the 4 GiB /swap.img count as the 4 GiB the operator allocated.
SWAP_HEADER_BYTES = 4096
TOLERANCE = MIB  # sizes within a MiB of the target count as met (header pages, rounding)
KEEP_FREE = GIB  # never fill the filesystem: a full root fs breaks logging, dpkg and the journal
CHANGE_ID = "swap.swapfile"
FSTAB_MARK = (
    "# appliance: swapfile added by `appliance host apply`; `appliance host revert --only swap` removes it"
)

WHY = (
    "DOMAIN §3/S14c: TP=4 graph start-up swaps out 7.4–8.8 GB; without an extra 4 GiB swapfile "
    "(8 GiB total) the best margin was 1.78 GiB with swap 100% full"
)

# Filesystems known to hold a swapfile (the kernel maps its blocks once, at swapon).
SWAPFILE_OK = frozenset({"ext2", "ext3", "ext4", "xfs", "f2fs"})
SWAPFILE_REFUSED = {
    "tmpfs": "memory-backed: swap there would use the RAM it is meant to free",
    "ramfs": "memory-backed: swap there would use the RAM it is meant to free",
    "overlay": "overlayfs (a container layer) has no block mapping for swapon",
    "zfs": "ZFS does not support swapfiles",
    "nfs": "swap over NFS needs a special setup",
    "nfs4": "swap over NFS needs a special setup",
    "cifs": "a network filesystem cannot hold swap",
    "squashfs": "read-only",
    "vfat": "no Unix permissions (a swapfile must be 0600)",
}
_FS_IOC_GETFLAGS = 0x80086601
_FS_NOCOW_FL = 0x00800000


@dataclass(frozen=True)
class SwapState:
    areas: tuple[SwapArea, ...]  # active swap, from /proc/swaps
    ours_host_path: str
    ours_size: int | None  # our file's size on disk, None when absent
    recorded_path: str | None  # the swapfile the journal says the appliance created, if any
    ours_formatted: bool
    fstab_has_ours: bool
    fs_type: str | None
    mount_point: str | None
    dir_nocow: bool | None  # btrfs only: new files in the swap dir are NOCOW
    free_bytes: int

    @property
    def ours_recorded(self) -> bool:
        return self.recorded_path == self.ours_host_path

    @property
    def ours_active(self) -> SwapArea | None:
        return next((a for a in self.areas if a.filename == self.ours_host_path), None)

    @property
    def others_bytes(self) -> int:
        return sum(_size(a) for a in self.areas if a.filename != self.ours_host_path)

    @property
    def total_bytes(self) -> int:
        return sum(_size(a) for a in self.areas)


def fstab_line(host_path: str) -> str:
    return f"{host_path} none swap sw 0 0"


def recorded_path(journal: Journal) -> str | None:
    entry = journal.get(CHANGE_ID)
    return entry.undo.host_path if entry is not None and isinstance(entry.undo, SwapfileUndo) else None


def read_swap_state(root: HostRoot, recorded: str | None) -> SwapState:
    """`recorded`: the swapfile path the journal records (see `recorded_path`)."""
    host_path = root.swapfile_host_path
    real = root.path(host_path)
    mounts = parse_mounts(read_text(root.proc / "mounts"))
    mount = mount_of(mounts, root.swap_dir)
    fstab = read_text(root.etc / "fstab") or ""
    size = real.stat().st_size if real.exists() else None
    return SwapState(
        areas=tuple(parse_swaps(read_text(root.proc / "swaps") or "")),
        ours_host_path=host_path,
        ours_size=size,
        recorded_path=recorded,
        ours_formatted=size is not None and _has_swap_signature(real),
        fstab_has_ours=fstab_line(host_path) in (line.strip() for line in fstab.splitlines()),
        fs_type=mount.fs_type if mount else None,
        mount_point=mount.mount_point if mount else None,
        dir_nocow=_nocow(_existing_ancestor(root.path(root.swap_dir)))
        if mount and mount.fs_type == "btrfs"
        else None,
        free_bytes=_free_bytes(_existing_ancestor(root.path(root.swap_dir))),
    )


def plan_swap(state: SwapState, target_gib: float | None) -> tuple[list[Change], list[Finding]]:
    """Pure: what it takes to bring total swap to `target_gib`."""
    if target_gib is None:
        return [], []
    if state.recorded_path is not None and not state.ours_recorded:
        # One swapfile per host: a second one elsewhere would be lost to revert (the journal keys it once).
        return [], [
            Finding(
                area=Area.SWAP,
                severity=Severity.ERROR,
                message=(
                    f"the appliance's swapfile is {state.recorded_path}, "
                    f"not {state.ours_host_path} (the --swap-dir given)"
                ),
                fix="use that --swap-dir, or `appliance host revert --only swap --yes` first",
            )
        ]
    target = int(target_gib * GIB)
    needed = target - state.others_bytes
    have = _describe(state)
    if needed <= TOLERANCE:
        findings = [_above_target(state, target)]
        if state.ours_recorded and state.ours_size is not None:
            findings.append(
                Finding(
                    area=Area.SWAP,
                    severity=Severity.INFO,
                    message=f"the appliance swapfile {state.ours_host_path} is not needed for this target",
                    fix="`appliance host revert --only swap --yes` removes it",
                )
            )
        return [], findings
    size = -(-needed // MIB) * MIB  # whole MiB, rounded up
    path = state.ours_host_path
    if state.ours_size is not None and not state.ours_recorded:
        return [], [
            Finding(
                area=Area.SWAP,
                severity=Severity.ERROR,
                message=f"{path} exists but the appliance did not create it (it is not in the journal)",
                fix="move that file away, or choose another --swap-dir",
            )
        ]
    big_enough = state.ours_size is not None and state.ours_size + TOLERANCE >= size
    if big_enough and state.ours_active and state.fstab_has_ours:
        return [], [
            Finding(
                area=Area.SWAP,
                severity=Severity.OK,
                message=f"swap {have} meets the target {_gib(target)}",
            )
        ]
    problem = _filesystem_problem(state)
    if problem:
        return [], [problem]
    grow_by = 0 if big_enough else size - (state.ours_size or 0)
    if grow_by and state.free_bytes < grow_by + KEEP_FREE:
        return [], [
            Finding(
                area=Area.SWAP,
                severity=Severity.ERROR,
                message=(
                    f"a {_gib(size)} swapfile on {state.mount_point} needs {_gib(grow_by + KEEP_FREE)} free "
                    f"(the file + {_gib(KEEP_FREE)} kept free) but only {_gib(state.free_bytes)} is free"
                ),
                fix="free space there, or choose another --swap-dir",
            )
        ]
    steps: list[str] = []
    if state.ours_size is None:
        steps.append(f"create {path} ({_gib(size)}, mode 0600, mkswap)")
    elif not big_enough:
        steps.append(f"grow {path} {_gib(state.ours_size)} → {_gib(size)}")
    if not big_enough or not state.ours_active:
        steps.append("swapon")
    if not state.fstab_has_ours:
        steps.append("add an /etc/fstab entry")
    after_total = state.others_bytes + max(size, state.ours_size or 0)
    change = Change(
        id=CHANGE_ID,
        area=Area.SWAP,
        what=", ".join(steps),
        before=f"swap {have}",
        after=f"swap {_gib(after_total)} (target {_gib(target)})",
        why=WHY,
        action=SwapfileAction(
            host_path=path, size_bytes=max(size, state.ours_size or 0), fstab_line=fstab_line(path)
        ),
    )
    return [change], []


# --- executor ----------------------------------------------------------------------------------


def capture_swapfile(action: SwapfileAction, ctx: HostContext) -> SwapfileUndo:
    return SwapfileUndo(host_path=action.host_path, fstab_line=action.fstab_line)


def apply_swapfile(action: SwapfileAction, ctx: HostContext) -> None:
    """Idempotent: each step checks whether it is already done."""
    real = ctx.root.path(action.host_path)
    active = _is_active(ctx.root, action.host_path)
    if real.exists() and real.stat().st_size + TOLERANCE < action.size_bytes:
        if active:
            ctx.commands.run(["swapoff", str(real)])
            active = False
        real.unlink()
    if not real.exists():
        real.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        _allocate(real, action.size_bytes, ctx)
    os.chmod(real, 0o600)  # mkswap and swapon warn about (and distros refuse) readable swapfiles
    if not active:
        if not _has_swap_signature(real):
            ctx.commands.run(["mkswap", str(real)])
        ctx.commands.run(["swapon", str(real)])
    _ensure_fstab(ctx.root, action.fstab_line)


def revert_swapfile(undo: SwapfileUndo, ctx: HostContext) -> None:
    real = ctx.root.path(undo.host_path)
    if _is_active(ctx.root, undo.host_path):
        try:
            ctx.commands.run(["swapoff", str(real)])
        except CommandError as exc:
            raise HostSetupError(
                f"{exc}; swapoff must move the pages in {undo.host_path} back into RAM: "
                "stop the engine (or free memory) and run revert again"
            ) from exc
    fstab = ctx.root.etc / "fstab"
    text = read_text(fstab)
    if text is not None:
        drop = {undo.fstab_line, FSTAB_MARK}
        kept = [line for line in text.splitlines(keepends=True) if line.strip() not in drop]
        if len(kept) != len(text.splitlines()):
            atomic_write(fstab, "".join(kept))
    real.unlink(missing_ok=True)


# --- helpers -----------------------------------------------------------------------------------


def _allocate(real: Path, size: int, ctx: HostContext) -> None:
    # Created 0600 from the first byte: a swapfile holds other processes' memory.
    os.close(os.open(real, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    try:
        ctx.commands.run(["fallocate", "-l", str(size), str(real)])
    except CommandError:
        # Some filesystems cannot preallocate; dd writes every block (swapon rejects files with holes).
        ctx.commands.run(
            ["dd", "if=/dev/zero", f"of={real}", "bs=1M", f"count={-(-size // MIB)}", "status=none"]
        )


def _ensure_fstab(root: HostRoot, line: str) -> None:
    fstab = root.etc / "fstab"
    text = read_text(fstab) or ""
    if line in (existing.strip() for existing in text.splitlines()):
        return
    if text and not text.endswith("\n"):
        text += "\n"
    atomic_write(fstab, text + FSTAB_MARK + "\n" + line + "\n")


def _is_active(root: HostRoot, host_path: str) -> bool:
    return any(a.filename == host_path for a in parse_swaps(read_text(root.proc / "swaps") or ""))


def _has_swap_signature(real: Path) -> bool:
    page = os.sysconf("SC_PAGE_SIZE")
    try:
        with real.open("rb") as f:
            f.seek(page - 10)
            return f.read(10) in (b"SWAPSPACE2", b"SWAP-SPACE")
    except OSError:
        return False


def _existing_ancestor(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _nocow(path: Path) -> bool | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        buf = array.array("l", [0])
        fcntl.ioctl(fd, _FS_IOC_GETFLAGS, buf)
        return bool(buf[0] & _FS_NOCOW_FL)
    except OSError:
        return None
    finally:
        os.close(fd)


def _filesystem_problem(state: SwapState) -> Finding | None:
    fs = state.fs_type
    where = f"{state.mount_point} ({fs})" if fs else "an unknown filesystem"
    if fs in SWAPFILE_OK:
        return None
    if fs == "btrfs" and state.dir_nocow:
        return None  # btrfs holds a swapfile when it is NOCOW (and the subvolume is not snapshotted)
    if fs == "btrfs":
        reason = "btrfs needs a NOCOW file (`chattr +C` on the directory, or `btrfs filesystem mkswapfile`)"
    elif fs is None:
        reason = "the swap dir is not under any mount listed in /proc/mounts"
    else:
        reason = SWAPFILE_REFUSED.get(fs, "not a filesystem known to hold a swapfile (ext4, xfs)")
    return Finding(
        area=Area.SWAP,
        severity=Severity.ERROR,
        message=f"cannot put a swapfile on {where}: {reason}",
        fix="choose a --swap-dir on ext4 or xfs",
    )


def _above_target(state: SwapState, target: int) -> Finding:
    if state.others_bytes > target + TOLERANCE:
        return Finding(
            area=Area.SWAP,
            severity=Severity.INFO,
            message=(
                f"swap is already {_gib(state.others_bytes)}, above the recipe's target {_gib(target)}: "
                "left as is (the appliance never shrinks or touches swap it did not add)"
            ),
        )
    return Finding(
        area=Area.SWAP,
        severity=Severity.OK,
        message=f"swap {_describe(state)} meets the target {_gib(target)}",
    )


def _describe(state: SwapState) -> str:
    if not state.areas:
        return "0 GiB (no swap active)"
    parts = ", ".join(f"{a.filename} {_gib(_size(a))}" for a in state.areas)
    return f"{_gib(state.total_bytes)} ({parts})"


def _size(area: SwapArea) -> int:
    return area.size_bytes + SWAP_HEADER_BYTES


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"
