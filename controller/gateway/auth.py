"""Who is calling: client keys (from the key store, cached) and the admin token.

The gateway must answer a revoke without a restart but must not touch SQLite on every request:
``KeyCache`` keeps every key in memory and re-reads the store only when its version row changed,
checked at most once per ``refresh_s`` (one integer read in a worker thread).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import sqlite3
import time
from dataclasses import dataclass
from enum import Enum

from controller.gateway.keystore import KeyRecord, KeyStore, StoredKey, key_id_of

log = logging.getLogger(__name__)


class AuthFailure(Enum):
    MISSING = "missing API key: send 'Authorization: Bearer sk-app-…'"
    INVALID = "invalid API key"
    REVOKED = "API key has been revoked"


def bearer_token(header: bytes | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None."""
    if not header:
        return None
    scheme, _, token = header.partition(b" ")
    if scheme.lower() != b"bearer" or not token.strip():
        return None
    try:
        return token.strip().decode("ascii")
    except UnicodeDecodeError:
        return None


class KeyCache:
    """In-memory view of the key store, refreshed when the store's version changes."""

    def __init__(self, store: KeyStore, refresh_s: float = 1.0) -> None:
        self.store = store
        self.refresh_s = refresh_s
        self._version = -1
        self._keys: dict[str, StoredKey] = {}
        self._last_check = 0.0

    @property
    def size(self) -> int:
        return len(self._keys)

    def load(self) -> None:
        """Read the whole store now (blocking; used at start-up and after a version change)."""
        self._version, self._keys = self.store.snapshot()
        self._last_check = time.monotonic()

    def refresh_if_changed(self) -> bool:
        """Blocking: re-read the store if its version moved. Returns True if the keys changed."""
        self._last_check = time.monotonic()
        if self.store.version() == self._version:
            return False
        self.load()
        return True

    async def run_refresher(self) -> None:
        """Poll the version row forever (cancel to stop). A broken or locked store keeps the last
        good keys: refusing every client because the CLI held a write lock would be worse."""
        while True:
            await asyncio.sleep(self.refresh_s)
            try:
                changed = await asyncio.to_thread(self.refresh_if_changed)
            except (sqlite3.Error, OSError) as exc:
                log.warning(
                    "key store %s unreadable, keeping %d cached keys: %s",
                    self.store.path,
                    len(self._keys),
                    exc,
                )
                continue
            if changed:
                log.info("key store changed: %d keys loaded (version %d)", len(self._keys), self._version)

    def authenticate(self, authorization: bytes | None) -> KeyRecord | AuthFailure:
        token = bearer_token(authorization)
        if token is None:
            return AuthFailure.MISSING
        key_id = key_id_of(token)
        stored = self._keys.get(key_id) if key_id else None
        if stored is None:
            return AuthFailure.INVALID
        # The id is public; the secret part is what must not leak through timing.
        if not hmac.compare_digest(hashlib.sha256(token.encode()).digest(), stored.digest):
            return AuthFailure.INVALID
        if stored.record.revoked is not None:
            return AuthFailure.REVOKED
        return stored.record


@dataclass(frozen=True)
class AdminAuth:
    """The admin surface's bearer token, configured as its sha256 (hex) so that the gateway's
    environment never holds the token itself. No hash configured → the admin surface is closed."""

    token_sha256: str | None

    @property
    def enabled(self) -> bool:
        return bool(self.token_sha256)

    def check(self, authorization: bytes | None) -> bool:
        if not self.token_sha256:
            return False
        token = bearer_token(authorization)
        if token is None:
            return False
        presented = hashlib.sha256(token.encode()).hexdigest()
        return hmac.compare_digest(presented, self.token_sha256.strip().lower())


def hash_admin_token(token: str) -> str:
    """The value to put in ``APPLIANCE_ADMIN_TOKEN_SHA256`` for a given admin token."""
    return hashlib.sha256(token.encode()).hexdigest()
