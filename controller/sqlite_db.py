"""One SQLite connection shared by threads behind a lock: the base of the launch store
(controller/store.py) and the evaluation store (controller/evaluation/store.py).

Both open the same file (`Paths.db`) through connections of their own, so they must open it the same
way: WAL (readers never wait for the writer), synchronous=NORMAL (WAL's setting that cannot corrupt;
a power cut may lose the last transaction), foreign keys enforced, and a 30 s busy timeout, so one
connection's `BEGIN IMMEDIATE` waits for the other's write instead of failing with "database is
locked" (the launch store used to keep sqlite3's 5 s default while the evaluation store waited 30 s).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

BUSY_TIMEOUT_S = 30.0
PRAGMAS = ("PRAGMA journal_mode=WAL", "PRAGMA synchronous=NORMAL", "PRAGMA foreign_keys=ON")


class SqliteDb:
    """Thread-safe (one connection behind a lock); `isolation_level=None` so that `_tx` owns the
    transactions: each is `BEGIN IMMEDIATE` (the write lock at once: no upgrade deadlock), all or nothing."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None,
                                   timeout=BUSY_TIMEOUT_S)
        self._db.row_factory = sqlite3.Row
        self._lock = threading.Lock()
        with self._lock:
            for pragma in PRAGMAS:
                self._db.execute(pragma)
        # The file this connection has open (the pragmas created it): `file_problem` compares the path
        # against it, since SQLite goes on writing to a file deleted or replaced under it.
        opened = os.stat(path)
        self._opened = (opened.st_dev, opened.st_ino)

    def file_problem(self) -> str | None:
        """Why the path no longer names the file this connection writes, or None. One stat: cheap
        enough for every supervision step and every liveness probe. A deleted or replaced database
        file is written on unlinked, and everything since the last open is lost at the next start."""
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            return (f"the database {self.path} was deleted while open: writes go to an unlinked file and "
                    "are lost at the next restart")
        except OSError as exc:
            return f"the database {self.path} cannot be checked: {exc}"
        if (now.st_dev, now.st_ino) != self._opened:
            return (f"the database {self.path} was replaced by another file while open: writes go to the "
                    "old, unlinked file and are lost at the next restart")
        return None

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
