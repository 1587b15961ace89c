"""A fast fake OpenAI-compatible upstream shaped like vLLM's SSE stream, for tests and benchmarks.

    python bench/synthetic_upstream.py --port 18000 --ttft-ms 50 --chunks 32 --interval-ms 10

``POST /v1/chat/completions`` / ``/v1/completions``: with ``"stream": true`` sends the headers at
once (as vLLM does), waits ``ttft``, then sends
``chunks`` events ``data: {...}\\n\\n`` one HTTP chunk each, ``interval`` apart, then
``data: [DONE]\\n\\n`` — the framing vLLM's server uses; without streaming, one JSON body after
the whole generation time. A request body may override the shape per request: ``max_tokens`` sets
the chunk count, and ``"synthetic": {"ttft_ms": .., "interval_ms": .., "pad": n}`` the rest
(``pad`` adds n bytes to each event, to vary chunk sizes).
``GET /v1/models`` lists the served model.

Written on bare asyncio + httptools (no framework) so that the upstream costs as little CPU as
possible: on a 2-core machine it shares the cores with the proxy under test and the load generator.

It records what a test needs to judge a proxy from the far side: each request's headers and body,
the exact bytes of the body it sent, and — when a client goes away — when the connection closed
(``time.monotonic()``), so "the upstream saw the disconnect within 50 ms" is measured here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import time
from dataclasses import dataclass, field
from typing import Any, cast

import httptools


@dataclass
class Shape:
    ttft_s: float = 0.05
    chunks: int = 32
    interval_s: float = 0.01
    pad: int = 0


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    started: float
    stream: bool = False
    first_byte_sent: float | None = None
    sent: bytearray = field(default_factory=bytearray)  # the response body bytes, exactly as sent
    completed: bool = False
    closed_at: float | None = None  # set if the connection closed before the response completed


class _Conn(asyncio.Protocol):
    def __init__(self, server: SyntheticUpstream) -> None:
        self.server = server
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.headers: dict[str, str] = {}
        self.body = bytearray()
        self.current: RecordedRequest | None = None
        self.task: asyncio.Task[None] | None = None
        self.closed = False
        self._write_ready = asyncio.Event()
        self._write_ready.set()

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.server.open_connections += 1
        self.server.total_connections += 1
        self.server.conns.add(self)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.write(
                b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            )
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.open_connections -= 1
        self.server.conns.discard(self)
        now = time.monotonic()
        if self.current is not None and not self.current.completed:
            self.current.closed_at = now
            if self.task is not None:
                self.task.cancel()
        self._write_ready.set()

    def pause_writing(self) -> None:
        self._write_ready.clear()

    def resume_writing(self) -> None:
        self._write_ready.set()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = {}
        self.body = bytearray()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        method = self.parser.get_method().decode()
        keep_alive = self.parser.should_keep_alive()
        req = RecordedRequest(
            method=method,
            path=self.url.decode("latin-1"),
            headers=self.headers,
            body=bytes(self.body),
            started=time.monotonic(),
        )
        self.server.requests.append(req)
        self.current = req
        self.task = asyncio.get_running_loop().create_task(self._respond(req, keep_alive))

    # responses
    def _write(self, data: bytes, req: RecordedRequest, body_part: bytes = b"") -> None:
        if self.closed or self.transport is None:
            raise ConnectionResetError("client went away")
        if body_part:
            if req.first_byte_sent is None:
                req.first_byte_sent = time.monotonic()
            req.sent += body_part
        self.transport.write(data)

    async def _respond(self, req: RecordedRequest, keep_alive: bool) -> None:
        try:
            await self._dispatch(req)
            req.completed = True
            if not keep_alive and self.transport is not None:
                self.transport.close()
        except (ConnectionResetError, asyncio.CancelledError):
            pass  # the client went away; connection_lost recorded when

    async def _dispatch(self, req: RecordedRequest) -> None:
        path = req.path.split("?", 1)[0]
        if req.method == "GET" and path == "/v1/models":
            body = json.dumps(
                {
                    "object": "list",
                    "data": [{"id": self.server.model, "object": "model", "owned_by": "synthetic"}],
                }
            ).encode()
            self._send_full(req, 200, body)
            return
        if req.method != "POST" or path not in ("/v1/chat/completions", "/v1/completions"):
            self._send_full(req, 404, b'{"error":{"message":"not found","code":404}}')
            return
        try:
            doc: Any = json.loads(req.body or b"{}")
        except ValueError:
            self._send_full(req, 400, b'{"error":{"message":"bad json","code":400}}')
            return
        shape = self.server.shape_for(doc)
        req.stream = bool(doc.get("stream"))
        chat = path.endswith("chat/completions")
        rng = random.Random(len(self.server.requests))
        words = [rng.choice(_WORDS) + " " + ("x" * shape.pad) for _ in range(shape.chunks)]
        # Usage like vLLM's: prompt tokens ~ a quarter of the body's bytes, one token per chunk.
        prompt_tokens = max(1, len(req.body) // 4)
        options = doc.get("stream_options") if isinstance(doc.get("stream_options"), dict) else {}
        final_usage = options.get("include_usage") is True
        running_usage = final_usage and options.get("continuous_usage_stats") is True
        if not req.stream:
            await asyncio.sleep(shape.ttft_s + shape.interval_s * max(0, shape.chunks - 1))
            self._send_full(
                req, 200, _full_body(self.server.model, chat, "".join(words), prompt_tokens, shape.chunks)
            )
            return
        # Like vLLM (Starlette's StreamingResponse): the headers go out at once, the first token
        # after the prefill.
        self._write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
            b"transfer-encoding: chunked\r\n\r\n",
            req,
        )
        await asyncio.sleep(shape.ttft_s)
        rid = f"chatcmpl-{len(self.server.requests)}"
        created = int(time.time())
        for i, word in enumerate(words):
            if i:
                await asyncio.sleep(shape.interval_s)
            usage = _usage(prompt_tokens, i + 1) if running_usage else None
            event = _event(rid, created, self.server.model, chat, word, None, usage)
            await self._send_chunk(req, event)
        usage = _usage(prompt_tokens, shape.chunks) if running_usage else None
        await self._send_chunk(req, _event(rid, created, self.server.model, chat, "", "length", usage))
        if final_usage:
            await self._send_chunk(req, _usage_event(rid, created, self.server.model, chat,
                                                     _usage(prompt_tokens, shape.chunks)))
        await self._send_chunk(req, b"data: [DONE]\n\n")
        self._write(b"0\r\n\r\n", req)

    async def _send_chunk(self, req: RecordedRequest, event: bytes) -> None:
        await self._write_ready.wait()
        self._write(b"%x\r\n%s\r\n" % (len(event), event), req, event)

    def _send_full(self, req: RecordedRequest, status: int, body: bytes) -> None:
        reason = {200: b"OK", 400: b"Bad Request", 404: b"Not Found"}[status]
        head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % (
            status,
            reason,
            len(body),
        )
        self._write(head + body, req, body)


_WORDS = ["the", "capital", "of", "France", "is", "Paris", "a", "token", "stream", "engine", "λ", "日本"]


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}


def _usage_event(rid: str, created: int, model: str, chat: bool, usage: dict[str, int]) -> bytes:
    doc: dict[str, Any] = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
           "created": created,
           "model": model, "choices": [], "usage": usage}
    return b"data: " + json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def _event(rid: str, created: int, model: str, chat: bool, text: str, finish: str | None,
           usage: dict[str, int] | None = None) -> bytes:
    if chat:
        choice: dict[str, Any] = {
            "index": 0,
            "delta": {"content": text},
            "logprobs": None,
            "finish_reason": finish,
        }
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    doc: dict[str, Any] = {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]}
    if usage is not None:
        doc["usage"] = usage
    return b"data: " + json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def _full_body(
    model: str, chat: bool, text: str, prompt_tokens: int = 1, completion_tokens: int = 1
) -> bytes:
    if chat:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": "length",
        }
    else:
        choice = {"index": 0, "text": text, "finish_reason": "length"}
    return json.dumps(
        {
            "id": "cmpl-synthetic",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": [choice],
            "usage": _usage(prompt_tokens, completion_tokens),
        }
    ).encode()


class SyntheticUpstream:
    """Start with ``await start()`` inside a running loop; ``port`` is then bound."""

    def __init__(
        self, shape: Shape | None = None, model: str = "synthetic", host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.shape = shape or Shape()
        self.model = model
        self.host = host
        self.port = port
        self.requests: list[RecordedRequest] = []
        self.open_connections = 0
        self.total_connections = 0
        self.conns: set[_Conn] = set()
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def shape_for(self, doc: Any) -> Shape:
        shape = self.shape
        if not isinstance(doc, dict):
            return shape
        raw_over = doc.get("synthetic")
        over: dict[str, Any] = raw_over if isinstance(raw_over, dict) else {}
        raw_chunks = doc.get("max_tokens")
        chunks: int = raw_chunks if isinstance(raw_chunks, int) else shape.chunks
        return Shape(
            ttft_s=float(over.get("ttft_ms", shape.ttft_s * 1000)) / 1000,
            chunks=max(1, chunks),
            interval_s=float(over.get("interval_ms", shape.interval_s * 1000)) / 1000,
            pad=int(over.get("pad", shape.pad)),
        )

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Conn(self), self.host, self.port, backlog=4096)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for conn in list(self.conns):
                if conn.transport is not None:
                    conn.transport.close()
            await self._server.wait_closed()
            self._server = None


async def _main(args: argparse.Namespace) -> None:
    upstream = SyntheticUpstream(
        Shape(args.ttft_ms / 1000, args.chunks, args.interval_ms / 1000, args.pad),
        model=args.served_model,
        host=args.host,
        port=args.port,
    )
    await upstream.start()
    print(f"synthetic upstream on {upstream.url}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await upstream.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=18000)
    p.add_argument("--ttft-ms", type=float, default=50.0)
    p.add_argument("--chunks", type=int, default=32)
    p.add_argument("--interval-ms", type=float, default=10.0)
    p.add_argument("--pad", type=int, default=0)
    p.add_argument("--served-model", default="synthetic")
    args = p.parse_args()
    try:
        import uvloop

        uvloop.run(_main(args))
    except ImportError:
        asyncio.run(_main(args))


if __name__ == "__main__":
    main()
