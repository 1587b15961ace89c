"""The API key store: a SQLite file holding sha256 hashes of random keys, never the keys.

A key looks like ``sk-app-<id>-<secret>``: the 12-hex-digit id is not secret (it names the key in
listings, logs and metrics), the secret is 32 random bytes. Only ``sha256(whole key)`` is stored, so
a copy of the file cannot be used to call the gateway; the key is shown once, when it is created.

Writers (the CLI, the controller's admin API) and the reader (the gateway process) share the file.
Triggers bump a ``version`` row on every change, so the gateway can notice a revoke by reading one
integer once a second instead of reloading the table (see ``auth.KeyCache``). The version is only
trusted for the same file: ``identity()`` (device, inode, size, mtime) tells a replaced or rewritten
file apart, and a missing file is an error, never silently recreated (an empty store opened by
accident would look like "no keys changed").

Files are created 0600 from the start (``O_CREAT | O_EXCL`` with the mode, not chmod afterwards);
SQLite creates its ``-wal``/``-shm`` files with the main file's mode. The schema is numbered
migrations (``SCHEMA``, controller/sqlite_db.py): an old file is upgraded on first open, one written by
a newer appliance refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import EllipsisType

from controller.sqlite_db import Schema, SchemaTooNew, file_uri, prepare_file

KEY_PREFIX = "sk-app-"
ID_HEX_LEN = 12
_KEY_RE = re.compile(r"^sk-app-([0-9a-f]{12})-[A-Za-z0-9_-]{20,200}$")
_ID_RE = re.compile(r"^[0-9a-f]{12}$")

# The schema's history (controller/sqlite_db.py: numbered migrations, never edited once shipped).
# v1: the first key store (keys with request limits; a version row that triggers bump on every change).
_V1 = (
    """CREATE TABLE IF NOT EXISTS keys (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    key_sha256 TEXT NOT NULL UNIQUE,
    created REAL NOT NULL,
    revoked REAL,
    rpm_limit INTEGER,
    max_concurrent INTEGER
)""",
    "CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v INTEGER NOT NULL)",
    "INSERT OR IGNORE INTO meta (k, v) VALUES ('version', 0)",
    """CREATE TRIGGER IF NOT EXISTS keys_version_ins AFTER INSERT ON keys
    BEGIN UPDATE meta SET v = v + 1 WHERE k = 'version'; END""",
    """CREATE TRIGGER IF NOT EXISTS keys_version_upd AFTER UPDATE ON keys
    BEGIN UPDATE meta SET v = v + 1 WHERE k = 'version'; END""",
    """CREATE TRIGGER IF NOT EXISTS keys_version_del AFTER DELETE ON keys
    BEGIN UPDATE meta SET v = v + 1 WHERE k = 'version'; END""",
)

# v2: token quotas per key (prompt + completion tokens per minute and per day).
_V2 = (
    "ALTER TABLE keys ADD COLUMN tpm_limit INTEGER",
    "ALTER TABLE keys ADD COLUMN tpd_limit INTEGER",
)

# v3: keys limited to some models (a JSON list of names; NULL: every model).
_V3 = ("ALTER TABLE keys ADD COLUMN models TEXT",)


def _unversioned(conn: sqlite3.Connection) -> int:
    """The key store shipped twice before it counted its schema (user_version 0 in both): v1 files, and
    v2 files (created so, or v1 files whose columns the old code added on open). Their columns say
    which; the file is stamped with it on first open and never probed again."""
    columns = {r[1] for r in conn.execute("PRAGMA table_info(keys)")}
    if not columns:
        return 0
    return 2 if {"tpm_limit", "tpd_limit"} <= columns else 1


SCHEMA = Schema("key store", (_V1, _V2, _V3), unversioned=_unversioned)

# A key's model list: names as the gateway's admin surface takes them (1..256 printable characters).
MAX_KEY_MODELS = 64
_MODEL_NAME_MAX = 256


def check_models(models: Sequence[str] | None) -> tuple[str, ...] | None:
    """The model list to store (sorted, without repeats), or ``KeyStoreError`` naming what is wrong.
    None: every model. An empty list is refused (a key for no model: revoke it instead)."""
    if models is None:
        return None
    if isinstance(models, str):
        raise KeyStoreError("models must be a list of model names")
    names = sorted(set(models))
    if not names:
        raise KeyStoreError("a key limited to no model serves nothing: give at least one name, "
                            "or none for every model (revoke the key to stop it)")
    if len(names) > MAX_KEY_MODELS:
        raise KeyStoreError(f"at most {MAX_KEY_MODELS} model names per key, got {len(names)}")
    for name in names:
        if not isinstance(name, str) or not name.strip() or len(name) > _MODEL_NAME_MAX \
                or not name.isprintable():
            raise KeyStoreError(f"a model name must be 1 to {_MODEL_NAME_MAX} printable characters, "
                                f"got {name!r}"[:400])
    return tuple(names)

# The limits a key may carry, with the largest value each accepts: "absurd" is refused (an SQLite
# overflow was a 500), "no limit" is None. A million requests a minute and 10 000 in flight are far
# past one engine on one host; a billion tokens a minute / ten billion a day are too (the reference
# host decodes at tens of tokens per second per stream, docs/domain.md §2).
LIMIT_BOUNDS: dict[str, int] = {
    "rpm_limit": 1_000_000,
    "max_concurrent": 10_000,
    "tpm_limit": 1_000_000_000,
    "tpd_limit": 10_000_000_000,
}


def check_limits(limits: dict[str, int | None]) -> None:
    """``KeyStoreError`` naming the first limit that is not None and outside 1..its bound."""
    for label, value in limits.items():
        if label not in LIMIT_BOUNDS:
            raise KeyStoreError(f"unknown limit {label!r}")
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise KeyStoreError(f"{label} must be a whole number, got {value!r}")
        if value < 1:
            raise KeyStoreError(f"{label} must be at least 1 (or unset for no limit), got {value}")
        if value > LIMIT_BOUNDS[label]:
            raise KeyStoreError(f"{label} must be at most {LIMIT_BOUNDS[label]}, got {value}")


class KeyStoreError(Exception):
    """A key store operation failed for a reason the caller should show to the operator."""


class KeyStoreUnavailable(KeyStoreError):
    """The store file is missing or cannot be opened (the caller must fail closed)."""


class KeyNotFound(KeyStoreError):
    def __init__(self, key_id: str) -> None:
        super().__init__(f"no key with id {key_id!r}")
        self.key_id = key_id


@dataclass(frozen=True)
class KeyRecord:
    """What may be shown about a key: everything except its secret and its hash."""

    id: str
    name: str
    created: float
    revoked: float | None
    rpm_limit: int | None
    max_concurrent: int | None
    tpm_limit: int | None = None  # prompt + completion tokens per minute
    tpd_limit: int | None = None  # prompt + completion tokens per day
    # The model names the key may use (a served name allows its aliases); None: every model.
    models: frozenset[str] | None = None

    @property
    def active(self) -> bool:
        return self.revoked is None

    def as_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "name": self.name,
            "created": self.created,
            "revoked": self.revoked,
            "rpm_limit": self.rpm_limit,
            "max_concurrent": self.max_concurrent,
            "tpm_limit": self.tpm_limit,
            "tpd_limit": self.tpd_limit,
            "models": sorted(self.models) if self.models is not None else None,
        }


@dataclass(frozen=True)
class StoredKey:
    """A record with the hash the gateway compares against (sha256 digest, 32 bytes)."""

    record: KeyRecord
    digest: bytes


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def key_id_of(presented: str) -> str | None:
    """The id embedded in a well-formed key, or None if the string cannot be one of our keys."""
    m = _KEY_RE.match(presented)
    return m.group(1) if m else None


@dataclass(frozen=True)
class FileIdentity:
    """What tells one store file from another at the same path: a replaced file has another inode,
    a file rewritten in place another size or mtime. Read with ``stat`` (no file descriptor)."""

    device: int
    inode: int
    size: int
    mtime_ns: int


def _row_to_record(row: sqlite3.Row) -> KeyRecord:
    return KeyRecord(
        id=row["id"],
        name=row["name"],
        created=row["created"],
        revoked=row["revoked"],
        rpm_limit=row["rpm_limit"],
        max_concurrent=row["max_concurrent"],
        tpm_limit=row["tpm_limit"],
        tpd_limit=row["tpd_limit"],
        models=_models_of(row["models"]),
    )


def _models_of(stored: str | None) -> frozenset[str] | None:
    if stored is None:
        return None
    names = json.loads(stored)
    return frozenset(n for n in names if isinstance(n, str))


class KeyStore:
    """Operations on one key file. Each call opens its own connection: callers live in different
    threads (FastAPI's thread pool) and processes (CLI, gateway), and opening costs ~0.1 ms."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._initialised = False
        self._uri_cache: str | None = None

    def _uri(self) -> str:
        # mode=rw: opening never creates the file. A deleted store must be an error, not a new
        # empty file that a reader would take for "the same store, nothing changed".
        if self._uri_cache is None:
            self._uri_cache = file_uri(self.path, "rw")
        return self._uri_cache

    @contextmanager
    def _connect(self, create: bool = True) -> Iterator[sqlite3.Connection]:
        if not self._initialised:
            if not create and not self.path.exists():
                raise KeyStoreUnavailable(f"key store {self.path} does not exist")
            self._init()
        try:
            conn = sqlite3.connect(self._uri(), timeout=5.0, uri=True)
        except sqlite3.OperationalError as exc:
            raise KeyStoreUnavailable(f"key store {self.path} cannot be opened: {exc}") from exc
        conn.row_factory = sqlite3.Row
        try:
            with conn:
                yield conn
        finally:
            conn.close()

    def _init(self) -> None:
        """Create the file (0600: the file holds only hashes, but names and limits are still the
        operator's business) and bring its schema up to date, if needed (controller/sqlite_db.py;
        a file written by a newer appliance is refused). Only called before the first use: a store
        that disappears later stays missing (``KeyStoreUnavailable``)."""
        try:
            prepare_file(self.path, SCHEMA, timeout=5.0)
        except sqlite3.OperationalError as exc:
            raise KeyStoreUnavailable(f"key store {self.path} cannot be opened: {exc}") from exc
        except SchemaTooNew as exc:
            raise KeyStoreUnavailable(str(exc)) from exc
        self._initialised = True

    def identity(self) -> FileIdentity:
        """The file's identity now (``KeyStoreUnavailable`` if it is gone)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError as exc:
            raise KeyStoreUnavailable(f"key store {self.path} does not exist") from exc
        return FileIdentity(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def create(
        self,
        name: str,
        rpm_limit: int | None = None,
        max_concurrent: int | None = None,
        tpm_limit: int | None = None,
        tpd_limit: int | None = None,
        models: Sequence[str] | None = None,
    ) -> tuple[KeyRecord, str]:
        """Make a new key. Returns the record and the key itself, which is not stored anywhere."""
        if not name.strip():
            raise KeyStoreError("a key needs a non-empty name")
        if not name.isprintable():
            # A name with control characters (an escape sequence) was printed
            # raw by `appliance keys list`: terminal injection.
            raise KeyStoreError("a key name must be printable text (no control characters or line breaks)")
        check_limits({"rpm_limit": rpm_limit, "max_concurrent": max_concurrent,
                      "tpm_limit": tpm_limit, "tpd_limit": tpd_limit})
        names = check_models(models)
        key_id = secrets.token_hex(ID_HEX_LEN // 2)
        key = f"{KEY_PREFIX}{key_id}-{secrets.token_urlsafe(32)}"
        record = KeyRecord(
            id=key_id,
            name=name,
            created=time.time(),
            revoked=None,
            rpm_limit=rpm_limit,
            max_concurrent=max_concurrent,
            tpm_limit=tpm_limit,
            tpd_limit=tpd_limit,
            models=frozenset(names) if names is not None else None,
        )
        with self._connect() as conn:
            conn.execute(
                "INSERT INTO keys (id, name, key_sha256, created, revoked, rpm_limit, max_concurrent,"
                " tpm_limit, tpd_limit, models) VALUES (?, ?, ?, ?, NULL, ?, ?, ?, ?, ?)",
                (key_id, name, hash_key(key), record.created, rpm_limit, max_concurrent,
                 tpm_limit, tpd_limit, json.dumps(names) if names is not None else None),
            )
        return record, key

    def update(
        self, key_id: str, limits: dict[str, int | None],
        models: Sequence[str] | EllipsisType | None = ...,
    ) -> KeyRecord:
        """Set the given limits (None: no limit) of a key; limits not named keep their value; and
        its models when given (None: every model; ``...``: unchanged). The gateway applies them
        within about a second (the version row moves)."""
        check_limits(limits)
        values: dict[str, object] = dict(limits)
        if not isinstance(models, EllipsisType):
            names = check_models(models)
            values["models"] = json.dumps(names) if names is not None else None
        if not _ID_RE.match(key_id) or not self.path.exists():
            raise KeyNotFound(key_id)
        if values:
            # Column names come from LIMIT_BOUNDS (checked above) and "models", never from the
            # caller's text.
            assignments = ", ".join(f"{label} = ?" for label in values)
            with self._connect(create=False) as conn:
                cur = conn.execute(
                    f"UPDATE keys SET {assignments} WHERE id = ?", (*values.values(), key_id)
                )
                if cur.rowcount == 0:
                    raise KeyNotFound(key_id)
        return self.get(key_id)

    def list(self, include_revoked: bool = True) -> list[KeyRecord]:
        """Every key; none when there is no store. A read never creates the store (a deleted store
        was silently recreated empty by a listing, and clients then got 401 instead of the gateway's
        503 + Retry-After): only `create` makes one."""
        if not self.path.exists():
            return []
        query = "SELECT * FROM keys"
        if not include_revoked:
            query += " WHERE revoked IS NULL"
        with self._connect(create=False) as conn:
            rows = conn.execute(query + " ORDER BY created").fetchall()
        return [_row_to_record(r) for r in rows]

    def get(self, key_id: str) -> KeyRecord:
        if not self.path.exists():
            raise KeyNotFound(key_id)
        with self._connect(create=False) as conn:
            row = conn.execute("SELECT * FROM keys WHERE id = ?", (key_id,)).fetchone()
        if row is None:
            raise KeyNotFound(key_id)
        return _row_to_record(row)

    def revoke(self, key_id: str) -> KeyRecord:
        """Mark a key revoked (idempotent: a second revoke keeps the first time)."""
        if not _ID_RE.match(key_id) or not self.path.exists():
            raise KeyNotFound(key_id)
        with self._connect(create=False) as conn:
            conn.execute(
                "UPDATE keys SET revoked = ? WHERE id = ? AND revoked IS NULL", (time.time(), key_id)
            )
        return self.get(key_id)

    def version(self) -> int:
        """A number that changes whenever any key is added, changed or removed (in this file: compare
        ``identity()`` too, another file can have the same number)."""
        with self._connect(create=False) as conn:
            row = conn.execute("SELECT v FROM meta WHERE k = 'version'").fetchone()
        return int(row[0])

    def snapshot(self, create: bool = False) -> tuple[int, dict[str, StoredKey]]:
        """Version and every key (revoked ones too, so the gateway can say "revoked"), read in one
        transaction so the version matches the rows. ``create``: make an empty store if there is
        none (the gateway at start-up); otherwise a missing file is ``KeyStoreUnavailable``."""
        with self._connect(create=create) as conn:
            conn.execute("BEGIN")  # one read snapshot for both statements
            version = int(conn.execute("SELECT v FROM meta WHERE k = 'version'").fetchone()[0])
            rows = conn.execute("SELECT * FROM keys").fetchall()
        keys = {
            r["id"]: StoredKey(record=_row_to_record(r), digest=bytes.fromhex(r["key_sha256"])) for r in rows
        }
        return version, keys
