"""Choice records (`appliance choose`), in the launch store's SQLite file beside the evaluation tables.

A choice's whole state is its decision record (appliance/evaluation/tournament.py), written after every
step, so a controller restart mid-choice reloads it and resumes from the next planned candidate. At
most one choice runs: `claim` inserts a running record only when no other is running, in one
transaction (a second caller, in this process or another, gets False → 409).
"""

from __future__ import annotations

from pathlib import Path

from appliance.evaluation.tournament import ChoiceRecord
from controller.sqlite_db import SqliteDb

_TABLE = """CREATE TABLE IF NOT EXISTS eval_choices (
    id TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    started_at REAL NOT NULL,
    record_json TEXT NOT NULL
)"""


class ChoiceStore(SqliteDb):
    def __init__(self, path: Path) -> None:
        super().__init__(path)
        with self._tx() as db:
            db.execute(_TABLE)

    def claim(self, record: ChoiceRecord) -> str | None:
        """Store a new running choice; the id of the one already running instead (nothing stored)."""
        with self._tx() as db:
            row = db.execute("SELECT id FROM eval_choices WHERE state = 'running' LIMIT 1").fetchone()
            if row is not None:
                return str(row["id"])
            db.execute(
                "INSERT INTO eval_choices (id, state, started_at, record_json) VALUES (?, ?, ?, ?)",
                (record.id, record.state, record.started_at, record.model_dump_json()),
            )
        return None

    def save(self, record: ChoiceRecord) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE eval_choices SET state = ?, record_json = ? WHERE id = ?",
                (record.state, record.model_dump_json(), record.id),
            )

    def get(self, choice_id: str) -> ChoiceRecord | None:
        with self._lock:
            row = self._db.execute(
                "SELECT record_json FROM eval_choices WHERE id = ?", (choice_id,)
            ).fetchone()
        return None if row is None else ChoiceRecord.model_validate_json(row["record_json"])

    def running(self) -> ChoiceRecord | None:
        with self._lock:
            row = self._db.execute(
                "SELECT record_json FROM eval_choices WHERE state = 'running' ORDER BY started_at LIMIT 1"
            ).fetchone()
        return None if row is None else ChoiceRecord.model_validate_json(row["record_json"])

    def list(self, limit: int = 50) -> list[ChoiceRecord]:
        with self._lock:
            rows = self._db.execute(
                "SELECT record_json FROM eval_choices ORDER BY started_at DESC LIMIT ?", (limit,)
            ).fetchall()
        return [ChoiceRecord.model_validate_json(r["record_json"]) for r in rows]
