"""What the admin API checks before any route runs: the Host header, the admin token, the body size.

Why a guard in front of FastAPI and not only route dependencies: FastAPI reads and parses a route's
JSON body *before* it solves the route's dependencies, so with the token check as a dependency an
unauthenticated 50 MB body to `/apply` was read into memory (84 → 218 MB) before the 401.
The guard is plain ASGI and runs on the request head alone:

1. Host (Starlette's TrustedHostMiddleware): only loopback names and configured ones, so a page that
   DNS-rebinds its own name to 127.0.0.1 cannot read even the open GETs (400 "Invalid host header").
2. Admin token for every request that may carry a body (any method but GET/HEAD/OPTIONS): 401/403
   decided from the `Authorization` header before one body byte is read. Every such route needs the
   token anyway; the route dependency (`AdminGuard`) stays, for GET /keys and for the OpenAPI schema.
3. Body size: `Content-Length` over the limit is 413 at once; a body without one (chunked) is counted
   as it is read and cut off with 413 at the limit. Admin bodies are a few hundred bytes.
4. JSON that no answer can carry back: NaN/Infinity/1e999 and lone surrogates are a
   422 with the reason (`StrictJson`), and FastAPI's own 422 never echoes such input
   (`install_error_handlers`): both were 500s with a traceback.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from appliance import settings
from controller import admin_token

# Admin bodies are tiny JSON objects ({"recipe": …}, {"name": …, "rpm_limit": …}).
MAX_BODY_BYTES = 64 * 1024
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
HOSTS_ENV = "APPLIANCE_ADMIN_HOSTS"  # extra names/addresses clients use, comma-separated
_WILDCARD_BINDS = ("", "0.0.0.0", "::", "[::]")
_BODYLESS = frozenset({"GET", "HEAD", "OPTIONS"})
CONSOLE_PREFIX = "/console/"


def allowed_hosts(listen_host: str | None = None, extra: Iterable[str] = (),
                  environ: dict[str, str] | None = None) -> list[str]:
    """Loopback names, the address the API listens on (not a wildcard), `extra`, $APPLIANCE_ADMIN_HOSTS."""
    config = settings.current() if environ is None else settings.Settings.from_environ(environ)
    names = list(LOOPBACK_HOSTS)
    if listen_host and listen_host not in _WILDCARD_BINDS:
        names.append(f"[{listen_host}]" if ":" in listen_host and not listen_host.startswith("[")
                     else listen_host)
    names += [n.strip() for n in extra if n.strip()]
    names += config.admin_hosts
    return list(dict.fromkeys(n.lower() for n in names))


def admin_refusal(home: Path, authorization: str | None) -> HTTPException | None:
    """Why this `Authorization` header does not carry the admin token, or None when it does.

    401 when no bearer token is presented, 403 when it is wrong or none is configured; the
    comparison is constant-time against the configured sha256 (controller.admin_token)."""
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return HTTPException(status.HTTP_401_UNAUTHORIZED, "missing bearer admin token",
                             headers={"WWW-Authenticate": "Bearer"})
    try:
        expected = admin_token.configured_hash(home)
    except ValueError as exc:
        return HTTPException(status.HTTP_403_FORBIDDEN, f"admin token misconfigured: {exc}")
    if expected is None:
        return HTTPException(status.HTTP_403_FORBIDDEN,
                             f"no admin token configured (set {admin_token.HASH_ENV} or run `appliance up`)")
    if not admin_token.matches(token, expected):
        return HTTPException(status.HTTP_403_FORBIDDEN, "wrong admin token")
    return None


async def _send_error(send: Send, exc: HTTPException) -> None:
    body = json.dumps({"detail": exc.detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"connection", b"close")]
    headers += [(k.lower().encode(), v.encode()) for k, v in (exc.headers or {}).items()]
    await send({"type": "http.response.start", "status": exc.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class AdminTokenFirst:
    """401/403 for any request that may carry a body, decided before the body is read."""

    def __init__(self, app: ASGIApp, home: Path) -> None:
        self.app = app
        self.home = home

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The console (controller/console/) authenticates its forms by session cookie + CSRF token and
        # checks the session before it reads a form body: a browser form cannot send a bearer token.
        if (scope["type"] == "http" and scope["method"] not in _BODYLESS
                and not scope["path"].startswith(CONSOLE_PREFIX)):
            refusal = admin_refusal(self.home, Headers(scope=scope).get("authorization"))
            if refusal is not None:
                await _send_error(send, refusal)
                return
        await self.app(scope, receive, send)


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(status.HTTP_413_CONTENT_TOO_LARGE,
                         f"request body larger than {limit} bytes")


class BodyLimit:
    """413 for a body over `max_bytes`: from Content-Length at once, else counted while it is read."""

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = Headers(scope=scope).get("content-length")
        if length is not None:
            if not length.strip().isdigit():
                await _send_error(send, HTTPException(status.HTTP_400_BAD_REQUEST, "bad Content-Length"))
                return
            if int(length) > self.max_bytes:
                await _send_error(send, BodyTooLarge(self.max_bytes))
                return
        seen = 0
        started = False

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    # FastAPI re-raises HTTPException from body reading, so this becomes the 413.
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except BodyTooLarge as exc:  # raised where nothing turned it into a response
            if not started:
                await _send_error(send, exc)



# ---- bodies and errors that must be a 4xx with a reason, never a 500 ------------

# SQLite's INTEGER is 64-bit signed: a larger query number raised OverflowError per request.
SQLITE_INT_MAX = 2**63 - 1


def _json_problem(text: str) -> str | None:
    """Why `text` (a JSON body) is refused, or None: non-finite numbers (`NaN`, `Infinity`, `1e999`,
    which Python's json accepts and no response can carry back) and lone surrogates (`"\\ud800"`,
    which cannot be written as UTF-8: not to SQLite, not into a response)."""

    def constant(name: str) -> float:
        raise ValueError(f"{name} is not a JSON number")

    def finite(literal: str) -> float:
        value = float(literal)
        if value in (float("inf"), float("-inf")):
            raise ValueError("a number out of range (not a finite 64-bit float)")
        return value

    try:
        data = json.loads(text, parse_constant=constant, parse_float=finite)
    except ValueError as exc:  # JSONDecodeError is one; FastAPI answers those itself
        return None if isinstance(exc, json.JSONDecodeError) else str(exc)
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return "a string holds a lone UTF-16 surrogate (not valid Unicode text)"
    except ValueError:  # json.dumps cannot fail otherwise on what json.loads built
        return "unreadable JSON"
    return None


def _json_content(scope: Scope) -> bool:
    """FastAPI parses a body as JSON when it has no content type or an application/…json one."""
    content_type = Headers(scope=scope).get("content-type")
    return content_type is None or "json" in content_type.lower()


def _validation_detail(errors: Sequence[Any]) -> list[dict[str, Any]]:
    """FastAPI's 422 detail, with the offending `input` kept only where it can be written back."""
    out = []
    for error in errors:
        item: dict[str, Any] = {"type": str(error.get("type", "value_error")),
                                "loc": [_printable(part) for part in error.get("loc", ())],
                                "msg": _printable(error.get("msg", "invalid value"))}
        value = error.get("input")
        try:
            json.dumps(value, allow_nan=False, ensure_ascii=False).encode("utf-8")
        except (TypeError, ValueError):  # UnicodeEncodeError is a ValueError
            pass
        else:
            item["input"] = value
        out.append(item)
    return out


def _printable(value: object) -> object:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return str(value).encode("utf-8", "backslashreplace").decode("utf-8")


async def validation_error(request: Request, exc: Exception) -> JSONResponse:
    """RequestValidationError → 422 with each field's reason; never echoes what JSON cannot carry."""
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    return JSONResponse({"detail": _validation_detail(errors)},
                        status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, validation_error)


class StrictJson:
    """422 for a JSON body with NaN/Infinity/1e999 or a lone surrogate, before any route reads it.
    Runs inside BodyLimit: the body is at most a few KiB and read once more here."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope["method"] in _BODYLESS
                or scope["path"].startswith(CONSOLE_PREFIX) or not _json_content(scope)):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        problem = None
        if body:
            try:
                problem = _json_problem(body.decode("utf-8"))
            except UnicodeDecodeError:
                problem = None  # FastAPI answers bytes that are not UTF-8 with its own 422
        if problem is not None:
            detail = [{"type": "json_invalid", "loc": ["body"], "msg": f"JSON body refused: {problem}"}]
            await _send_error(send, HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail))
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
