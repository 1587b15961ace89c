"""What a streaming client sees while it is held: an event stream that starts at once with comment
lines (``: waiting for the engine (warm restart), ready in ~35 s``), so that proxies and client SDKs
with read timeouts do not give up, then the engine's own stream when the request is released.

The response's status line (200, ``text/event-stream``) is sent before the engine has answered, so
whatever the engine (or the gateway) answers afterwards that is not a 200 event stream — an error
JSON, a 503 at the end of the wait — becomes one ``data:`` event carrying that JSON, and the stream
ends. ``SseAfterHold`` does that rewriting for the proxy's ordinary send path, which stays unchanged.
"""

from __future__ import annotations

import json

from controller.gateway.asgi import Message, Scope, Send, error_body, send_error
from controller.gateway.hold.queue import Hold, Outcome, Refused, Released
from controller.gateway.slot import Slot, Upstream

EVENT_STREAM = b"text/event-stream"
# The largest body read to decide whether a held request asked for a stream (larger: not parsed, the
# Accept header decides). A chat request is a few KiB.
_PARSE_MAX = 1024 * 1024


def wants_stream(body: bytes, accept: bytes) -> bool:
    """Did the client ask for an event stream (``"stream": true`` at the top level, or Accept)?"""
    if EVENT_STREAM in accept:
        return True
    if not body or len(body) > _PARSE_MAX or b'"stream"' not in body:
        return False
    try:
        data = json.loads(body)
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("stream") is True


def start_message(request_id: bytes) -> Message:
    return {
        "type": "http.response.start",
        "status": 200,
        "headers": [
            (b"content-type", EVENT_STREAM),
            (b"cache-control", b"no-cache"),
            (b"x-request-id", request_id),
        ],
    }


def comment(text: str) -> Message:
    line = ": " + text.replace("\r", " ").replace("\n", " ") + "\n\n"
    return {"type": "http.response.body", "body": line.encode(), "more_body": True}


def error_event(status: int, message: str, type_: str) -> bytes:
    return b"data: " + error_body(message, type_, status) + b"\n\n"


class SseAfterHold:
    """A ``send`` for a request whose event stream was already started: the next response start is
    swallowed; a 200 event stream passes through byte for byte; anything else is buffered and sent
    as one ``data:`` event when it ends."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._passthrough = False
        self._buffer: list[bytes] = []
        self.status = 0

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
            headers = message.get("headers", ())
            content_type = next((v for k, v in headers if k.lower() == b"content-type"), b"")
            self._passthrough = self.status == 200 and content_type.startswith(EVENT_STREAM)
            return
        if self._passthrough:
            await self._send(message)
            return
        self._buffer.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        text = b"".join(self._buffer).strip()
        self._buffer = []
        try:
            json.loads(text)
            payload = text
        except ValueError:
            payload = error_body(text.decode("utf-8", "replace")[:2000], "upstream_error", self.status)
        await self._send({"type": "http.response.body", "body": b"data: " + payload + b"\n\n",
                          "more_body": False})


async def wait_for_release(
    hold: Hold,
    slot: Slot,
    send: Send,
    scope: Scope,
    key_id: str,
    body: bytes,
    request_id: bytes,
) -> tuple[Upstream | None, Send, int]:
    """Hold one request. Returns (the upstream to forward to, the send to use from now on, 0), or
    (None, send, status) when the request was answered here (503: timed out, queue full, failed)."""
    accept = next((v for k, v in scope["headers"] if k == b"accept"), b"")
    stream = wants_stream(body, accept)
    started = False

    async def tick(text: str) -> None:
        nonlocal started
        if not started:
            await send(start_message(request_id))
            started = True
        await send(comment(text))

    got = await hold.wait(key_id, slot.retry_after_s, tick if stream else None)
    upstream = slot.current if isinstance(got, Released) else None
    if isinstance(got, Released) and upstream is None:
        # Released, then cleared again before this task ran (a new engine that died at once).
        got = Refused(Outcome.FAILED, "the engine went away again just after it became ready",
                      slot.retry_after_s, got.waited_s)
    if upstream is not None:
        return upstream, (SseAfterHold(send) if started else send), 0
    assert isinstance(got, Refused)
    retry = (b"retry-after", str(got.retry_after_s).encode())
    if started:
        await send({"type": "http.response.body", "body": error_event(503, got.reason, "service_unavailable"),
                    "more_body": False})
    else:
        await send_error(send, 503, got.reason, "service_unavailable", [(b"x-request-id", request_id), retry])
    return None, send, 503
