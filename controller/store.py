"""The launch store: every launch, its phases and its events, in SQLite (WAL), kept across restarts.

One record per engine start: what ran (recipe, spec hash, argv and environment with secrets
redacted, image id/digest or interpreter and package versions), how the start went (each phase
with its time, ready seconds, compile-cache hit or miss), how it ended (exit code, signal, OOM
flag, diagnosis, log tail) and what the host went through (MemAvailable low-water mark, swap
peak — filled by the host watch). DOMAIN §7: "record … each generated text"; here: record every
launch so that a cold/warm comparison or an OOM at minute 27 can be read back later.

Schema changes are numbered migrations applied in order and tracked by `PRAGMA user_version`
(controller/sqlite_db.py, the discipline every store follows); a database written by an older version
is upgraded in place on open, one written by a newer one is refused.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from appliance.engine_secret import REDACTED as REDACTED
from appliance.engine_secret import is_secret_name as is_secret_name
from appliance.engine_secret import redact_argv as redact_argv
from appliance.engine_secret import redact_env as redact_env
from appliance.observe.ready_eta import PastLaunch, start_state
from appliance.recipe.launch_spec import LaunchSpec
from controller.runtime.base import EngineHandle, ExitInfo, Provenance
from controller.sqlite_db import Schema, SchemaTooNew, SqliteDb
from controller.sqlite_db import migrate as sqlite_migrate

# REDACTED, is_secret_name, redact_argv, redact_env: re-exported from appliance/engine_secret.py, the
# one definition of "secret-shaped" for launch records, API answers, console pages and the CLI.


def redact_spec(spec: LaunchSpec) -> LaunchSpec:
    return spec.model_copy(update={"env": redact_env(spec.env), "argv": tuple(redact_argv(spec.argv))})


# --------------------------------------------------------------------------------------------
# Schema


# Each migration is a list of statements run in one transaction (executescript would commit
# half-way, so statements are executed one by one between BEGIN and COMMIT).
_V1 = (
    """CREATE TABLE launches (
        id TEXT PRIMARY KEY,
        recipe TEXT NOT NULL,
        spec_hash TEXT NOT NULL,
        kind TEXT NOT NULL,
        runtime TEXT NOT NULL,
        status TEXT NOT NULL,
        argv_json TEXT NOT NULL,
        env_json TEXT NOT NULL,
        spec_json TEXT NOT NULL,
        image TEXT,
        image_id TEXT,
        image_digest TEXT,
        interpreter TEXT,
        packages_json TEXT,
        handle_json TEXT,
        created_at REAL NOT NULL,
        started_at REAL,
        ready_at REAL,
        ready_s REAL,
        cache TEXT,
        ended_at REAL,
        exit_code INTEGER,
        exit_signal INTEGER,
        oom_killed INTEGER,
        diagnosis_code TEXT,
        diagnosis_json TEXT,
        log_tail TEXT
    )""",
    "CREATE INDEX launches_recipe ON launches(recipe, created_at)",
    """CREATE TABLE phases (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        launch_id TEXT NOT NULL REFERENCES launches(id),
        name TEXT NOT NULL,
        at REAL NOT NULL,
        elapsed_s REAL NOT NULL,
        detail TEXT NOT NULL DEFAULT ''
    )""",
    "CREATE INDEX phases_launch ON phases(launch_id, id)",
    """CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        launch_id TEXT,
        at REAL NOT NULL,
        kind TEXT NOT NULL,
        message TEXT NOT NULL,
        data_json TEXT NOT NULL DEFAULT '{}'
    )""",
    "CREATE INDEX events_launch ON events(launch_id, id)",
)

# The host watch (DOMAIN §3 "what to watch"): min MemAvailable over the run and the swap peak
# decide whether a recipe met its memory bar (recipe C: 2.35 GiB min, 5.40 GiB swap peak); OOM
# kills attributed to the launch are kept with it.
_V2 = (
    "ALTER TABLE launches ADD COLUMN mem_available_min_bytes INTEGER",
    "ALTER TABLE launches ADD COLUMN swap_peak_bytes INTEGER",
    "ALTER TABLE launches ADD COLUMN oom_json TEXT",
)

# What the engine's start-up log said about the engine (attention backend, model runner,
# vLLM's GPU memory breakdown, KV cache, graph pool, compile/weights seconds:
# appliance/observe/engine_facts.py)
# and the GPU memory/utilisation peaks per start-up phase (appliance/observe/gpu_mem.py).
_V3 = (
    "ALTER TABLE launches ADD COLUMN engine_json TEXT",
    "ALTER TABLE launches ADD COLUMN gpu_peaks_json TEXT",
)

# A cache miss explains itself. `compile_json` holds the launch's compile factors (hashed
# values), the cache root's state at launch, what the log said (vLLM's cache dir hash, the AOT path,
# the marker lines), the warnings (root not writable, deleted, shared) and, on a miss, why
# (appliance/recipe/compile_factors.py). `cache_root` is a column so the earlier launch on the same root is
# one indexed query; older rows get it from their spec.
_V4 = (
    "ALTER TABLE launches ADD COLUMN compile_json TEXT",
    "ALTER TABLE launches ADD COLUMN cache_root TEXT",
    "UPDATE launches SET cache_root = json_extract(spec_json, '$.cache_root')",
    "CREATE INDEX launches_cache_root ON launches(cache_root, created_at)",
)

# For the ETA from history: whether the controller started the launch cold (its compile cache root
# empty or a warm-up's first start) or expected it warm. The log's hit/miss (`cache`) is the proof
# once it comes; an eager start logs neither, and its ETA is still compared like with like.
_V5 = (
    "ALTER TABLE launches ADD COLUMN start TEXT",
    "CREATE INDEX launches_ready ON launches(recipe, spec_hash, created_at) WHERE ready_s IS NOT NULL",
)

MIGRATIONS: tuple[tuple[str, ...], ...] = (_V1, _V2, _V3, _V4, _V5)
SCHEMA = Schema("launch store", MIGRATIONS)
SCHEMA_VERSION = SCHEMA.version


def migrate(db: sqlite3.Connection, upto: int = SCHEMA_VERSION) -> int:
    """Apply the migrations the database has not seen yet, each in its own transaction
    (controller/sqlite_db.py); a database newer than this code is a `StoreError`.

    `db` must be in autocommit mode (isolation_level=None): transactions are explicit there.
    """
    try:
        return sqlite_migrate(db, SCHEMA, upto)
    except SchemaTooNew as exc:
        raise StoreError(str(exc)) from exc


class StoreError(Exception):
    pass


# --------------------------------------------------------------------------------------------
# Records (also the API's response models)


class PhaseRecord(BaseModel):
    name: str
    at: float
    elapsed_s: float
    detail: str


class EventRecord(BaseModel):
    id: int
    launch_id: str | None
    at: float
    kind: str
    message: str
    data: dict[str, Any]


class LaunchSummary(BaseModel):
    id: str
    recipe: str
    spec_hash: str
    kind: str
    runtime: str
    status: str
    created_at: float
    ready_s: float | None
    cache: str | None
    exit_code: int | None
    exit_signal: int | None
    oom_killed: bool | None
    diagnosis_code: str | None
    mem_available_min_bytes: int | None
    swap_peak_bytes: int | None


class LaunchRecord(LaunchSummary):
    argv: list[str]
    env: dict[str, str]
    image: str | None
    image_id: str | None
    image_digest: str | None
    interpreter: str | None
    packages: dict[str, str]
    handle: dict[str, Any] | None
    started_at: float | None
    ready_at: float | None
    ended_at: float | None
    diagnosis: dict[str, Any] | None
    log_tail: str | None
    oom: list[dict[str, Any]]
    phases: list[PhaseRecord]
    events: list[EventRecord]
    engine: dict[str, Any] = {}  # appliance/observe/engine_facts.py + the start's seconds
    gpu_peaks: dict[str, Any] = {}  # {phase: {card: {used_max_bytes, total_bytes, busy_max_percent}}}
    # {factors, cache_root_state, previous_launch, previous_cache_dir, seen, miss, warnings}
    # (controller/supervisor/compile_cache.py writes it; appliance/recipe/compile_factors.py defines
    # the parts).
    compile_cache: dict[str, Any] = {}


class EarlierLaunch(BaseModel):
    """An earlier launch on the same compile cache root (for explaining a miss, and for warnings)."""

    id: str
    recipe: str
    spec_hash: str
    compile_cache: dict[str, Any]


_SUMMARY_COLUMNS = (
    "id, recipe, spec_hash, kind, runtime, status, created_at, ready_s, cache, exit_code, exit_signal, "
    "oom_killed, diagnosis_code, mem_available_min_bytes, swap_peak_bytes"
)


def _summary(row: sqlite3.Row) -> dict[str, Any]:
    d = {k: row[k] for k in _SUMMARY_COLUMNS.split(", ")}
    d["oom_killed"] = None if row["oom_killed"] is None else bool(row["oom_killed"])
    return d


class Store(SqliteDb):
    """Thread-safe (one connection behind a lock, controller/sqlite_db.py): the driver writes, API
    handlers read."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        with self._lock:
            migrate(self._db)

    def schema_version(self) -> int:
        with self._lock:
            return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    # ---- writes

    def create_launch(
        self, launch_id: str, spec: LaunchSpec, kind: str, provenance: Provenance, now: float,
        start: str | None = None,
    ) -> None:
        """`start`: `cold` or `warm`, as the controller expects the start (None: not known, adopted)."""
        safe = redact_spec(spec)
        with self._tx() as db:
            db.execute(
                "INSERT INTO launches (id, recipe, spec_hash, kind, runtime, status, argv_json, env_json, "
                "spec_json, image, image_id, image_digest, interpreter, packages_json, created_at, "
                "cache_root, start) "
                "VALUES (?, ?, ?, ?, ?, 'starting', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    launch_id, spec.recipe, spec.spec_hash, kind, spec.kind,
                    json.dumps(list(safe.command())), json.dumps(safe.env, sort_keys=True),
                    safe.model_dump_json(), provenance.image or spec.runtime.engine_image(),
                    provenance.image_id, provenance.image_digest,
                    provenance.interpreter or spec.runtime.engine_python(),
                    json.dumps(provenance.packages, sort_keys=True), now, spec.cache_root, start,
                ),
            )

    def set_handle(self, launch_id: str, handle: EngineHandle, started_at: float) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE launches SET handle_json = ?, started_at = ? WHERE id = ?",
                (handle.model_dump_json(), started_at, launch_id),
            )

    def add_phase(self, launch_id: str, name: str, at: float, elapsed_s: float, detail: str = "") -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO phases (launch_id, name, at, elapsed_s, detail) VALUES (?, ?, ?, ?, ?)",
                (launch_id, name, at, round(elapsed_s, 3), detail),
            )

    def set_cache(self, launch_id: str, outcome: str) -> None:
        """`hit` or `miss` of the compile cache, as the engine log said (DOMAIN §4 markers)."""
        if outcome not in ("hit", "miss"):
            raise ValueError(f"cache outcome must be hit or miss, not {outcome!r}")
        with self._tx() as db:
            # A miss anywhere in the start makes the start a miss (one recompiled piece is a cold start).
            db.execute(
                "UPDATE launches SET cache = CASE WHEN cache = 'miss' THEN 'miss' ELSE ? END WHERE id = ?",
                (outcome, launch_id),
            )

    def mark_ready(self, launch_id: str, at: float, ready_s: float) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE launches SET status = 'ready', ready_at = ?, ready_s = ? WHERE id = ?",
                (at, ready_s, launch_id),
            )

    def mark_ended(
        self,
        launch_id: str,
        at: float,
        status: str,
        exit: ExitInfo | None = None,
        diagnosis: Mapping[str, Any] | None = None,
        log_tail: str | None = None,
    ) -> None:
        oom = None if exit is None or exit.oom_killed is None else int(exit.oom_killed)
        with self._tx() as db:
            db.execute(
                "UPDATE launches SET status = ?, ended_at = COALESCE(ended_at, ?), "
                "exit_code = COALESCE(?, exit_code), exit_signal = COALESCE(?, exit_signal), "
                "oom_killed = COALESCE(?, oom_killed), diagnosis_code = COALESCE(?, diagnosis_code), "
                "diagnosis_json = COALESCE(?, diagnosis_json), log_tail = COALESCE(?, log_tail) WHERE id = ?",
                (
                    status, at, exit.exit_code if exit else None, exit.signal if exit else None, oom,
                    diagnosis.get("code") if diagnosis else None,
                    json.dumps(dict(diagnosis)) if diagnosis else None, log_tail, launch_id,
                ),
            )

    def record_memory(
        self, launch_id: str, mem_available_min_bytes: int | None = None, swap_peak_bytes: int | None = None
    ) -> None:
        """Host watch: keep the lowest MemAvailable and the highest swap use seen during the launch."""
        with self._tx() as db:
            db.execute(
                "UPDATE launches SET "
                "mem_available_min_bytes = CASE WHEN ? IS NULL THEN mem_available_min_bytes "
                "  WHEN mem_available_min_bytes IS NULL OR ? < mem_available_min_bytes THEN ? "
                "  ELSE mem_available_min_bytes END, "
                "swap_peak_bytes = CASE WHEN ? IS NULL THEN swap_peak_bytes "
                "  WHEN swap_peak_bytes IS NULL OR ? > swap_peak_bytes THEN ? ELSE swap_peak_bytes END "
                "WHERE id = ?",
                (mem_available_min_bytes,) * 3 + (swap_peak_bytes,) * 3 + (launch_id,),
            )

    def set_engine_facts(self, launch_id: str, facts: Mapping[str, Any]) -> None:
        """What the start-up log said about the engine (replaces the previous value)."""
        with self._tx() as db:
            db.execute("UPDATE launches SET engine_json = ? WHERE id = ?",
                       (json.dumps(dict(facts), default=str), launch_id))

    def set_gpu_peaks(self, launch_id: str, peaks: Mapping[str, Any]) -> None:
        """GPU memory/utilisation peaks by phase (the watch folds them; this replaces the value)."""
        with self._tx() as db:
            db.execute("UPDATE launches SET gpu_peaks_json = ? WHERE id = ?",
                       (json.dumps(dict(peaks)), launch_id))

    def update_compile_cache(self, launch_id: str, patch: Mapping[str, Any]) -> None:
        """Merge `patch` into the launch's compile-cache record (top-level keys replaced). Values are
        hashed or public by construction (appliance/recipe/compile_factors.py); evidence lines are the
        engine's own log lines, which never print the key."""
        with self._tx() as db:
            row = db.execute("SELECT compile_json FROM launches WHERE id = ?", (launch_id,)).fetchone()
            if row is None:
                raise StoreError(f"no launch {launch_id}")
            record = {**json.loads(row["compile_json"] or "{}"), **dict(patch)}
            db.execute("UPDATE launches SET compile_json = ? WHERE id = ?",
                       (json.dumps(record, default=str), launch_id))

    def earlier_on_root(self, launch_id: str, cache_root: str) -> list[EarlierLaunch]:
        """Launches before `launch_id` on the same compile cache root, newest first (bounded)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id, recipe, spec_hash, compile_json FROM launches WHERE cache_root = ? AND id != ? "
                "AND created_at <= COALESCE((SELECT created_at FROM launches WHERE id = ?), created_at) "
                "ORDER BY created_at DESC, rowid DESC LIMIT 50",
                (cache_root, launch_id, launch_id),
            ).fetchall()
        return [EarlierLaunch(id=r["id"], recipe=r["recipe"], spec_hash=r["spec_hash"],
                              compile_cache=json.loads(r["compile_json"] or "{}")) for r in rows]

    def record_oom(self, launch_id: str, event: Mapping[str, Any]) -> None:
        """An OOM kill attributed to this launch by the host watch (appended; a start can see several)."""
        with self._tx() as db:
            row = db.execute("SELECT oom_json FROM launches WHERE id = ?", (launch_id,)).fetchone()
            if row is None:
                raise StoreError(f"no launch {launch_id}")
            events = json.loads(row["oom_json"] or "[]")
            events.append(dict(event))
            db.execute("UPDATE launches SET oom_json = ? WHERE id = ?", (json.dumps(events), launch_id))

    def add_event(
        self, kind: str, message: str, at: float, launch_id: str | None = None,
        data: Mapping[str, Any] | None = None,
    ) -> EventRecord:
        payload = json.dumps(dict(data or {}), default=str)
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO events (launch_id, at, kind, message, data_json) VALUES (?, ?, ?, ?, ?)",
                (launch_id, at, kind, message, payload),
            )
            event_id = int(cur.lastrowid or 0)
        return EventRecord(id=event_id, launch_id=launch_id, at=at, kind=kind, message=message,
                           data=json.loads(payload))

    # ---- reads

    def list_launches(self, limit: int = 50, recipe: str | None = None) -> list[LaunchSummary]:
        where, args = ("WHERE recipe = ?", (recipe,)) if recipe else ("", ())
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_SUMMARY_COLUMNS} FROM launches {where} "
                "ORDER BY created_at DESC, rowid DESC LIMIT ?",
                (*args, limit),
            ).fetchall()
        return [LaunchSummary(**_summary(r)) for r in rows]

    def get_launch(self, launch_id: str) -> LaunchRecord | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM launches WHERE id = ?", (launch_id,)).fetchone()
            if row is None:
                return None
            phases = self._db.execute(
                "SELECT name, at, elapsed_s, detail FROM phases WHERE launch_id = ? ORDER BY id", (launch_id,)
            ).fetchall()
            events = self._db.execute(
                "SELECT * FROM events WHERE launch_id = ? ORDER BY id", (launch_id,)
            ).fetchall()
        return LaunchRecord(
            **_summary(row),
            argv=json.loads(row["argv_json"]),
            env=json.loads(row["env_json"]),
            image=row["image"],
            image_id=row["image_id"],
            image_digest=row["image_digest"],
            interpreter=row["interpreter"],
            packages=json.loads(row["packages_json"] or "{}"),
            handle=json.loads(row["handle_json"]) if row["handle_json"] else None,
            started_at=row["started_at"],
            ready_at=row["ready_at"],
            ended_at=row["ended_at"],
            diagnosis=json.loads(row["diagnosis_json"]) if row["diagnosis_json"] else None,
            log_tail=row["log_tail"],
            oom=json.loads(row["oom_json"] or "[]"),
            engine=json.loads(row["engine_json"] or "{}"),
            gpu_peaks=json.loads(row["gpu_peaks_json"] or "{}"),
            compile_cache=json.loads(row["compile_json"] or "{}"),
            phases=[PhaseRecord(**dict(p)) for p in phases],
            events=[_event(e) for e in events],
        )

    def get_spec(self, launch_id: str) -> LaunchSpec | None:
        """The (redacted) spec of a launch: enough to probe and follow an adopted engine."""
        with self._lock:
            row = self._db.execute("SELECT spec_json FROM launches WHERE id = ?", (launch_id,)).fetchone()
        return None if row is None else LaunchSpec.model_validate_json(row["spec_json"])

    def ready_history(self, recipe: str, spec_hash: str, exclude: str | None = None,
                      limit: int = 20) -> list[PastLaunch]:
        """Earlier launches of `recipe` that reached ready, newest first, with their phase rows, for the
        ETA of a new start (appliance/observe/ready_eta.py): up to `limit` of this spec hash and up to `limit`
        of the recipe's other spec hashes (the fallback). Adopted launches are left out (their start
        was measured by another controller, or not at all); so is `exclude` (the current launch)."""
        query = (
            "SELECT id, spec_hash, kind, cache, start, ready_s FROM launches "
            "WHERE recipe = ? AND spec_hash {op} ? AND ready_s IS NOT NULL AND kind != 'adopted' AND id != ? "
            "ORDER BY created_at DESC, rowid DESC LIMIT ?"
        )
        args = (recipe, spec_hash, exclude or "", limit)
        with self._lock:
            rows = [*self._db.execute(query.format(op="="), args).fetchall(),
                    *self._db.execute(query.format(op="!="), args).fetchall()]
            phases: dict[str, list[tuple[str, float]]] = {r["id"]: [] for r in rows}
            if rows:
                marks = ", ".join("?" * len(rows))
                for p in self._db.execute(
                    f"SELECT launch_id, name, elapsed_s FROM phases WHERE launch_id IN ({marks}) ORDER BY id",
                    [r["id"] for r in rows],
                ).fetchall():
                    phases[p["launch_id"]].append((p["name"], float(p["elapsed_s"])))
        return [
            PastLaunch(
                launch_id=r["id"], spec_hash=r["spec_hash"], ready_s=float(r["ready_s"]),
                # Launches recorded before `start` existed: a warm-up's first start was cold.
                start=start_state(r["cache"], _cold_start(r["start"], r["kind"])),
                phases=tuple(phases[r["id"]]),
            )
            for r in rows
        ]

    def unfinished(self) -> list[str]:
        """Launches with no end recorded (candidates for adoption after a controller restart)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id FROM launches WHERE ended_at IS NULL ORDER BY created_at"
            ).fetchall()
        return [r["id"] for r in rows]

    def events(self, after_id: int = 0, limit: int = 200) -> list[EventRecord]:
        with self._lock:
            rows = self._db.execute(
                "SELECT * FROM events WHERE id > ? ORDER BY id LIMIT ?", (after_id, limit)
            ).fetchall()
        return [_event(r) for r in rows]


def read_earlier_on_root(path: Path, cache_root: str) -> list[EarlierLaunch]:
    """Read-only, for `appliance plan` beside a running controller: the launches that ran on
    `cache_root`, newest first, from a database of any schema version (the root is read from the
    spec, as before v4). A missing or unreadable database has none."""
    if not path.exists():
        return []
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            rows = db.execute(
                "SELECT id, recipe, spec_hash FROM launches "
                "WHERE json_extract(spec_json, '$.cache_root') = ? "
                "ORDER BY created_at DESC, rowid DESC LIMIT 50", (cache_root,)).fetchall()
        finally:
            db.close()
    except sqlite3.Error:
        return []
    return [EarlierLaunch(id=r[0], recipe=r[1], spec_hash=r[2], compile_cache={}) for r in rows]


def _cold_start(start: str | None, kind: str) -> bool | None:
    if start is not None:
        return start == "cold"
    return True if kind == "cold-warmup" else None


def _event(row: sqlite3.Row) -> EventRecord:
    return EventRecord(
        id=row["id"], launch_id=row["launch_id"], at=row["at"], kind=row["kind"], message=row["message"],
        data=json.loads(row["data_json"]),
    )
