"""Console log-in: the admin token buys a session; the session carries a CSRF token.

- The operator types the admin token once; it is compared in constant time with the configured
  sha256 (controller/admin_token.py) and never stored, logged or rendered.
- The browser gets a cookie signed with itsdangerous (a per-process random key) holding only a
  random session id. The session itself lives here, server side: its expiry, its CSRF token and a
  fingerprint of the admin-token hash it was opened with — so logging out, expiring or rotating the
  admin token ends it at once, whatever the browser still holds. A controller restart ends every
  session (the signing key is new): operators log in again.
- The cookie is HttpOnly (no script reads it), SameSite=Strict (no other site's page sends it) and
  expires with the session.
- Every state-changing form carries the session's CSRF token (a synchronizer token, compared in
  constant time). The log-in form, which has no session yet, carries a short-lived signed token.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from itsdangerous import BadSignature, SignatureExpired, URLSafeTimedSerializer

from controller import admin_token

COOKIE = "appliance_console"
COOKIE_PATH = "/console"
DEFAULT_TTL_S = 8 * 3600  # one working shift
LOGIN_FORM_TTL_S = 3600
MAX_SESSIONS = 64  # a loop of log-ins cannot grow the table without bound: the oldest goes
# Failed log-ins: a few are free, then each further failure from the same client address doubles how
# long its answer is held back (1 s, 2 s, 4 s … at most 5 minutes). A success clears it; a right token is
# never held back nor refused (LoginThrottle).
FREE_LOGIN_FAILURES = 3
MAX_LOGIN_WAIT_S = 300.0
MAX_THROTTLED_CLIENTS = 4096  # addresses remembered; the stalest go first


class LoginError(Exception):
    """Why a log-in was refused, in words the page can show."""


@dataclass
class Session:
    sid: str
    csrf: str
    expires_at: float
    token_fingerprint: str  # sha256 of the admin-token hash the session was opened with


def _fingerprint(configured_hash: str) -> str:
    return hashlib.sha256(b"console-session:" + configured_hash.encode()).hexdigest()


class Sessions:
    """Server-side sessions behind a signed cookie. Thread-safe; `clock` is injectable for tests."""

    def __init__(self, home: Path, ttl_s: float = DEFAULT_TTL_S, clock: Callable[[], float] = time.time,
                 secret: bytes | None = None) -> None:
        self.home = home
        self.ttl_s = ttl_s
        self.clock = clock
        key = secret or secrets.token_bytes(32)
        self._cookie = URLSafeTimedSerializer(key, salt="appliance-console-session")
        self._login_form = URLSafeTimedSerializer(key, salt="appliance-console-login-form")
        self._live: dict[str, Session] = {}
        self._lock = threading.Lock()

    # -- log-in

    def login_form_token(self) -> str:
        return self._login_form.dumps(secrets.token_urlsafe(8))

    def login_form_token_ok(self, presented: str) -> bool:
        try:
            self._login_form.loads(presented, max_age=LOGIN_FORM_TTL_S)
        except (BadSignature, SignatureExpired):
            return False
        return True

    def login(self, token: str) -> tuple[Session, str]:
        """A new session and its cookie value, or LoginError (nothing is created)."""
        try:
            expected = admin_token.configured_hash(self.home)
        except ValueError as exc:
            raise LoginError(f"the admin token is misconfigured on this controller: {exc}") from exc
        if expected is None:
            raise LoginError(
                f"no admin token is configured (set {admin_token.HASH_ENV} or run `appliance up`)"
            )
        if not token or not admin_token.matches(token, expected):
            raise LoginError("wrong admin token")
        session = Session(
            sid=secrets.token_urlsafe(24), csrf=secrets.token_urlsafe(24),
            expires_at=self.clock() + self.ttl_s, token_fingerprint=_fingerprint(expected),
        )
        with self._lock:
            self._prune()
            while len(self._live) >= MAX_SESSIONS:
                oldest = min(self._live.values(), key=lambda s: s.expires_at)
                del self._live[oldest.sid]
            self._live[session.sid] = session
        return session, self._cookie.dumps(session.sid)

    def logout(self, session: Session) -> None:
        with self._lock:
            self._live.pop(session.sid, None)

    # -- each request

    def lookup(self, cookie: str | None) -> tuple[Session | None, str | None]:
        """(session, None) or (None, why not): why is shown on the log-in page."""
        if not cookie:
            return None, None
        try:
            sid = self._cookie.loads(cookie, max_age=int(self.ttl_s) + 60)
        except SignatureExpired:
            return None, "your session expired — log in again"
        except BadSignature:
            return None, "your session is not valid here (the controller may have restarted) — log in again"
        if not isinstance(sid, str):
            return None, "your session is not valid here — log in again"
        with self._lock:
            session = self._live.get(sid)
            if session is not None and self.clock() >= session.expires_at:
                del self._live[sid]
                return None, "your session expired — log in again"
        if session is None:
            return None, "your session ended (logged out, expired or the controller restarted) — log in again"
        try:
            expected = admin_token.configured_hash(self.home)
        except ValueError:
            expected = None
        if expected is None or not hmac.compare_digest(_fingerprint(expected), session.token_fingerprint):
            self.logout(session)
            return None, "the admin token changed — log in with the new one"
        return session, None

    def csrf_ok(self, session: Session, presented: str | None) -> bool:
        return bool(presented) and hmac.compare_digest(session.csrf.encode(), (presented or "").encode())

    def _prune(self) -> None:
        now = self.clock()
        for sid in [sid for sid, s in self._live.items() if now >= s.expires_at]:
            del self._live[sid]


class LoginThrottle:
    """Per-client-address backoff for failed console log-ins. Thread-safe; `clock` and `sleep`
    injectable (tests advance a fake clock instead of waiting).

    A wrong token's answer is held back; a right one is never refused nor delayed. Refusing every
    try while a backoff lasted let any local user lock the operator out (four wrong tokens from
    127.0.0.1, the operator's own address behind an SSH tunnel, and the right token got 429 for up
    to 5 minutes). Holding back failures instead still slows guessing: a guesser learns "wrong"
    only after the wait, and failures from one address in parallel queue behind each other (each
    one's wait starts where the previous one's ends, at most `max_wait_s` ahead), so holding many
    connections open buys a guesser little."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, free: int = FREE_LOGIN_FAILURES,
                 max_wait_s: float = MAX_LOGIN_WAIT_S,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.clock = clock
        self.free = free
        self.max_wait_s = max_wait_s
        self.sleep = sleep  # how the caller waits out a failure's delay
        self._failures: dict[str, tuple[int, float]] = {}  # client -> (failures in a row, answered until)
        self._lock = threading.Lock()

    def failed(self, client: str) -> tuple[int, float]:
        """Count a failure; (failures in a row, seconds to hold this failure's answer back)."""
        now = self.clock()
        with self._lock:
            count, busy_until = self._failures.pop(client, (0, 0.0))
            count += 1
            backoff = 0.0 if count <= self.free else 2.0 ** (count - self.free - 1)
            # Queued behind the failures from this address still being held back.
            delay = min(self.max_wait_s, max(0.0, busy_until - now) + backoff)
            self._failures[client] = (count, now + delay)
            while len(self._failures) > MAX_THROTTLED_CLIENTS:  # dicts keep order: least recent first
                del self._failures[next(iter(self._failures))]
        return count, delay

    def succeeded(self, client: str) -> None:
        with self._lock:
            self._failures.pop(client, None)
