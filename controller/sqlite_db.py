"""The appliance's one SQLite discipline, for every store: the launch store (controller/store.py) and
the evaluation store (controller/evaluation/store.py), which share `Paths.db`, and the gateway's key
store and usage store (controller/gateway/keystore.py, usage/store.py), which each have a file of
their own.

- Schema changes are numbered migrations (`Schema`): `PRAGMA user_version` counts the migrations a
  file has had; `migrate` applies the rest, each in its own transaction, and refuses a file newer than
  the code (`SchemaTooNew`). Migration N is never edited once shipped: a change is migration N+1, and
  tests/unit/test_store_upgrades.py opens a file of every schema shipped (tests/fixtures/stores/).
- `SqliteDb`: one long-lived connection behind a lock, for a store that lives in one process.
- `prepare_file` / `connect_file`: a connection per call, for a file shared between processes (the
  CLI, the controller's API, the gateway), created 0600 before SQLite ever touches it.

A leaf of the standard library only: the gateway is its own process and imports nothing else of the
controller (the import-linter contracts in pyproject.toml allow it this one module, and
tests/unit/test_sqlite_db.py holds that it stays standard-library-only).

Both launch-file stores open the same file (`Paths.db`) through connections of their own, so they must
open it the same way: WAL (readers never wait for the writer), synchronous=NORMAL (WAL's setting that
cannot corrupt; a power cut may lose the last transaction), foreign keys enforced, and a 30 s busy
timeout, so one connection's `BEGIN IMMEDIATE` waits for the other's write instead of failing with
"database is locked" (the launch store used to keep sqlite3's 5 s default while the evaluation store
waited 30 s).
"""

from __future__ import annotations

import os
import sqlite3
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

BUSY_TIMEOUT_S = 30.0
PRAGMAS = ("PRAGMA journal_mode=WAL", "PRAGMA synchronous=NORMAL", "PRAGMA foreign_keys=ON")


class SchemaTooNew(Exception):
    """The file was written by newer code (more migrations than this code knows): never opened, since
    this code would misread or damage what it does not know."""


@dataclass(frozen=True)
class Schema:
    """A store's schema history. `migrations[i]` takes a file from version i to i+1 (statements run one
    by one in one transaction: executescript would commit half-way).

    `unversioned`: for a store that shipped before it counted its schema (its files say user_version
    0 whatever they hold), the version such a file is at, read once from its tables; the file is
    then stamped with it and never probed again. None: user_version 0 means an empty file.
    """

    name: str  # for messages: "launch store", "key store", ...
    migrations: tuple[tuple[str, ...], ...]
    unversioned: Callable[[sqlite3.Connection], int] | None = None

    @property
    def version(self) -> int:
        return len(self.migrations)


def user_version(db: sqlite3.Connection) -> int:
    return int(db.execute("PRAGMA user_version").fetchone()[0])


def check_version(db: sqlite3.Connection, schema: Schema, where: object = "") -> int:
    """The file's version (`SchemaTooNew` if this code does not know it): for a reader that does not
    migrate."""
    current = user_version(db)
    if current > schema.version:
        at = f" {where}" if where else ""
        raise SchemaTooNew(
            f"the {schema.name}{at} has schema version {current}, newer than this code knows "
            f"({schema.version}): it was written by a newer appliance; run that version, or restore a "
            "backup made by this one"
        )
    return current


def migrate(db: sqlite3.Connection, schema: Schema, upto: int | None = None, where: object = "") -> int:
    """Apply the migrations the file has not had, each in its own transaction, and return its version.

    `db` must be in autocommit mode (isolation_level=None): the transactions are explicit here. Each one
    reads the version again under the write lock (`BEGIN IMMEDIATE`), so two processes opening the
    same old file at once apply each migration once; a failed migration leaves the file as it was.
    """
    target = schema.version if upto is None else upto
    current = check_version(db, schema, where)
    if current >= target and not (current == 0 and schema.unversioned is not None):
        return current
    while True:
        db.execute("BEGIN IMMEDIATE")
        try:
            current = check_version(db, schema, where)
            if current == 0 and schema.unversioned is not None:
                current = schema.unversioned(db)  # a file from before the store counted: stamped once
            if current < target:
                for statement in schema.migrations[current]:
                    db.execute(statement)
                current += 1
            db.execute(f"PRAGMA user_version = {current}")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        if current >= target:
            return current


# --------------------------------------------------------------------------------------------
# A file shared between processes: a connection per call


def file_uri(path: Path, mode: str) -> str:
    """`mode=rw` never creates the file (a deleted store stays an error, not a new empty file that a
    reader would take for "the same store, nothing changed"); `mode=ro` never writes."""
    return "file:" + urllib.parse.quote(str(path.absolute())) + f"?mode={mode}"


def connect_file(path: Path, mode: str, timeout: float, autocommit: bool = False) -> sqlite3.Connection:
    return sqlite3.connect(file_uri(path, mode), timeout=timeout, uri=True,
                           isolation_level=None if autocommit else "DEFERRED")


def create_private(path: Path) -> None:
    """Create the file with mode 0600 if it is missing (`O_CREAT | O_EXCL` with the mode, not chmod
    afterwards: never readable by others, not even for a moment; SQLite creates its -wal/-shm files
    with the main file's mode)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
    except FileExistsError:
        pass


def prepare_file(path: Path, schema: Schema, timeout: float) -> int:
    """Create the file (0600) if missing, turn on WAL (a reader never waits for a writer, nor blocks
    it; the mode is kept in the file) and migrate it; returns its version. `sqlite3.Error` and
    `SchemaTooNew` go to the caller, who names its store's error."""
    create_private(path)
    conn = connect_file(path, "rw", timeout, autocommit=True)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        return migrate(conn, schema, where=path)
    finally:
        conn.close()


# --------------------------------------------------------------------------------------------
# A store in one process: one connection behind a lock


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
