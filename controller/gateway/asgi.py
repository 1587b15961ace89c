"""Minimal ASGI helpers: the gateway is a bare ASGI app so that a streamed chunk costs one
``send`` call and nothing else (no framework middleware, no per-chunk objects)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]

JSON = b"application/json"


class BodyTooLarge(Exception):
    pass


class ClientGone(Exception):
    """The client disconnected while we were reading its request body."""


async def read_body(receive: Receive, limit: int) -> bytes:
    """The whole request body, refusing more than ``limit`` bytes."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge()
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def error_body(message: str, type_: str, code: int) -> bytes:
    """OpenAI-style error object, so client SDKs show our message."""
    return json.dumps({"error": {"message": message, "type": type_, "code": code}}).encode()


async def send_bytes(
    send: Send,
    status: int,
    body: bytes,
    content_type: bytes = JSON,
    headers: Iterable[tuple[bytes, bytes]] = (),
) -> None:
    all_headers: Headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    all_headers.extend(headers)
    await send({"type": "http.response.start", "status": status, "headers": all_headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_json(
    send: Send, status: int, obj: object, headers: Iterable[tuple[bytes, bytes]] = ()
) -> None:
    await send_bytes(send, status, json.dumps(obj).encode(), JSON, headers)


async def send_error(
    send: Send, status: int, message: str, type_: str, headers: Iterable[tuple[bytes, bytes]] = ()
) -> None:
    await send_bytes(send, status, error_body(message, type_, status), JSON, headers)
