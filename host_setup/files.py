"""Atomic file writes for host configuration and the change journal.

A half-written `/etc/fstab` or `daemon.json` is worse than none (a host that does not boot, a
dockerd that does not start), so every write goes to a temporary file in the same directory, is
fsynced, then renamed over the target. The target's mode and owner are kept when it existed.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def atomic_write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        st: os.stat_result | None = path.stat()
    except FileNotFoundError:
        st = None
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, st.st_mode & 0o7777 if st else mode)
        if st is not None:
            with contextlib.suppress(PermissionError):
                os.chown(tmp, st.st_uid, st.st_gid)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def restore_file(path: Path, previous_content: str | None) -> None:
    """Put a file back as it was: the previous text, or no file at all."""
    if previous_content is None:
        path.unlink(missing_ok=True)
    else:
        atomic_write(path, previous_content)
