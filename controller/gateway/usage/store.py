"""Usage per key and model per hour, and the token-quota levels, in the appliance's SQLite (``usage.sqlite3``
beside the key store).

Its own file, not a table in the key store: the gateway watches the key file's size and mtime to
notice a revoke (``auth.KeyCache``), and usage written every few seconds would make it re-read the
keys every second. Growth is bounded: one row per key per hour, rows older than the retention are
deleted by the gateway's writer; created 0600 like the key store (key ids and traffic are the
operator's business). The schema is numbered migrations (``SCHEMA``, controller/sqlite_db.py): the
writer upgrades an old file on first write; a file written by a newer appliance is refused.

The gateway writes (``usage.UsageLedger`` hands over batches, in a worker thread, off the request
path); the CLI (``appliance usage``) and the controller's ``GET /usage`` read.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from controller.gateway.usage.quota import BucketState
from controller.sqlite_db import Schema, SchemaTooNew, check_version, connect_file, prepare_file

HOUR_S = 3600

# The schema's history (controller/sqlite_db.py: numbered migrations, never edited once shipped).
# v1: the first usage store: hourly sums per key, and the token-quota levels kept across restarts.
_V1 = (
    """CREATE TABLE IF NOT EXISTS usage_hourly (
    key_id TEXT NOT NULL,
    hour INTEGER NOT NULL,
    requests INTEGER NOT NULL DEFAULT 0,
    errors INTEGER NOT NULL DEFAULT 0,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    duration_s REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (key_id, hour)
)""",
    "CREATE INDEX IF NOT EXISTS usage_hour ON usage_hourly (hour)",
    """CREATE TABLE IF NOT EXISTS quota_state (
    key_id TEXT NOT NULL,
    window TEXT NOT NULL,
    level REAL NOT NULL,
    stamp REAL NOT NULL,
    PRIMARY KEY (key_id, window)
)""",
)

# v2: usage per key AND model (the served name of the engine that took the request, "unknown" for a
# request none took). SQLite cannot change a primary key in place: the table is rebuilt; rows written
# before keep the model "" (not known then).
_V2 = (
    """CREATE TABLE usage_hourly_v2 (
    key_id TEXT NOT NULL,
    model TEXT NOT NULL DEFAULT '',
    hour INTEGER NOT NULL,
    requests INTEGER NOT NULL DEFAULT 0,
    errors INTEGER NOT NULL DEFAULT 0,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    duration_s REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (key_id, model, hour)
)""",
    "INSERT INTO usage_hourly_v2 (key_id, model, hour, requests, errors, prompt_tokens, completion_tokens,"
    " duration_s) SELECT key_id, '', hour, requests, errors, prompt_tokens, completion_tokens, duration_s"
    " FROM usage_hourly",
    "DROP TABLE usage_hourly",
    "ALTER TABLE usage_hourly_v2 RENAME TO usage_hourly",
    "CREATE INDEX IF NOT EXISTS usage_hour ON usage_hourly (hour)",
)


def _unversioned(conn: sqlite3.Connection) -> int:
    """The usage store shipped v1 before it counted its schema (user_version 0): such a file has its
    tables; it is stamped 1 on first open by a writer."""
    return 1 if _has_table(conn, "usage_hourly") else 0


SCHEMA = Schema("usage store", (_V1, _V2), unversioned=_unversioned)

# Where the sums go: (key id, hour) as before models were recorded (model ""), or (key id, model, hour).
UsageSlot = tuple[str, int] | tuple[str, str, int]


class UsageStoreError(Exception):
    """The usage file cannot be read or written; ``str`` says why."""


@dataclass
class HourUsage:
    """What one key did in one hour (summed)."""

    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    duration_s: float = 0.0

    def add(self, other: HourUsage) -> None:
        self.requests += other.requests
        self.errors += other.errors
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.duration_s += other.duration_s


@dataclass(frozen=True)
class UsageRow:
    key_id: str
    hour: int  # start of the hour, Unix seconds (UTC)
    requests: int
    errors: int
    prompt_tokens: int
    completion_tokens: int
    duration_s: float
    model: str = ""  # "" for usage recorded before models were

    def as_dict(self) -> dict[str, object]:
        return {
            "key_id": self.key_id,
            "model": self.model,
            "hour": self.hour,
            "requests": self.requests,
            "errors": self.errors,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "duration_s": round(self.duration_s, 3),
        }


def _has_table(conn: sqlite3.Connection, name: str) -> bool:
    """A reader can open the file between the writer creating it and creating its tables (the
    gateway's first write): such a file is as empty as a missing one, not an error."""
    found = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,))
    return found.fetchone() is not None


def hour_of(t: float) -> int:
    return int(t // HOUR_S) * HOUR_S


class UsageStore:
    """One usage file. Each call opens its own connection (callers are worker threads and other
    processes); a missing file is created by writers only, a read of a missing file is empty."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._initialised = False

    @contextmanager
    def _connect(self, write: bool) -> Iterator[sqlite3.Connection]:
        try:
            if write and not self._initialised:
                # Created 0600, WAL (a CLI or API read never waits for the gateway's write, nor blocks
                # it), schema brought up to date (controller/sqlite_db.py).
                prepare_file(self.path, SCHEMA, timeout=5.0)
                self._initialised = True
            conn = connect_file(self.path, "rw" if write else "ro", timeout=5.0)
            try:
                if write:
                    # WAL + NORMAL: no fsync per commit; a power cut can lose the last seconds of usage,
                    # never corrupt the file. Usage is written every few seconds, off the request path.
                    conn.execute("PRAGMA synchronous=NORMAL")
                else:
                    # A reader does not migrate (the gateway's writer does) but never reads a file whose
                    # schema it does not know.
                    check_version(conn, SCHEMA, self.path)
            except BaseException:
                conn.close()
                raise
        except (sqlite3.Error, OSError, SchemaTooNew) as exc:
            raise UsageStoreError(f"usage store {self.path} cannot be opened: {exc}") from exc
        try:
            with conn:
                yield conn
        except sqlite3.Error as exc:
            raise UsageStoreError(f"usage store {self.path}: {exc}") from exc
        finally:
            conn.close()

    # -- the gateway's writer --------------------------------------------------------------------

    def write(
        self,
        rows: Mapping[UsageSlot, HourUsage],
        quotas: Sequence[BucketState] = (),
        prune_before: float | None = None,
    ) -> None:
        """Add ``rows`` to the hourly sums, save the quota levels, and delete hours before
        ``prune_before``: one transaction (all or nothing, so a failed batch can be retried)."""
        with self._connect(write=True) as conn:
            conn.executemany(
                "INSERT INTO usage_hourly (key_id, model, hour, requests, errors, prompt_tokens,"
                " completion_tokens, duration_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (key_id, model, hour) DO UPDATE SET"
                " requests = requests + excluded.requests, errors = errors + excluded.errors,"
                " prompt_tokens = prompt_tokens + excluded.prompt_tokens,"
                " completion_tokens = completion_tokens + excluded.completion_tokens,"
                " duration_s = duration_s + excluded.duration_s",
                [
                    (slot[0], "" if len(slot) == 2 else slot[1], slot[-1], u.requests, u.errors,
                     u.prompt_tokens, u.completion_tokens, u.duration_s)
                    for slot, u in rows.items()
                ],
            )
            conn.executemany(
                "INSERT OR REPLACE INTO quota_state (key_id, window, level, stamp) VALUES (?, ?, ?, ?)",
                [(q.key_id, q.window, q.level, q.stamp) for q in quotas if math.isfinite(q.level)],
            )
            if prune_before is not None:
                conn.execute("DELETE FROM usage_hourly WHERE hour < ?", (hour_of(prune_before),))

    def quota_states(self) -> list[BucketState]:
        if not self.path.exists():
            return []
        with self._connect(write=False) as conn:
            if not _has_table(conn, "quota_state"):
                return []
            rows = conn.execute("SELECT key_id, window, level, stamp FROM quota_state").fetchall()
        return [BucketState(r[0], r[1], float(r[2]), float(r[3])) for r in rows]

    # -- readers ---------------------------------------------------------------------------------

    def query(
        self, key_ids: Sequence[str] | None = None, since: float | None = None, until: float | None = None
    ) -> list[UsageRow]:
        """Hourly rows, oldest first: of ``key_ids`` (all keys if None), for the hours that
        overlap [since, until)."""
        if not self.path.exists():
            return []
        where: list[str] = []
        args: list[object] = []
        if key_ids is not None:
            if not key_ids:
                return []
            where.append(f"key_id IN ({', '.join('?' * len(key_ids))})")
            args.extend(key_ids)
        if since is not None:
            where.append("hour >= ?")
            args.append(hour_of(since))
        if until is not None:
            where.append("hour < ?")
            args.append(until)
        with self._connect(write=False) as conn:
            if not _has_table(conn, "usage_hourly"):
                return []
            # A reader reads a v1 file as it is (the writer upgrades it): no model recorded there.
            columns = {r[1] for r in conn.execute("PRAGMA table_info(usage_hourly)")}
            model = "model" if "model" in columns else "''"
            sql = "SELECT key_id, hour, requests, errors, prompt_tokens, completion_tokens, duration_s," \
                  f" {model} FROM usage_hourly"
            if where:
                sql += " WHERE " + " AND ".join(where)
            rows = conn.execute(sql + f" ORDER BY hour, key_id, {model}", args).fetchall()
        return [
            UsageRow(r[0], int(r[1]), int(r[2]), int(r[3]), int(r[4]), int(r[5]), float(r[6]), str(r[7]))
            for r in rows
        ]
