"""Exact token accounting through the real gateway (uvicorn, real sockets), each case on asyncio's
loop and on uvloop. The upstream is a few lines of asyncio that answer as vLLM's server does where it
matters here: it decides ``stream`` with pydantic's lax bool, streams ``n`` choices with running
totals per choice when asked, and serves the Responses and Messages APIs with their own usage names.
Each case is one of the red team's probes (items 10, 11, 14, 15, 20)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import uvloop
from pydantic import TypeAdapter, ValidationError

from controller.gateway.config import GatewayConfig
from controller.gateway.embedded import RunningGateway, serve_in_loop
from controller.gateway.keystore import KeyRecord, KeyStore
from controller.gateway.usage.store import UsageStore

pytestmark = pytest.mark.timeout(120)
PROMPT = 20  # the upstream's prompt tokens per prompt
_BOOL = TypeAdapter(bool)


def both_loops(case: Callable[[Path], Coroutine[Any, Any, None]]) -> Callable[[str, Path], None]:
    """A test run once on asyncio's loop and once on uvloop (the gateway's own loop)."""

    @pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
    def test(loop: str, tmp_path: Path) -> None:
        (uvloop.run if loop == "uvloop" else asyncio.run)(case(tmp_path))

    test.__name__ = test.__qualname__ = case.__name__
    test.__doc__ = case.__doc__
    return test


def _engine_streams(doc: dict[str, Any]) -> bool:
    try:
        return _BOOL.validate_python(doc.get("stream")) if doc.get("stream") is not None else False
    except ValidationError:
        return False


def _sse(doc: dict[str, Any], kind: str | None = None) -> bytes:
    head = f"event: {kind}\n".encode() if kind else b""
    return head + b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}


class Upstream:
    """``prefill_s``: the wait before the first byte (non-stream: before the head); ``hang``: a
    stream stops after its last token and waits for the gateway to leave; ``rogue``: every answer
    is an event stream without usage, whatever was asked; ``answer_at_eof``: a stream's head and its
    first ``answer_at_eof`` events only once the gateway half-closed (vLLM aborting a request
    it had begun: what it had generated goes out, with its running usage), then the end."""

    def __init__(self) -> None:
        self.prefill_s = 0.0
        self.hang = False
        self.rogue = False
        self.answer_at_eof = 0
        self.requests: list[tuple[str, bytes]] = []
        self.eof_seen = asyncio.Event()
        self._server: asyncio.Server | None = None
        self.url = ""

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()

    async def _pause(self, reader: asyncio.StreamReader, seconds: float) -> bool:
        """Wait; False if the gateway closed its side meanwhile (vLLM aborts then)."""
        try:
            data = await asyncio.wait_for(reader.read(1), seconds)
        except TimeoutError:
            return True
        if not data:
            self.eof_seen.set()
        return bool(data)

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                target = head[0].split(" ")[1]
                headers = dict((k.strip().lower(), v.strip()) for k, v in
                               (line.split(":", 1) for line in head[1:] if line))
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.requests.append((target, body))
                if not await self._answer(target, json.loads(body), reader, writer):
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _answer(self, target: str, doc: dict[str, Any], reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> bool:
        stream = _engine_streams(doc) or self.rogue
        n = int(doc.get("n") or 1)
        steps = int(doc.get("max_tokens") or 5)
        if not stream:
            if not await self._pause(reader, self.prefill_s):
                return False
            usage: dict[str, Any] = _usage(PROMPT, n * steps)
            if target != "/v1/chat/completions":
                usage = {"input_tokens": PROMPT, "output_tokens": n * steps}
            body = json.dumps({"id": "x", "choices": [], "usage": usage}).encode()
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
                         % len(body) + body)
            return True
        ctype = b"TEXT/EVENT-STREAM; charset=utf-8" if self.rogue else b"text/event-stream; charset=utf-8"
        if self.answer_at_eof:
            while await self._pause(reader, 30):  # the prefill, until the gateway half-closes
                pass
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: " + ctype + b"\r\nconnection: close\r\n\r\n")
            writer.writelines(self._events(target, doc, n, steps)[:self.answer_at_eof])
            await writer.drain()
            return False  # the end of the connection ends the body
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: " + ctype + b"\r\ntransfer-encoding: chunked\r\n\r\n")
        if not await self._pause(reader, self.prefill_s):
            return False
        for event in self._events(target, doc, n, steps):
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
        await writer.drain()
        if self.hang:
            while await self._pause(reader, 60):
                pass
            return False
        writer.write(b"0\r\n\r\n")
        return True

    def _events(self, target: str, doc: dict[str, Any], n: int, steps: int) -> list[bytes]:
        if self.rogue:
            return [_sse({"choices": [{"index": 0, "delta": {"content": "x"}}]})] * steps
        if target == "/v1/responses":
            return [_sse({"type": "response.created", "response": {"usage": None}}, "response.created"),
                    *[_sse({"type": "response.output_text.delta", "delta": "x"},
                           "response.output_text.delta")] * steps,
                    _sse({"type": "response.completed", "response": {"usage": {
                        "input_tokens": PROMPT, "output_tokens": steps, "total_tokens": PROMPT + steps}}},
                         "response.completed")]
        if target == "/v1/messages":
            return [_sse({"type": "message_start", "message": {"usage": {"input_tokens": PROMPT,
                                                                         "output_tokens": 1}}},
                         "message_start"),
                    *[_sse({"type": "content_block_delta", "delta": {"text": "x"}},
                           "content_block_delta")] * steps,
                    _sse({"type": "message_delta", "usage": {"output_tokens": steps}}, "message_delta"),
                    _sse({"type": "message_stop"}, "message_stop")]
        options = doc.get("stream_options") or {}
        running = options.get("continuous_usage_stats") is True
        out = []
        for step in range(1, steps + 1):
            for i in range(n):  # vLLM: one event per choice per step, totals per choice
                event: dict[str, Any] = {"object": "chat.completion.chunk",
                                         "choices": [{"index": i, "delta": {"content": "x"}}]}
                if running:
                    event["usage"] = _usage(PROMPT, step)
                out.append(_sse(event))
        if options.get("include_usage") is True and not self.hang:
            out.append(_sse({"object": "chat.completion.chunk", "choices": [],
                             "usage": _usage(PROMPT, n * steps)}))
        if not self.hang:
            out.append(b"data: [DONE]\n\n")
        return out


@asynccontextmanager
async def _setup(tmp_path: Path, **config: Any) -> AsyncIterator[tuple[Upstream, RunningGateway]]:
    up = Upstream()
    await up.start()
    cfg = GatewayConfig(keys_db=tmp_path / "keys.db", port=0, upstream_url=up.url, served_model="m",
                        key_refresh_s=0.2, usage_flush_s=0.2, **config)
    try:
        async with serve_in_loop(cfg) as gw:
            yield up, gw
    finally:
        await up.stop()


async def _usage_of(
    gw: RunningGateway, tmp_path: Path, key: KeyRecord, requests: int
) -> tuple[int, int, int]:
    """(requests, prompt, completion) recorded for ``key`` once ``requests`` have been (≤ 5 s), over
    every model: a request refused before its body was read (a 429 at the head) has no model yet and
    is recorded under ``unknown``, the others under the engine's served name."""
    total: tuple[int, int, int] | None = None
    for _ in range(100):
        await gw.app.accounting.flush()
        rows = [r for r in UsageStore(tmp_path / "usage.sqlite3").query() if r.key_id == key.id]
        if rows:
            total = (sum(r.requests for r in rows), sum(r.prompt_tokens for r in rows),
                     sum(r.completion_tokens for r in rows))
            if total[0] >= requests:
                break
        await asyncio.sleep(0.05)
    assert total is not None
    return total


def _h(key: str, content_type: str = "application/json") -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", "Content-Type": content_type}


CHAT = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, '


@both_loops
async def test_every_spelling_of_stream_is_metered(tmp_path: Path) -> None:
    """Item 10: the engine streams all of these; before, only ``"stream": true`` with a lowercase
    json content type was metered (usage 0 for the rest)."""
    rec, key = KeyStore(tmp_path / "keys.db").create("a", tpd_limit=100_000)
    cases = [(b'"stream": 1}', "application/json"), (b'"stream": "true"}', "application/json"),
             (b'"stream": "yes"}', "application/json"), (b'"stream": "on"}', "application/json"),
             (b'"stream": 1.0}', "application/json"), (b'"str\\u0065am": true}', "application/json"),
             (b'"stream": true}', "Application/JSON"),
             (b'"stream": true}', "APPLICATION/JSON; charset=utf-8")]
    async with _setup(tmp_path) as (up, gw), aiohttp.ClientSession() as s:
        for spelling, ctype in cases:
            async with s.post(gw.url + "/v1/chat/completions", data=CHAT + spelling,
                              headers=_h(key, ctype)) as r:
                got = await r.read()
            assert r.status == 200 and got.endswith(b"data: [DONE]\n\n")
            assert b'"usage"' not in got  # the client asked for none
            assert json.loads(up.requests[-1][1])["stream_options"]["continuous_usage_stats"] is True
        assert await _usage_of(gw, tmp_path, rec, len(cases)) == (len(cases), PROMPT * len(cases),
                                                                  4 * len(cases))


@both_loops
async def test_an_unplanned_event_stream_is_refused_to_a_quota_key_and_observed_otherwise(
    tmp_path: Path,
) -> None:
    """Item 10's backstop: the engine streams although the gateway did not plan it (here: a
    upstream that always streams, with an upper-case media type). A key with a quota is refused
    (502) rather than served unmetered; before, it got the stream and was charged nothing."""
    store = KeyStore(tmp_path / "keys.db")
    _, quota_key = store.create("q", tpd_limit=300)
    _, free_key = store.create("free")
    async with _setup(tmp_path) as (up, gw), aiohttp.ClientSession() as s:
        up.rogue = True
        async with s.post(gw.url + "/v1/chat/completions", data=CHAT + b'"stream": false}',
                          headers=_h(quota_key)) as r:
            assert r.status == 502 and "cannot meter" in (await r.json())["error"]["message"]
        async with s.post(gw.url + "/v1/chat/completions", data=CHAT + b'"stream": false}',
                          headers=_h(free_key)) as r:
            assert r.status == 200 and (await r.read()).count(b"data: ") == 4


@both_loops
async def test_responses_and_messages_are_counted(tmp_path: Path) -> None:
    """Item 11: usage named input_tokens/output_tokens, in bodies and in the APIs' own streamed
    events; before, all four requests were charged 0 tokens."""
    rec, key = KeyStore(tmp_path / "keys.db").create("a", tpd_limit=100_000)
    async with _setup(tmp_path) as (_, gw), aiohttp.ClientSession() as s:
        for path in ("/v1/responses", "/v1/messages"):
            for stream in (b"false", b"true"):
                body = b'{"model": "m", "input": "hi", "max_tokens": 6, "stream": ' + stream + b"}"
                async with s.post(gw.url + path, data=body, headers=_h(key)) as r:
                    assert r.status == 200
                    await r.read()
        assert await _usage_of(gw, tmp_path, rec, 4) == (4, 4 * PROMPT, 4 * 6)


async def _leave_after(
    gw: RunningGateway, key: str, body: bytes, events: int | None, up: Upstream | None = None
) -> None:
    """Send ``body`` raw and leave after ``events`` streamed events (None: before any byte, once
    ``up`` has received the request: it is in its prefill)."""
    arrived = len(up.requests) if up is not None else 0
    host, port = gw.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer "
                 + key.encode() + b"\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
                 % len(body) + body)
    await writer.drain()
    if events is not None:
        got = b""
        while got.count(b"data: ") < events:
            data = await reader.read(65536)
            assert data, "the gateway closed first"
            got += data
    else:
        # Leave once the request reached the upstream, not after a guessed delay (a loaded host can
        # take longer than any guess to get it there).
        assert up is not None, "leaving before any byte needs the upstream to watch"
        for _ in range(1000):  # bounded: 10 s
            if len(up.requests) > arrived:
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("the request never reached the upstream")
    writer.close()


@both_loops
async def test_an_abandoned_n4_stream_is_charged_every_choice(tmp_path: Path) -> None:
    """Item 14: n=4, 5 tokens each, left before the end; before, one choice was charged (5)."""
    rec, key = KeyStore(tmp_path / "keys.db").create("a", tpd_limit=100_000)
    async with _setup(tmp_path) as (up, gw):
        up.hang = True
        await _leave_after(gw, key, CHAT[:-len(b'"max_tokens": 4, ')] + b'"max_tokens": 5, "n": 4, '
                           b'"stream": true}', events=20)
        assert await _usage_of(gw, tmp_path, rec, 1) == (1, PROMPT, 20)


@both_loops
async def test_a_client_leaving_during_the_prefill_is_charged_the_prompt(tmp_path: Path) -> None:
    """Item 20: the client leaves before the first byte of a stream and before a non-streamed
    answer; the engine saw the prompt, so its estimate (characters / 4) is charged, and the engine
    is told at once. Before, both were recorded as 499 with 0 tokens."""
    rec, key = KeyStore(tmp_path / "keys.db").create("a", tpd_limit=100_000)
    content = "w" * 396
    async with _setup(tmp_path) as (up, gw):
        up.prefill_s = 30.0
        for stream in (b"true", b"false"):
            body = (b'{"model": "m", "messages": [{"role": "user", "content": "' + content.encode()
                    + b'"}], "stream": ' + stream + b"}")
            await _leave_after(gw, key, body, events=None, up=up)
            await asyncio.wait_for(up.eof_seen.wait(), 5)  # the engine was told (it aborts)
            up.eof_seen.clear()
        requests, prompt, completion = await _usage_of(gw, tmp_path, rec, 2)
        assert (requests, prompt, completion) == (2, 2 * 100, 0)  # "user" + 396 characters, / 4


@both_loops
async def test_a_client_leaving_during_the_prefill_is_charged_what_the_engine_counted(
    tmp_path: Path,
) -> None:
    """The client leaves a stream before its head; the engine sends its head and running usage only
    after the gateway's half-close (its abort). The engine's count (20 prompt tokens, 3 completion)
    is charged, not the estimate. Before: the gateway closed the connection without reading, and
    charged the estimate (100 prompt tokens, 0 completion)."""
    rec, key = KeyStore(tmp_path / "keys.db").create("a", tpd_limit=100_000)
    content = "w" * 396
    async with _setup(tmp_path) as (up, gw):
        up.answer_at_eof = 3
        body = (b'{"model": "m", "messages": [{"role": "user", "content": "' + content.encode()
                + b'"}], "max_tokens": 8, "stream": true}')
        await _leave_after(gw, key, body, events=None, up=up)
        await asyncio.wait_for(up.eof_seen.wait(), 5)  # the engine was told (it aborts)
        sent = json.loads(up.requests[0][1])
        assert sent["stream_options"]["continuous_usage_stats"] is True  # planned: usage asked for
        assert await _usage_of(gw, tmp_path, rec, 1) == (1, PROMPT, 3)


@both_loops
async def test_reservation_stops_concurrent_requests_and_answers_say_where_the_key_stands(
    tmp_path: Path,
) -> None:
    """Item 15: 8 requests at once on a 200 tokens/minute key. With reservation each takes its
    worst case (2 estimated + 50) on admission: 4 run, 4 get 429. Every answer carries
    x-ratelimit-*."""
    store = KeyStore(tmp_path / "keys.db")
    rec, key = store.create("a", tpm_limit=200, rpm_limit=100)
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50}'
    async with _setup(tmp_path, quota_reserve=True) as (up, gw), aiohttp.ClientSession() as s:
        up.prefill_s = 0.5  # all 8 are admitted or refused before the first ends

        async def one() -> tuple[int, dict[str, str]]:
            async with s.post(gw.url + "/v1/chat/completions", data=body, headers=_h(key)) as r:
                await r.read()
                return r.status, dict(r.headers)

        answers = await asyncio.gather(*(one() for _ in range(8)))
        assert sorted(status for status, _ in answers) == [200] * 4 + [429] * 4
        for _status, headers in answers:
            assert headers["x-ratelimit-limit-tokens"] == "200"
            assert headers["x-ratelimit-limit-requests"] == "100"
            assert int(headers["x-ratelimit-remaining-tokens"]) < 200
        assert await _usage_of(gw, tmp_path, rec, 8) == (8, 4 * PROMPT, 4 * 50)
        # Each used 20 + 50 (the upstream's count): the reservations were refunded down to that
        # (plus the refill since: 200/60 tokens a second).
        level = gw.app.accounting.quotas.level(rec.id, "minute")
        assert level is not None and 200 - 4 * 70 - 1 < level < 200 - 4 * 70 + 40



async def _raw_exchange(gw: RunningGateway, request: bytes) -> bytes:
    """Send ``request`` as bytes and read the answer until the gateway closes (bounded)."""
    host, port = gw.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(request)
    got = b""
    async with asyncio.timeout(10):
        while data := await reader.read(65536):
            got += data
    writer.close()
    return got


@both_loops
async def test_two_content_types_are_refused_before_the_engine(tmp_path: Path) -> None:
    """Red team h31: `Content-Type: application/json` then `Content-Type: text/plain`. The gateway
    read the last (not JSON: no model check, no usage asked of the stream) and the engine the first
    (Starlette's ``headers.get``: JSON, streamed): before, the upstream got the body below (an unknown
    model, a stream without stream_options) and the free key's stream was recorded as 0 tokens."""
    store = KeyStore(tmp_path / "keys.db")
    _, key = store.create("free")
    body = b'{"model": "gpt-4o", "messages": [], "max_tokens": 4, "stream": true}'
    async with _setup(tmp_path) as (up, gw):
        for first, second in ((b"application/json", b"text/plain"), (b"text/plain", b"application/json")):
            head = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer "
                    + key.encode() + b"\r\ncontent-type: " + first + b"\r\ncontent-type: " + second
                    + b"\r\ncontent-length: %d\r\n\r\n" % len(body))
            got = await _raw_exchange(gw, head + body)
            assert got.startswith(b"HTTP/1.1 400 "), got[:200]
            assert b"more than one Content-Type" in got
        assert up.requests == []
