"""Key cache and admin token: constant-time checks, revoke noticed through the version row."""

from __future__ import annotations

from pathlib import Path

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
