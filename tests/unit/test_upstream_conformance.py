"""The gateway's upstream client held to a strict HTTP/1.1 implementation, h11, as the oracle.

Each case is a byte stream an upstream sends (in the pieces given, one write each) in answer to one
request. The same stream is fed to h11's client state machine (``h11.Connection(h11.CLIENT)``, the
same request sent, ``receive_data`` piece by piece, EOF when the upstream closes) and, through a
real socket server on 127.0.0.1, to ``UpstreamPool`` (so the real parsing path runs, on asyncio's
loop and on uvloop). Required: the client agrees with h11 (same status, same fields of the head, the
same body bytes, the same keep-alive decision, trailers never among the head's fields) or refuses
(``UpstreamFailure``) where h11 raises a protocol error; never an answer where h11 has none.

How h11's events are read (the oracle's rules):

- the answer is the final (non-1xx) response up to its ``EndOfMessage``; a ``RemoteProtocolError``
  or an EOF before that is a refusal;
- whatever comes after the ``EndOfMessage`` concerns the connection only: the connection is
  reusable when h11 says both sides are ``DONE`` (HTTP/1.1, no ``Connection: close``), no byte
  follows the answer, and the upstream did not close it. A byte after the answer makes it unusable
  (h11 keeps such bytes for the next cycle; a proxy cannot know whose answer they are);
- the client's reuse is observed, not asked: after the answer is read and released and every byte
  the upstream sent has been delivered, a second request on the same pool must be answered on the
  first connection (reusable) or on a new one (not reusable).

Where llhttp (httptools) is stricter than h11, the client refuses an answer h11 accepts. Each such
case is listed (``STRICTER``) with why refusing is safe; the test requires both sides of it (h11
accepts, the client refuses), so a change in either shows. One more documented difference: the
client never pools the connection after a HEAD (llhttp cannot be told that the answer to a HEAD
has no body, so its view of the stream is not trusted), where h11 would.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, replace

import h11
import pytest
import uvloop

from controller.gateway.upstream_client import UpstreamFailure, UpstreamPool

NEXT = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nnext"  # a second request on connection 1
FRESH = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfresh"  # any request on a later connection


@dataclass(frozen=True)
class Case:
    name: str
    pieces: tuple[bytes, ...]  # what the upstream writes, one write each (read splits, best effort)
    close: bool = False  # the upstream closes after the last piece
    method: bytes = b"GET"
    stricter: str | None = None  # why the client may refuse where h11 answers (see STRICTER)
    keeps: str | None = None  # why the client may keep a connection h11 would not (see KEEPS)


@dataclass(frozen=True)
class Answer:
    status: int
    headers: tuple[tuple[bytes, bytes], ...]  # names lower-cased
    body: bytes
    reusable: bool


REFUSED = "refused"


def _fields(headers: list[tuple[bytes, bytes]]) -> tuple[tuple[bytes, bytes], ...]:
    # Names compared lower-cased; h11 also lower-cases the value of Transfer-Encoding (a coding name
    # is case-insensitive), the client passes it as sent.
    return tuple((k.lower(), v.lower() if k.lower() == b"transfer-encoding" else v) for k, v in headers)
Outcome = Answer | str


def oracle(case: Case) -> Outcome:
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method=case.method, target="/", headers=[("Host", "upstream")]))
    conn.send(h11.EndOfMessage())
    status, body = 0, b""
    headers: tuple[tuple[bytes, bytes], ...] = ()
    stream = [*case.pieces, *([b""] if case.close else [])]
    for i, piece in enumerate(stream):
        conn.receive_data(piece)
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError:
                return REFUSED
            if event is h11.NEED_DATA or event is h11.PAUSED:
                break
            if isinstance(event, h11.Response):
                status, headers = event.status_code, _fields(list(event.headers))
            elif isinstance(event, h11.Data):
                body += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                after = conn.trailing_data[0] + b"".join(stream[i + 1:])
                reusable = (conn.our_state is h11.DONE and conn.their_state is h11.DONE
                            and not after and not case.close)
                return Answer(status, headers, body, reusable)
            elif isinstance(event, h11.ConnectionClosed):
                return REFUSED
    assert case.close, f"{case.name}: an unfinished answer must end with a close (else both wait)"
    return REFUSED


class _Upstream:
    def __init__(self, case: Case) -> None:
        self.case = case
        self.connections = 0
        self.written = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        first = self.connections == 1
        try:
            while await _read_request(reader):
                if not first:
                    writer.write(FRESH)
                    continue
                first = False
                for piece in self.case.pieces:
                    writer.write(piece)
                    await writer.drain()
                    for _ in range(3):  # let the client read this piece on its own (best effort)
                        await asyncio.sleep(0)
                if self.case.close:
                    writer.close()
                    await writer.wait_closed()
                    return
                self.written.set()
                self.case = replace(self.case, pieces=(NEXT,))
                first = True
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.written.set()
            writer.close()


async def _read_request(reader: asyncio.StreamReader) -> bool:
    try:
        await reader.readuntil(b"\r\n\r\n")  # the client's requests here have no body
    except (asyncio.IncompleteReadError, ConnectionError):
        return False
    return True


async def client(case: Case) -> Outcome:
    upstream = _Upstream(case)
    server = await asyncio.start_server(upstream.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = UpstreamPool(connect_timeout_s=2.0, idle_timeout_s=5.0, keepalive_s=30.0, limit=4)
    origin = pool.origin(f"http://127.0.0.1:{port}")
    try:
        try:
            resp = await pool.request(origin, case.method, b"/", [], b"")
            body = await resp.read_all()
        except UpstreamFailure:
            return REFUSED
        status, headers = resp.status, _fields(resp.headers)
        resp.release()  # the connection's state is the next request's from here
        await asyncio.wait_for(upstream.written.wait(), 5.0)
        for _ in range(3):  # every byte is in our socket's buffer: let the loop read it (and any EOF)
            await asyncio.sleep(0.01)
        for _ in range(2):  # the second request: a stale pooled connection may need one more try
            try:
                again = await pool.request(origin, b"GET", b"/", [], b"")
                second = await again.read_all()
                again.release()
                break
            except UpstreamFailure:
                continue
        else:
            raise AssertionError(f"{case.name}: the second request failed twice")
        assert second in (b"next", b"fresh"), (case.name, second)  # never bytes of the first answer
        return Answer(status, headers, body, reusable=second == b"next")
    finally:
        await pool.close()
        server.close()


# --- hand-picked RFC 9112 edge cases ----------------------------------------------------------------

H = b"HTTP/1.1 200 OK\r\n"
CHUNKED = H + b"Transfer-Encoding: chunked\r\n"

# Where llhttp refuses what h11 accepts. Refusing is safe in each: the gateway answers 502 and the
# connection is closed; nothing of a different meaning is passed on. None of these is what vLLM sends.
STRICTER = {
    "duplicate equal Content-Length": "RFC 9112 §6.3 lets a recipient reject it (h11 folds equal values)",
    "Content-Length list": "as above: '2, 2' is a list of equal values",
    "CL and TE both": "RFC 9112 §6.1: such a message 'ought to be handled as an error' (smuggling vector)",
    "obs-fold": "RFC 9112 §5.2: a user agent may reject obs-fold; nothing we talk to folds",
    "bare LF line ends": "RFC 9112 §2.2 allows recognising a bare LF, does not require it",
    "control byte in a value": "RFC 9110 §5.5: a recipient may reject CTLs in field values",
    "space after chunk size": "not in the chunk grammar (RFC 9112 §7.1); h11 tolerates it",
    "Content-Length in trailers": "RFC 9110 §6.5.1 forbids framing fields in trailers",
    "HTTP/1.0 interim answer": "llhttp takes a 1.0 1xx for the last message; interim answers are 1.1-only",
}

# Where the client keeps a connection h11 would give up, and why that is safe.
KEEPS = {
    "CRLF after the answer": "llhttp skips empty lines before a message (RFC 9112 §2.2 allows it); "
    "they can never become part of the next answer: the second request gets its own answer",
}

HAND_PICKED = [
    Case("plain Content-Length", (H + b"Content-Length: 5\r\nContent-Type: text/plain\r\n\r\nhello",)),
    Case("chunked, split reads", (CHUNKED + b"\r\n3\r\nabc\r", b"\n4\r\ndefg\r\n", b"0\r\n\r\n")),
    Case("chunk extensions", (CHUNKED + b'\r\n3;a=b;c="d e"\r\nabc\r\n0;last\r\n\r\n',)),
    Case("trailers in one read", (CHUNKED + b"Trailer: X-T\r\n\r\n2\r\nhi\r\n"
                                   b"0\r\nX-T: 1\r\nX-U: 2\r\n\r\n",)),
    Case("trailers in a later read", (CHUNKED + b"\r\n2\r\nhi\r\n0\r\n", b"X-T: 1\r\n\r\n")),
    Case("100 then 200", (b"HTTP/1.1 100 Continue\r\n\r\n" + H + b"Content-Length: 2\r\n\r\nok",)),
    Case("103 then 200, two reads", (b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n",
                                      H + b"Content-Length: 2\r\nX-A: 1\r\n\r\nok")),
    Case("103 then 200, one read", (b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
                                     + H + b"Content-Length: 2\r\n\r\nok",)),
    Case("several 1xx", (b"HTTP/1.1 100 C\r\n\r\nHTTP/1.1 102 P\r\nX-P: 1\r\n\r\nHTTP/1.1 103 E\r\n\r\n"
                         + H + b"Content-Length: 0\r\n\r\n",)),
    Case("1xx then 204", (b"HTTP/1.1 100 C\r\n\r\nHTTP/1.1 204 No Content\r\nX-A: 1\r\n\r\n",)),
    Case("101 never asked for", (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n"
                                 b"Connection: Upgrade\r\n\r\n\x00\x00\x12",), close=True),
    Case("204", (b"HTTP/1.1 204 No Content\r\n\r\n",)),
    Case("204 with Content-Length, no body", (b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n",)),
    Case("204 with body bytes", (b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nhello",)),
    Case("304 with Content-Length", (b"HTTP/1.1 304 Not Modified\r\nContent-Length: 50\r\n\r\n",)),
    Case("304 with body bytes", (b"HTTP/1.1 304 Not Modified\r\n\r\nbody",)),
    Case("HEAD with Content-Length", (H + b"Content-Length: 1234\r\n\r\n",), method=b"HEAD"),
    Case("body shorter, then close", (H + b"Content-Length: 10\r\n\r\nshort",), close=True),
    Case("body longer: extra bytes, same read", (H + b"Content-Length: 2\r\n\r\nhiEXTRA",)),
    Case("body longer: extra bytes, later read", (H + b"Content-Length: 2\r\n\r\nhi", b"EXTRA")),
    Case("CRLF after the answer", (H + b"Content-Length: 2\r\n\r\nhi\r\n",), keeps="CRLF after the answer"),
    Case("a second answer nobody asked for", (H + b"Content-Length: 2\r\n\r\nhi" + NEXT,)),
    Case("close-delimited", (H + b"Content-Type: text/plain\r\n\r\nuntil", b" the end"), close=True),
    Case("close-delimited, empty", (H + b"\r\n",), close=True),
    Case("duplicate equal Content-Length", (H + b"Content-Length: 2\r\nContent-Length: 2\r\n\r\nhi",),
         stricter="duplicate equal Content-Length"),
    Case("Content-Length list", (H + b"Content-Length: 2, 2\r\n\r\nhi",), stricter="Content-Length list"),
    Case("conflicting Content-Length", (H + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\nhi",),
         close=True),
    Case("CL and TE both", (CHUNKED + b"Content-Length: 2\r\n\r\n2\r\nhi\r\n0\r\n\r\n",),
         stricter="CL and TE both"),
    Case("TE gzip (not chunked)", (H + b"Transfer-Encoding: gzip\r\n\r\nhi",), close=True),
    Case("TE gzip, chunked", (H + b"Transfer-Encoding: gzip, chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n",),
         close=True),
    Case("TE chunked, gzip", (H + b"Transfer-Encoding: chunked, gzip\r\n\r\nhi",), close=True),
    Case("TE twice", (CHUNKED + b"Transfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n",), close=True),
    Case("TE Chunked in capitals", (H + b"Transfer-Encoding: Chunked \r\n\r\n2\r\nhi\r\n0\r\n\r\n",)),
    Case("obs-fold", (H + b"X-A: one\r\n two\r\nContent-Length: 2\r\n\r\nhi",), stricter="obs-fold"),
    Case("obs-fold as the first line", (H + b" X-A: v\r\nContent-Length: 0\r\n\r\n",), close=True),
    Case("bare LF line ends", (b"HTTP/1.1 200 OK\nContent-Length: 2\n\nhi",), stricter="bare LF line ends"),
    Case("control byte in a value", (H + b"X-A: a\x01b\r\nContent-Length: 0\r\n\r\n",),
         stricter="control byte in a value"),
    Case("NUL in a value", (H + b"X-A: a\x00b\r\nContent-Length: 0\r\n\r\n",), close=True),
    Case("space before the colon", (H + b"X-A : 1\r\nContent-Length: 0\r\n\r\n",), close=True),
    Case("whitespace around a value", (H + b"X-A: \t v w \t\r\nContent-Length: 0\r\n\r\n",)),
    Case("bad chunk size", (CHUNKED + b"\r\nzz\r\nhi\r\n0\r\n\r\n",), close=True),
    Case("space after chunk size", (CHUNKED + b"\r\n2 \r\nhi\r\n0\r\n\r\n",),
         stricter="space after chunk size"),
    # h11 waits for the 2^68 bytes (and refuses at the close), llhttp refuses at once: the same end.
    Case("chunk size overflow", (CHUNKED + b"\r\nfffffffffffffffff\r\nhi\r\n",), close=True),
    Case("chunk data without CRLF", (CHUNKED + b"\r\n2\r\nhiXX0\r\n\r\n",), close=True),
    Case("chunked cut before the last chunk", (CHUNKED + b"\r\n2\r\nhi\r\n",), close=True),
    Case("Content-Length in trailers", (CHUNKED + b"\r\n0\r\nContent-Length: 5\r\n\r\n",),
         stricter="Content-Length in trailers"),
    Case("Connection: close answer", (H + b"Connection: close\r\nContent-Length: 2\r\n\r\nhi",),
         close=True),
    Case("Connection: close, the upstream keeps it open", (H + b"Connection: close\r\n"
                                                           b"Content-Length: 2\r\n\r\nhi",)),
    Case("HTTP/1.0, no keep-alive", (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nhi",)),
    Case("HTTP/1.0 with keep-alive", (b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\n"
                                      b"Content-Length: 2\r\n\r\nhi",)),
    Case("HTTP/1.0 close-delimited", (b"HTTP/1.0 200 OK\r\n\r\nuntil the end",), close=True),
    Case("HTTP/1.0 interim answer", (b"HTTP/1.0 103 E\r\n\r\n" + H + b"Content-Length: 0\r\n\r\n",),
         stricter="HTTP/1.0 interim answer"),
    Case("garbage", (b"SSH-2.0-OpenSSH_9.6\r\n\r\n",), close=True),
    Case("status of two digits", (b"HTTP/1.1 20 OK\r\nContent-Length: 0\r\n\r\n",), close=True),
    Case("no reason phrase", (b"HTTP/1.1 200 \r\nContent-Length: 0\r\n\r\n",)),
    Case("head cut short", (H + b"Content-Len",), close=True),
    Case("nothing, then close", (b"",), close=True),
]


# --- generated cases ------------------------------------------------------------------------------

_BODY_BYTES = b"abcxyz0123456789 {}:\"\r\n" + b"HTTP/1.1 200 OK\r\n0\r\n\r\n"
_MUTATIONS = ("truncate", "extra", "bad_chunk", "conflicting_cl", "te_gzip", "nul_value")


def generated(seed: int) -> Case:
    rng = random.Random(seed)
    version = b"HTTP/1.0" if rng.random() < 0.2 else b"HTTP/1.1"
    method = b"POST" if rng.random() < 0.3 else b"GET"
    interim = b"".join(
        b"HTTP/1.1 %d Interim\r\n%s\r\n" % (rng.choice((100, 102, 103)), rng.choice((b"", b"Link: </x>\r\n")))
        for _ in range(rng.choice((0, 0, 0, 1, 2)))
    )
    status = rng.choice((200, 200, 201, 204, 304, 404, 500, 503))
    framing = "none" if status in (204, 304) else rng.choice(("length", "chunked", "close"))
    body = bytes(rng.choice(_BODY_BYTES) for _ in range(rng.randrange(0, 120))) if framing != "none" else b""
    fields = [(b"Content-Type", rng.choice((b"application/json", b"text/event-stream", b"text/plain")))]
    for i in range(rng.randrange(0, 4)):
        name = b"-".join(rng.choice((c.upper(), c)) for c in (b"x-gen-%d" % i).split(b"-"))
        fields.append((name, rng.choice((b"v", b"a b  c", b"v \t", b"", b"\xe9t\xe9"))))
    close = framing == "close"
    if rng.random() < 0.2:
        fields.append((b"Connection", b"close"))
        close = close or rng.random() < 0.5
    elif version == b"HTTP/1.0" and rng.random() < 0.5:
        fields.append((b"Connection", b"keep-alive"))
    payload = body
    if framing == "length":
        fields.append((b"Content-Length", b"%d" % len(body)))
    elif framing == "chunked":
        fields.append((b"Transfer-Encoding", b"chunked"))
        out, rest = [], body
        while rest:
            size = rng.randrange(1, 40)
            ext = rng.choice((b"", b"", b";a=b", b';n="v w"'))
            out.append(b"%x%s\r\n%s\r\n" % (len(rest[:size]), ext, rest[:size]))
            rest = rest[size:]
        trailers = b"X-Trailer: t\r\n" if rng.random() < 0.3 else b""
        payload = b"".join(out) + b"0\r\n" + trailers + b"\r\n"
    rng.shuffle(fields)
    head = b"%s %d Status\r\n" % (version, status) + b"".join(b"%s: %s\r\n" % f for f in fields) + b"\r\n"
    mutation = rng.choice(_MUTATIONS) if rng.random() < 0.25 else None
    added = {"conflicting_cl": b"Content-Length: 99999\r\n", "te_gzip": b"Transfer-Encoding: gzip\r\n",
             "nul_value": b"X-Nul: a\x00b\r\n"}.get(mutation or "")
    if added is not None:  # into the final answer's head (a 1xx's fields mean nothing)
        head, close = head[:-2] + added + b"\r\n", True
    stream = interim + head + payload
    if mutation == "truncate":
        stream, close = stream[:rng.randrange(1, len(stream))], True
    elif mutation == "extra":
        stream += rng.choice((b"EXTRA", NEXT))
    elif mutation == "bad_chunk" and framing == "chunked":
        stream, close = stream.replace(head, head + b"zz\r\n", 1), True
    cuts = sorted(rng.sample(range(1, len(stream)), min(len(stream) - 1, rng.randrange(0, 4))))
    pieces = tuple(stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True))
    # Content-Length added to a chunked answer: llhttp refuses CL with TE, h11 ignores the CL.
    stricter = "CL and TE both" if mutation == "conflicting_cl" and framing == "chunked" else None
    return Case(f"generated-{seed}", pieces, close=close, method=method, stricter=stricter)


GENERATED = [generated(seed) for seed in range(300)]


# --- the checks -----------------------------------------------------------------------------------


def check(case: Case, loop: str) -> None:
    expected = oracle(case)
    got = (uvloop.run if loop == "uvloop" else asyncio.run)(client(case))
    if case.stricter is not None:
        assert case.stricter in STRICTER
        assert isinstance(expected, Answer), f"{case.name}: h11 refuses it now: no longer a divergence"
        assert got == REFUSED, f"{case.name}: llhttp accepts it now: compare it with h11 instead"
        return
    if case.keeps is not None:
        assert case.keeps in KEEPS
        assert isinstance(expected, Answer) and not expected.reusable, f"{case.name}: h11 keeps it now"
        expected = replace(expected, reusable=True)
    if case.method == b"HEAD" and isinstance(expected, Answer):
        expected = replace(expected, reusable=False)  # never pooled after a HEAD (module doc)
    assert got == expected, f"{case.name} {case.pieces!r}: client {got!r}, h11 {expected!r}"


LOOPS = ["asyncio", "uvloop"]


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("case", HAND_PICKED, ids=[c.name for c in HAND_PICKED])
def test_hand_picked_cases_agree_with_h11(case: Case, loop: str) -> None:
    check(case, loop)


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("case", GENERATED, ids=[c.name for c in GENERATED])
def test_generated_cases_agree_with_h11(case: Case, loop: str) -> None:
    check(case, loop)


def test_the_generated_cases_cover_answers_refusals_and_both_reuse_decisions() -> None:
    """The generator is worth its cases: a fair share of each outcome the oracle can give."""
    outcomes = [oracle(c) for c in GENERATED]
    answers = [o for o in outcomes if isinstance(o, Answer)]
    assert sum(o == REFUSED for o in outcomes) >= 20
    assert sum(a.reusable for a in answers) >= 50 and sum(not a.reusable for a in answers) >= 50
    assert sum(len(c.pieces) > 1 for c in GENERATED) >= 150
