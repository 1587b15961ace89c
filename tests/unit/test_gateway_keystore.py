"""Key store: only hashes on disk, version bumps on every change, revoke is idempotent."""

from __future__ import annotations

import hashlib
import sqlite3
import stat
from pathlib import Path

import pytest

from controller.gateway.keystore import KeyNotFound, KeyStore, KeyStoreError, hash_key, key_id_of


def test_create_stores_only_the_hash(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "keys.sqlite3")
    record, key = store.create("alice", rpm_limit=60, max_concurrent=2)
    assert key.startswith("sk-app-" + record.id + "-")
    assert key_id_of(key) == record.id
    raw = (tmp_path / "keys.sqlite3").read_bytes()
    # the whole secret, not what follows its last '-': url-safe secrets contain '-', and a two-letter
    # tail can occur in any database file by chance (this test failed once that way)
    secret = key.removeprefix("sk-app-" + record.id + "-")
    assert len(secret) >= 32
    assert secret.encode() not in raw and key.encode() not in raw
    rows = sqlite3.connect(tmp_path / "keys.sqlite3").execute("SELECT key_sha256 FROM keys").fetchall()
    assert rows == [(hashlib.sha256(key.encode()).hexdigest(),)]
    assert stat.S_IMODE((tmp_path / "keys.sqlite3").stat().st_mode) == 0o600


def test_keys_are_random_and_listed_without_secrets(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "k.db")
    (r1, k1), (r2, k2) = store.create("a"), store.create("b", max_concurrent=1)
    assert k1 != k2 and r1.id != r2.id
    listed = store.list()
    assert [r.name for r in listed] == ["a", "b"]
    assert listed[1].max_concurrent == 1 and listed[1].rpm_limit is None
    assert "key" not in listed[0].as_dict() and "key_sha256" not in listed[0].as_dict()


def test_version_moves_on_every_change(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "k.db")
    store.snapshot(create=True)  # the gateway makes the empty store at start; reads never do
    v0 = store.version()
    record, _ = store.create("a")
    v1 = store.version()
    store.revoke(record.id)
    v2 = store.version()
    assert v0 < v1 < v2
    # A change made with plain SQL (another tool) is noticed too: the triggers do it.
    with sqlite3.connect(tmp_path / "k.db") as conn:
        conn.execute("DELETE FROM keys")
    assert store.version() > v2


def test_revoke_is_idempotent_and_unknown_ids_fail(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "k.db")
    record, _ = store.create("a")
    first = store.revoke(record.id)
    assert first.revoked is not None and not first.active
    assert store.revoke(record.id).revoked == first.revoked
    assert store.list(include_revoked=False) == []
    with pytest.raises(KeyNotFound):
        store.revoke("0123456789ab")
    with pytest.raises(KeyNotFound):
        store.revoke("not-an-id")


def test_snapshot_has_digests(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "k.db")
    record, key = store.create("a")
    version, keys = store.snapshot()
    assert version == store.version()
    assert keys[record.id].digest == bytes.fromhex(hash_key(key))


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "sk-app-",
        "sk-app-XYZ",
        "Bearer sk-app-0123456789ab-" + "a" * 43,
        "sk-app-0123456789ab-short",
        "sk-other-0123456789ab-" + "a" * 43,
    ],
)
def test_malformed_keys_have_no_id(bad: str) -> None:
    assert key_id_of(bad) is None


@pytest.mark.parametrize(
    ("name", "rpm", "conc"), [("", None, None), ("  ", None, None), ("a", 0, None), ("a", None, 0),
                              ("evil\x1b[2J", None, None), ("two\nlines", None, None),
                              ("bell\x07", None, None)]
)
def test_create_rejects_bad_input(tmp_path: Path, name: str, rpm: int | None, conc: int | None) -> None:
    with pytest.raises(KeyStoreError):
        KeyStore(tmp_path / "k.db").create(name, rpm, conc)


def test_new_store_files_are_0600_from_the_start(tmp_path: Path) -> None:
    import os

    old = os.umask(0o022)  # the usual umask: a plain create would give 0644
    try:
        store = KeyStore(tmp_path / "k.db")
        store.create("a")
    finally:
        os.umask(old)
    for path in tmp_path.iterdir():  # the store and SQLite's -wal / -shm beside it
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path.name


def test_a_deleted_store_is_an_error_and_is_not_recreated(tmp_path: Path) -> None:
    from controller.gateway.keystore import KeyStoreUnavailable

    path = tmp_path / "k.db"
    store = KeyStore(path)
    store.create("a")
    for p in tmp_path.iterdir():
        p.unlink()
    with pytest.raises(KeyStoreUnavailable):
        store.identity()
    with pytest.raises(KeyStoreUnavailable):
        store.snapshot()
    with pytest.raises(KeyStoreUnavailable):
        store.version()
    assert not path.exists()  # before: a 0-byte, 0644 file appeared here


@pytest.mark.parametrize("fresh", [True, False])
def test_reads_never_create_the_store(tmp_path: Path, fresh: bool) -> None:
    """`GET /keys`, the console's Keys page and `appliance keys list` once recreated a
    deleted store, and clients then got 401 instead of the gateway's 503 + Retry-After."""
    path = tmp_path / "k.db"
    if not fresh:
        KeyStore(path).create("a")
        for p in tmp_path.iterdir():
            p.unlink()
    store = KeyStore(path)
    assert store.list() == [] and store.list(include_revoked=False) == []
    with pytest.raises(KeyNotFound):
        store.get("0123456789abcdef")
    with pytest.raises(KeyNotFound):
        store.revoke("0123456789abcdef")
    assert list(tmp_path.iterdir()) == []  # nothing made
    store.create("b")  # only a create makes one
    assert [r.name for r in store.list()] == ["b"]


def test_identity_tells_a_replaced_file_apart(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    store = KeyStore(path)
    store.create("a")
    before = store.identity()
    assert store.identity() == before
    other = KeyStore(tmp_path / "other.db")
    other.create("b")
    (tmp_path / "other.db").replace(path)
    assert store.identity() != before
