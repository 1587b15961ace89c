"""Key cache and admin token: constant-time checks, revoke noticed through the version row."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from controller.gateway import auth
from controller.gateway.auth import AdminAuth, AuthFailure, KeyCache, bearer_token, hash_admin_token
from controller.gateway.keystore import KeyRecord, KeyStore


def bearer(key: str) -> bytes:
    return f"Bearer {key}".encode()


def test_authenticate_outcomes(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "k.db")
    record, key = store.create("a")
    other_record, other_key = store.create("b")
    cache = KeyCache(store)
    cache.load()
    assert cache.authenticate(None) is AuthFailure.MISSING
    assert cache.authenticate(b"Basic abc") is AuthFailure.MISSING
    assert cache.authenticate(b"Bearer ") is AuthFailure.MISSING
    assert cache.authenticate(bearer("nonsense")) is AuthFailure.INVALID
    # Right id, wrong secret: the hash comparison must refuse it.
    forged = key[: len("sk-app-") + 13] + "A" * 43
    assert cache.authenticate(bearer(forged)) is AuthFailure.INVALID
    # Someone else's secret under this id.
    assert cache.authenticate(bearer(key[:20] + other_key[20:])) is AuthFailure.INVALID
    got = cache.authenticate(bearer(key))
    assert isinstance(got, KeyRecord) and got.id == record.id
    assert cache.authenticate(b"bearer " + key.encode()) == got  # scheme is case-insensitive
    assert isinstance(cache.authenticate(bearer(other_key)), KeyRecord)
    assert other_record.id != record.id


def test_revoke_and_create_are_seen_after_refresh(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "k.db")
    record, key = store.create("a")
    cache = KeyCache(store)
    cache.load()
    assert not cache.refresh_if_changed()  # nothing changed: no reload
    store.revoke(record.id)
    _, new_key = store.create("b")
    assert cache.authenticate(bearer(key)) != AuthFailure.REVOKED  # not yet: cache is stale
    assert cache.refresh_if_changed()
    assert cache.authenticate(bearer(key)) is AuthFailure.REVOKED
    # A revoked key's id with a wrong secret is invalid, not "revoked": only the holder learns that
    # (a mutant checking revocation before the secret survived the suite).
    forged = key[: len("sk-app-") + 13] + "A" * 43
    assert cache.authenticate(bearer(forged)) is AuthFailure.INVALID
    assert isinstance(cache.authenticate(bearer(new_key)), KeyRecord)
    assert cache.size == 2


def test_bearer_token_parsing() -> None:
    assert bearer_token(b"Bearer  abc ") == "abc"
    assert bearer_token(b"Bearer \xff") is None
    assert bearer_token(b"") is None


def test_admin_auth() -> None:
    digest = hash_admin_token("s3cret")
    auth = AdminAuth(digest)
    assert auth.enabled
    assert auth.check(b"Bearer s3cret")
    assert not auth.check(b"Bearer s3cre")
    assert not auth.check(None)
    assert AdminAuth(digest.upper()).check(b"Bearer s3cret")  # hex case does not matter
    closed = AdminAuth(None)
    assert not closed.enabled and not closed.check(b"Bearer s3cret")


def _same_version_copy_without(store: KeyStore, dest: Path, key_id: str) -> None:
    """A copy of ``store`` without ``key_id`` whose version row equals the original's."""
    import sqlite3

    version = store.version()
    src = sqlite3.connect(store.path)
    out = sqlite3.connect(dest)
    src.backup(out)
    src.close()
    out.execute("DELETE FROM keys WHERE id = ?", (key_id,))
    out.execute("UPDATE meta SET v = ? WHERE k = 'version'", (version,))
    out.commit()
    out.execute("PRAGMA journal_mode=DELETE")  # one self-contained file, as a copied store would be
    out.close()


def test_a_replaced_store_at_the_same_version_is_reloaded(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "k.db")
    _, keep = store.create("keep")
    removed, gone = store.create("gone")
    cache = KeyCache(store)
    cache.load()
    assert isinstance(cache.authenticate(bearer(gone)), KeyRecord)
    _same_version_copy_without(store, tmp_path / "new.db", removed.id)
    assert KeyStore(tmp_path / "new.db").version() == store.version()
    for suffix in ("-wal", "-shm"):
        (tmp_path / f"k.db{suffix}").unlink(missing_ok=True)
    (tmp_path / "new.db").replace(tmp_path / "k.db")
    assert cache.refresh_if_changed()  # before: same version → "nothing changed"
    assert cache.authenticate(bearer(gone)) is AuthFailure.INVALID
    assert isinstance(cache.authenticate(bearer(keep)), KeyRecord)


async def test_a_deleted_store_fails_closed_after_the_freshness_window(tmp_path: Path) -> None:
    import asyncio
    import contextlib

    path = tmp_path / "k.db"
    store = KeyStore(path)
    _, key = store.create("a")
    cache = KeyCache(store, refresh_s=0.01, max_stale_s=0.2)
    cache.load()
    task = asyncio.create_task(cache.run_refresher())
    try:
        await asyncio.sleep(0.05)
        assert isinstance(cache.authenticate(bearer(key)), KeyRecord) and cache.fresh
        for p in tmp_path.iterdir():
            p.unlink()
        for _ in range(500):  # bounded: 5 s
            if cache.authenticate(bearer(key)) is AuthFailure.UNAVAILABLE:
                break
            await asyncio.sleep(0.01)
        # Before: the cached keys were used forever (and the file came back empty, 0644).
        assert cache.authenticate(bearer(key)) is AuthFailure.UNAVAILABLE and not cache.fresh
        assert not path.exists()
        # The store comes back (the operator restores it): trusted again at the next check.
        KeyStore(path).create("b")
        for _ in range(500):
            if cache.fresh:
                break
            await asyncio.sleep(0.01)
        assert cache.authenticate(bearer(key)) is AuthFailure.INVALID  # a new store, the old key is not in it
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task



# ---- issue 23 item 19b: a key works the moment its creation returns ----------------------------


def _made_up(i: int) -> str:
    return f"sk-app-{i:012x}-" + "a" * 43  # well formed, unknown id


async def test_a_key_created_after_the_last_refresh_works_at_once(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "k.db")
    cache = KeyCache(store, refresh_s=1.0)
    cache.load(create=True)
    _, key = store.create("new")  # what POST /keys does; the periodic refresher has not run
    assert cache.authenticate(bearer(key)) is AuthFailure.INVALID  # the plain cache has not seen it
    found = await cache.authenticate_fresh(bearer(key))
    # found by one store check, not by waiting for the periodic refresh (no wall-clock bound: CI is loaded)
    assert isinstance(found, KeyRecord) and found.name == "new"
    assert cache.reloads_for_unknown == 1
    # a known key needs no store check; a known id with a wrong secret, a malformed key neither
    assert isinstance(await cache.authenticate_fresh(bearer(key)), KeyRecord)
    assert await cache.authenticate_fresh(bearer(key[:-1] + ("b" if key[-1] != "b" else "c"))) \
        is AuthFailure.INVALID
    assert await cache.authenticate_fresh(bearer("not-a-key")) is AuthFailure.INVALID
    assert await cache.authenticate_fresh(None) is AuthFailure.MISSING
    assert cache.reloads_for_unknown == 1


async def test_store_checks_for_unknown_keys_are_shared_and_spaced(tmp_path: Path) -> None:
    import asyncio
    import time

    store = KeyStore(tmp_path / "k.db")
    cache = KeyCache(store, reload_gap_s=0.1)
    cache.load(create=True)
    # A burst of made-up keys: one store check, shared by all.
    results = await asyncio.gather(*(cache.authenticate_fresh(bearer(_made_up(i))) for i in range(50)))
    assert set(results) == {AuthFailure.INVALID} and cache.reloads_for_unknown == 1
    # One after another: at most one check per 100 ms.
    t0 = time.monotonic()
    for i in range(4):
        assert await cache.authenticate_fresh(bearer(_made_up(100 + i))) is AuthFailure.INVALID
    assert cache.reloads_for_unknown == 5 and time.monotonic() - t0 >= 0.35
    # A key created while a spaced check is already waiting to start is seen by that check.
    waiting = asyncio.ensure_future(cache.authenticate_fresh(bearer(_made_up(999))))
    await asyncio.sleep(0)
    _, key = store.create("late")
    assert isinstance(await cache.authenticate_fresh(bearer(key)), KeyRecord)
    assert await waiting is AuthFailure.INVALID


# ---- boundaries the mutation run over this module found unpinned (docs/mutation-testing.md) ------


class _Clock:
    """The auth module's monotonic clock, driven by hand (the event loop keeps the real one)."""

    def __init__(self) -> None:
        self.t = 1000.0
        self.slept: list[object] = []

    def monotonic(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += seconds
        await asyncio.sleep(0)


def _drive(monkeypatch: pytest.MonkeyPatch, clock: _Clock) -> None:
    """Route the auth module's clock and its sleeps (only those) through `clock`."""

    class _Asyncio:
        sleep = staticmethod(clock.sleep)

        def __getattr__(self, name: str) -> object:
            return getattr(asyncio, name)

    monkeypatch.setattr(auth, "time", SimpleNamespace(monotonic=clock.monotonic))
    monkeypatch.setattr(auth, "asyncio", _Asyncio())


def test_before_load_nothing_is_trusted(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "k.db")
    _, key = store.create("a")
    cache = KeyCache(store)
    assert cache.authenticate(bearer(key)) is AuthFailure.UNAVAILABLE and not cache.fresh


def test_load_without_create_never_makes_a_missing_store(tmp_path: Path) -> None:
    from controller.gateway.keystore import KeyStoreError

    path = tmp_path / "k.db"
    with pytest.raises(KeyStoreError):
        KeyCache(KeyStore(path)).load()
    assert not path.exists()  # a deleted store stays deleted: clients get 503, not 401


async def test_unknown_key_checks_are_shared_then_spaced_by_the_gap(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    _drive(monkeypatch, clock)
    store = KeyStore(tmp_path / "k.db")
    cache = KeyCache(store, reload_gap_s=0.5)
    cache.load(create=True)
    # A burst: one store check shared by all, started at once (the first check waits for nothing).
    burst = asyncio.gather(*(cache.authenticate_fresh(bearer(_made_up(i))) for i in range(20)))
    assert set(await asyncio.wait_for(burst, 10)) == {AuthFailure.INVALID}
    assert (cache.reloads_for_unknown, clock.slept) == (1, [])
    # The next one at the same instant waits out the whole gap, then checks again.
    assert await asyncio.wait_for(cache.authenticate_fresh(bearer(_made_up(100))), 10) is AuthFailure.INVALID
    assert (cache.reloads_for_unknown, clock.slept) == (2, [0.5])
    # Exactly one gap later: no wait at all.
    clock.t += 0.5
    assert await asyncio.wait_for(cache.authenticate_fresh(bearer(_made_up(101))), 10) is AuthFailure.INVALID
    assert (cache.reloads_for_unknown, clock.slept) == (3, [0.5])


async def test_an_unreadable_store_is_reported_once_per_outage(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    clock = _Clock()
    _drive(monkeypatch, clock)
    path = tmp_path / "k.db"
    store = KeyStore(path)
    store.create("a")
    cache = KeyCache(store, refresh_s=1.0, max_stale_s=10.0)
    cache.load()

    async def checks(n: int) -> None:
        start = len(clock.slept)
        task = asyncio.ensure_future(cache.run_refresher())
        while len(clock.slept) < start + n + 1:  # n checks done, the next sleep begun
            await asyncio.sleep(0.01)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]

    caplog.set_level(logging.INFO, logger="controller.gateway.auth")
    for p in tmp_path.iterdir():
        p.unlink()
    await asyncio.wait_for(checks(3), 10)
    (first,) = warnings()
    assert str(path) in first and "every request gets 503" in first
    KeyStore(path).create("b")  # restored: read again, trusted again
    await asyncio.wait_for(checks(1), 10)
    assert cache.fresh and len(warnings()) == 1
    for p in tmp_path.iterdir():
        p.unlink()
    await asyncio.wait_for(checks(2), 10)
    assert len(warnings()) == 2  # a new outage is reported again
