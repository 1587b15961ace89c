"""controller/sqlite_db.py, the one SQLite discipline: what lets the gateway import it, and how
`migrate` behaves where stores share a file between processes."""

from __future__ import annotations

import ast
import sqlite3
import sys
from pathlib import Path

import pytest

from controller import sqlite_db
from controller.sqlite_db import Schema, SchemaTooNew, migrate, prepare_file

SCHEMA = Schema("test store", (("CREATE TABLE t (a INTEGER)",), ("ALTER TABLE t ADD COLUMN b INTEGER",)))


def test_the_helper_imports_the_standard_library_only() -> None:
    """The gateway (its own process) may import this one module of the controller
    (pyproject.toml: the ignored arrow in the gateway's contract); that is only safe while it brings
    nothing else along. import-linter holds it off the project's packages; this holds it off
    third-party ones too."""
    tree = ast.parse(Path(sqlite_db.__file__).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
    assert imported, "the walk found no import: it is not reading the module"
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported - set(sys.stdlib_module_names)


def open_db(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


def test_migrations_apply_in_order_and_are_counted(tmp_path: Path) -> None:
    db = open_db(tmp_path / "a.db")
    assert migrate(db, SCHEMA, upto=1) == 1
    assert [r[1] for r in db.execute("PRAGMA table_info(t)")] == ["a"]
    assert migrate(db, SCHEMA) == 2
    assert [r[1] for r in db.execute("PRAGMA table_info(t)")] == ["a", "b"]
    assert migrate(db, SCHEMA) == 2  # nothing left to apply


def test_a_stale_read_of_the_version_does_not_apply_a_migration_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes open an old file at once: both read version 0 before either writes. The second
    must read the version again under the write lock, or it re-runs migration 1 ("table t already
    exists"). Simulated: the first read (outside the lock) says 0, as it did before the other
    process migrated."""
    path = tmp_path / "a.db"
    migrate(open_db(path), SCHEMA)  # the other process, done
    real = sqlite_db.check_version
    reads: list[int] = []

    def stale_first(db: sqlite3.Connection, schema: Schema, where: object = "") -> int:
        reads.append(1)
        return 0 if len(reads) == 1 else real(db, schema, where)

    monkeypatch.setattr(sqlite_db, "check_version", stale_first)
    assert migrate(open_db(path), SCHEMA) == 2
    assert len(reads) == 2


def test_an_unversioned_file_is_stamped_from_its_tables(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    old = open_db(path)
    old.execute("CREATE TABLE t (a INTEGER)")  # what the store wrote before it counted: version 1
    old.close()
    schema = Schema("test store", SCHEMA.migrations,
                    unversioned=lambda db: 1 if db.execute("PRAGMA table_info(t)").fetchall() else 0)
    assert prepare_file(path, schema, timeout=5.0) == 2
    db = open_db(path)
    assert [r[1] for r in db.execute("PRAGMA table_info(t)")] == ["a", "b"]
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert prepare_file(tmp_path / "new.db", schema, timeout=5.0) == 2  # empty: every migration


def test_a_newer_file_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "a.db"
    db = open_db(path)
    db.execute("PRAGMA user_version = 3")
    with pytest.raises(SchemaTooNew, match=r"test store .*a\.db has schema version 3, newer than this code"):
        migrate(db, SCHEMA, where=path)
    assert db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0


def test_a_shared_file_is_created_private(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "a.db"
    prepare_file(path, SCHEMA, timeout=5.0)
    assert path.stat().st_mode & 0o777 == 0o600
