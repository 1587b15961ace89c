"""Who is calling: client keys (from the key store, cached) and the admin token.

The gateway must answer a revoke without a restart but must not touch SQLite on every request:
``KeyCache`` keeps every key in memory and re-reads the store when the file is another one (inode,
size, mtime) or its version row changed, checked once per ``refresh_s`` in a worker thread.

The cache fails closed: it is trusted for ``max_stale_s`` after the last check that succeeded. If the
store is deleted, unreadable, or cannot be opened (no file descriptor left), requests get 503 once
that window has passed, never an answer from keys that may have been revoked since.

A key works the moment its creation returns (it was refused with 401 for up to
``refresh_s``): a well-formed key whose id the cache does not know makes ``authenticate_fresh`` check
the store once more before it answers 401. Those checks are shared and spaced: a check that has not
started yet is joined by every request that arrives meanwhile, and a new one starts at most once per
``reload_gap_s`` (100 ms), so a flood of made-up keys costs the store at most ten checks a second.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import sqlite3
import threading
import time
from dataclasses import dataclass
from enum import Enum

from controller.gateway.keystore import (
    FileIdentity,
    KeyRecord,
    KeyStore,
    KeyStoreError,
    StoredKey,
    key_id_of,
)

log = logging.getLogger(__name__)

RELOAD_GAP_S = 0.1  # the shortest time between two store checks made for unknown key ids


class AuthFailure(Enum):
    MISSING = "missing API key: send 'Authorization: Bearer sk-app-…'"
    INVALID = "invalid API key"
    REVOKED = "API key has been revoked"
    # Not the client's fault: the key store could not be read recently enough to trust the cache.
    UNAVAILABLE = "the key store cannot be read; try again shortly"


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
    """In-memory view of the key store, refreshed when the file or its version changes."""

    def __init__(self, store: KeyStore, refresh_s: float = 1.0, max_stale_s: float = 10.0,
                 reload_gap_s: float = RELOAD_GAP_S) -> None:
        self.store = store
        self.refresh_s = refresh_s
        self.max_stale_s = max(max_stale_s, refresh_s)
        self.reload_gap_s = reload_gap_s
        self.reloads_for_unknown = 0  # store checks made for an unknown key id (tests, debugging)
        self._last_unknown_reload = -reload_gap_s
        self._next_reload: asyncio.Future[None] | None = None  # scheduled, not yet reading the store
        # The periodic refresher and the on-demand check run in worker threads: one at a time, so a
        # slower read of an older snapshot never overwrites a newer one.
        self._refresh_lock = threading.Lock()
        self._version = -1
        self._identity: FileIdentity | None = None
        self._keys: dict[str, StoredKey] = {}
        self._last_check = 0.0
        self._fresh_until = 0.0  # monotonic; before load() nothing is trusted
        self._failing = False

    @property
    def size(self) -> int:
        return len(self._keys)

    def names(self) -> dict[str, str]:
        """Key id → the operator's name for it (revoked keys included): the key_info metric."""
        return {key_id: stored.record.name for key_id, stored in self._keys.items()}

    @property
    def fresh(self) -> bool:
        return time.monotonic() <= self._fresh_until

    def load(self, create: bool = False) -> None:
        """Read the whole store now (blocking; at start-up, ``create`` makes an empty one if none)."""
        # Identity first: if the file changes between the stat and the read, the next check sees a
        # different identity and reads again (never the other way round).
        identity = None if create else self.store.identity()
        version, keys = self.store.snapshot(create=create)
        self._identity = identity or self.store.identity()
        self._version, self._keys = version, keys
        self._mark_fresh()

    def _mark_fresh(self) -> None:
        self._last_check = time.monotonic()
        self._fresh_until = self._last_check + self.max_stale_s
        self._failing = False

    def refresh_if_changed(self) -> bool:
        """Blocking: re-read the store if it is another file or its version moved. Returns True if
        it re-read. Raises ``KeyStoreError``/``sqlite3.Error``/``OSError`` when it cannot tell."""
        with self._refresh_lock:
            if self.store.identity() != self._identity or self.store.version() != self._version:
                self.load()
                return True
            self._mark_fresh()
            return False

    async def run_refresher(self) -> None:
        """Check the store forever (cancel to stop). A store that cannot be read keeps the cached keys
        for ``max_stale_s`` at most (a CLI write lock is short), then every request gets 503."""
        while True:
            await asyncio.sleep(self.refresh_s)
            try:
                changed = await asyncio.to_thread(self.refresh_if_changed)
            except (KeyStoreError, sqlite3.Error, OSError) as exc:
                if not self._failing:
                    self._failing = True
                    log.warning(
                        "key store %s unreadable: %s; the %d cached keys are trusted for %g s more, "
                        "then every request gets 503 until it can be read",
                        self.store.path,
                        exc,
                        len(self._keys),
                        max(0.0, self._fresh_until - time.monotonic()),
                    )
                continue
            if changed:
                log.info("key store changed: %d keys loaded (version %d)", len(self._keys), self._version)

    async def authenticate_fresh(self, authorization: bytes | None) -> KeyRecord | AuthFailure:
        """``authenticate``, but a well-formed key with an id the cache does not know is looked up
        again after one (shared, spaced) check of the store: a key created a moment ago works."""
        result = self.authenticate(authorization)
        if result is not AuthFailure.INVALID:
            return result
        token = bearer_token(authorization)
        key_id = key_id_of(token) if token else None
        if key_id is None or key_id in self._keys:
            return result  # malformed, or a known id with the wrong secret: nothing to re-read
        await self._check_store_soon()
        return self.authenticate(authorization)

    async def _check_store_soon(self) -> None:
        """Wait for a store check that starts after this call (joining one already scheduled)."""
        pending = self._next_reload
        if pending is None or pending.done():  # (done: cancelled while it waited, at shutdown)
            pending = asyncio.ensure_future(self._spaced_check())
            self._next_reload = pending
        # Shielded: a client that goes away does not cancel the check others wait for.
        await asyncio.shield(pending)

    async def _spaced_check(self) -> None:
        wait = self._last_unknown_reload + self.reload_gap_s - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        self._next_reload = None  # from here on, a newcomer needs the next check
        self._last_unknown_reload = time.monotonic()
        self.reloads_for_unknown += 1
        try:
            changed = await asyncio.to_thread(self.refresh_if_changed)
        except (KeyStoreError, sqlite3.Error, OSError):
            return  # the periodic refresher reports and handles an unreadable store
        if changed:
            log.info("key store changed (unknown key id): %d keys loaded (version %d)",
                     len(self._keys), self._version)

    def authenticate(self, authorization: bytes | None) -> KeyRecord | AuthFailure:
        token = bearer_token(authorization)
        if token is None:
            return AuthFailure.MISSING
        if time.monotonic() > self._fresh_until:
            return AuthFailure.UNAVAILABLE
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
