"""Benchmark, comparison and fingerprint records, in the launch store's SQLite file.

Same database as controller/store.py (`Paths.db`), its own tables and its own schema version
(`eval_schema`), so the launch store's numbered migrations stay untouched. Every record names the
launch it measured (recipe, spec hash, cache vintage cold/warm and the cache root), so a figure can
always be traced to what ran. Each write is one transaction: a compare stores both benches and the
verdict together or nothing (a run that fails half-way leaves no half record).
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from appliance.evaluation.bench_result import BenchResult
from appliance.evaluation.fingerprint import DeclaredCheck, Fingerprint
from appliance.evaluation.gate import GateResult
from controller.sqlite_db import SqliteDb

SCHEMA_VERSION = 1

_V1 = (
    "CREATE TABLE IF NOT EXISTS eval_schema (version INTEGER NOT NULL)",
    """CREATE TABLE IF NOT EXISTS eval_benchmarks (
        id TEXT PRIMARY KEY,
        launch_id TEXT,
        recipe TEXT NOT NULL,
        spec_hash TEXT,
        cache_vintage TEXT,
        cache_root TEXT,
        score REAL NOT NULL,
        p99_ttft_ms REAL,
        p99_tpot_ms REAL,
        decode_ms_median REAL,
        failed INTEGER NOT NULL,
        comparison_id TEXT,
        created_at REAL NOT NULL,
        result_json TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS eval_benchmarks_recipe ON eval_benchmarks(recipe, created_at)",
    """CREATE TABLE IF NOT EXISTS eval_comparisons (
        id TEXT PRIMARY KEY,
        baseline TEXT NOT NULL,
        candidate TEXT NOT NULL,
        verdict TEXT NOT NULL,
        reasons_json TEXT NOT NULL,
        gate_json TEXT NOT NULL,
        created_at REAL NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS eval_fingerprints (
        id TEXT PRIMARY KEY,
        launch_id TEXT,
        recipe TEXT NOT NULL,
        spec_hash TEXT,
        cache_root TEXT,
        cache_vintage TEXT,
        measured TEXT NOT NULL,
        declared TEXT,
        mismatch INTEGER NOT NULL,
        finding TEXT NOT NULL,
        serial_set_hash TEXT NOT NULL,
        streams_json TEXT NOT NULL,
        fingerprint_json TEXT NOT NULL,
        created_at REAL NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS eval_fingerprints_recipe ON eval_fingerprints(recipe, created_at)",
)


class EvalStore(SqliteDb):
    """Opened like the launch store (controller/sqlite_db.py: WAL, busy timeout, one locked connection)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        with self._tx() as db:
            for statement in _V1:
                db.execute(statement)
            if db.execute("SELECT COUNT(*) FROM eval_schema").fetchone()[0] == 0:
                db.execute("INSERT INTO eval_schema (version) VALUES (?)", (SCHEMA_VERSION,))

    # ---- writes

    @staticmethod
    def _insert_bench(db: sqlite3.Connection, r: BenchResult, comparison_id: str | None) -> None:
        ss = r.single_stream
        db.execute(
            "INSERT INTO eval_benchmarks (id, launch_id, recipe, spec_hash, cache_vintage, cache_root, "
            "score, "
            "p99_ttft_ms, p99_tpot_ms, decode_ms_median, failed, comparison_id, created_at, result_json) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                r.id,
                r.launch_id,
                r.recipe,
                r.spec_hash,
                r.cache_vintage,
                r.cache_root,
                r.score,
                r.p99_ttft_ms,
                r.p99_tpot_ms,
                ss.decode_ms_median if ss else None,
                r.failed,
                comparison_id,
                r.finished_at,
                r.model_dump_json(),
            ),
        )

    def add_benchmark(self, result: BenchResult) -> None:
        with self._tx() as db:
            self._insert_bench(db, result, None)

    def add_comparison(
        self,
        comparison_id: str,
        baselines: list[BenchResult],
        candidates: list[BenchResult],
        gate: GateResult,
        others: list[BenchResult] | None = None,
    ) -> None:
        """All benches of a compare and its verdict, in one transaction (`others`: an eager twin's
        runs, measured for an arm's token-stream evidence)."""
        with self._tx() as db:
            for r in [*baselines, *candidates, *(others or [])]:
                self._insert_bench(db, r, comparison_id)
            db.execute(
                "INSERT INTO eval_comparisons (id, baseline, candidate, verdict, reasons_json, gate_json, "
                "created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    comparison_id,
                    baselines[0].recipe,
                    candidates[0].recipe,
                    gate.verdict.value,
                    json.dumps(gate.reasons),
                    gate.model_dump_json(),
                    time.time(),
                ),
            )

    def add_fingerprint(
        self,
        fp_id: str,
        launch_id: str | None,
        recipe: str,
        spec_hash: str | None,
        cache_root: str | None,
        cache_vintage: str | None,
        fp: Fingerprint,
        streams: list[list[int]],
        check: DeclaredCheck | None,
    ) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO eval_fingerprints (id, launch_id, recipe, spec_hash, cache_root, cache_vintage, "
                "measured, declared, mismatch, finding, serial_set_hash, streams_json, fingerprint_json, "
                "created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    fp_id,
                    launch_id,
                    recipe,
                    spec_hash,
                    cache_root,
                    cache_vintage,
                    fp.measured.value,
                    check.declared if check else None,
                    int(bool(check and check.mismatch)),
                    check.finding if check else fp.measured.value,
                    fp.serial_set_hash,
                    json.dumps(streams),
                    fp.model_dump_json(),
                    time.time(),
                ),
            )

    # ---- reads

    def benchmarks(
        self,
        limit: int = 50,
        recipe: str | None = None,
        *,
        launch_id: str | None = None,
        comparison_id: str | None = None,
        bench_id: str | None = None,
    ) -> list[dict[str, Any]]:
        """Newest first; each filter given narrows to the benches of that recipe, launch or compare
        (or to the one bench `bench_id`: its row, with the comparison it belongs to)."""
        filters = {"recipe": recipe, "launch_id": launch_id, "comparison_id": comparison_id, "id": bench_id}
        wanted = {column: value for column, value in filters.items() if value}
        # column names come from the fixed dict above, never from the caller
        where = ("WHERE " + " AND ".join(f"{column} = ?" for column in wanted)) if wanted else ""
        args = tuple(wanted.values())
        with self._lock:
            rows = self._db.execute(
                "SELECT id, launch_id, recipe, spec_hash, cache_vintage, cache_root, score, p99_ttft_ms, "
                "p99_tpot_ms, decode_ms_median, failed, comparison_id, created_at "
                f"FROM eval_benchmarks {where} "
                "ORDER BY created_at DESC LIMIT ?",
                (*args, limit),
            ).fetchall()
        return [dict(r) for r in rows]

    def benchmark(self, bench_id: str) -> BenchResult | None:
        with self._lock:
            row = self._db.execute(
                "SELECT result_json FROM eval_benchmarks WHERE id = ?", (bench_id,)
            ).fetchone()
        return None if row is None else BenchResult.model_validate_json(row["result_json"])

    def comparisons(self, limit: int = 50) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT id, baseline, candidate, verdict, reasons_json, created_at FROM eval_comparisons "
                "ORDER BY created_at DESC LIMIT ?",
                (limit,),
            ).fetchall()
        return [
            {
                **{k: v for k, v in dict(r).items() if k != "reasons_json"},
                "reasons": json.loads(r["reasons_json"]),
            }
            for r in rows
        ]

    def comparison(self, comparison_id: str) -> tuple[dict[str, Any], GateResult] | None:
        """One stored comparison: its row and its whole verdict (every step with its evidence)."""
        with self._lock:
            row = self._db.execute(
                "SELECT id, baseline, candidate, verdict, created_at, gate_json FROM eval_comparisons "
                "WHERE id = ?",
                (comparison_id,),
            ).fetchone()
        if row is None:
            return None
        info = {k: row[k] for k in ("id", "baseline", "candidate", "verdict", "created_at")}
        return info, GateResult.model_validate_json(row["gate_json"])

    def fingerprints(self, limit: int = 50, recipe: str | None = None) -> list[dict[str, Any]]:
        where, args = ("WHERE recipe = ?", (recipe,)) if recipe else ("", ())
        with self._lock:
            rows = self._db.execute(
                "SELECT id, launch_id, recipe, spec_hash, cache_root, cache_vintage, measured, declared, "
                "mismatch, "
                "finding, serial_set_hash, created_at "
                f"FROM eval_fingerprints {where} ORDER BY created_at DESC "
                "LIMIT ?",
                (*args, limit),
            ).fetchall()
        return [{**dict(r), "mismatch": bool(r["mismatch"])} for r in rows]

    def restart_reference(
        self,
        recipe: str,
        spec_hash: str | None,
        cache_root: str | None,
        prompt_set: str,
        max_tokens: int,
        launch_id: str | None,
    ) -> tuple[str, list[list[int]]] | None:
        """The latest serial streams of the same recipe variant and cache root from another launch."""
        with self._lock:
            rows = self._db.execute(
                "SELECT launch_id, streams_json, fingerprint_json FROM eval_fingerprints "
                "WHERE recipe = ? AND "
                "spec_hash IS ? AND cache_root IS ? AND launch_id IS NOT ? ORDER BY created_at DESC",
                (recipe, spec_hash, cache_root, launch_id),
            ).fetchall()
        for row in rows:
            fp = json.loads(row["fingerprint_json"])
            if fp.get("prompt_set") == prompt_set and fp.get("max_tokens") == max_tokens:
                return str(row["launch_id"]), [list(map(int, s)) for s in json.loads(row["streams_json"])]
        return None

    def latest_by_recipe(self) -> dict[str, dict[str, Any]]:
        """The newest benchmark (its `id` and figures) and fingerprint per recipe (for the metrics
        collector and the console's side-by-side chart)."""
        out: dict[str, dict[str, Any]] = {}
        with self._lock:
            for r in self._db.execute(
                "SELECT recipe, id, score, p99_ttft_ms, p99_tpot_ms, decode_ms_median, created_at "
                "FROM eval_benchmarks b "
                "WHERE created_at = (SELECT MAX(created_at) FROM eval_benchmarks WHERE recipe = b.recipe)"
            ).fetchall():
                out.setdefault(r["recipe"], {}).update({k: v for k, v in dict(r).items() if k != "recipe"})
            for r in self._db.execute(
                "SELECT recipe, mismatch, measured FROM eval_fingerprints f WHERE created_at = "
                "(SELECT MAX(created_at) FROM eval_fingerprints WHERE recipe = f.recipe)"
            ).fetchall():
                out.setdefault(r["recipe"], {}).update(
                    {"mismatch": bool(r["mismatch"]), "measured": r["measured"]}
                )
        return out
