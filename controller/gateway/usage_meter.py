"""Reading a request's token usage from the engine's own answer, on the request path.

The engine counts tokens; the gateway only reads its counts (the ``usage`` object of vLLM's
OpenAI-compatible answers), it never tokenizes:

- a non-streamed answer carries ``usage`` in its body (chat, completions, embeddings);
- a stream carries it only if asked (``stream_options.include_usage``: a last event with empty
  ``choices`` and the totals). The gateway asks on every stream of the two routes that know the
  option, and also for ``continuous_usage_stats`` (every event carries the running totals), so a
  stream the client abandons is still counted: the last event that arrived says how many tokens the
  engine had produced, and vLLM counts no more once the connection is closed (its output processor
  drops an aborted request's later outputs). The client receives what it asked for: the usage the
  gateway added is removed from each event (and the last event when the client did not ask for it).

The engine's argv is not changed (vLLM's ``--enable-force-include-usage`` turns on continuous stats
for every client, which would change what clients receive).

Cost: an event as vLLM writes it is read and cut with one ``find`` and one anchored match (1.2 µs
per streamed event on the development host, ~40 µs for a 32-token stream); other spellings take a
general path (~4 µs). A non-streamed body is searched once at its end (~6 µs).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

# The routes whose streams accept ``stream_options`` in vLLM's OpenAI server.
STREAM_USAGE_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions"})

# One usage object: flat members plus at most one level of nesting (``prompt_tokens_details``).
# vLLM writes compact JSON; optional whitespace keeps other servers readable too. A string value
# cannot contain an unescaped quote, so ``"usage":`` here is always a member name, never text.
_USAGE_OBJ = rb'"usage"\s*:\s*(?:null|\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\})'
_USAGE = re.compile(_USAGE_OBJ)
_PROMPT = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
_COMPLETION = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
_USAGE_AT = re.compile(_USAGE_OBJ)  # matched at a known position (anchored: no scan)
# vLLM's own spelling (compact, this member order): read without a second search.
_VLLM_USAGE = re.compile(rb'"usage":\{"prompt_tokens":(\d+),"total_tokens":\d+,"completion_tokens":(\d+)[,}]')
_NAME = b'"usage"'
# The fast path: one vLLM event's running totals, as vLLM writes them (compact, this order, details
# null or absent), read and cut out with one match.
_VLLM_MEMBER_START = b',"usage":{"prompt_tokens":'
_VLLM_MEMBER = re.compile(
    rb',"usage":\{"prompt_tokens":(\d+),"total_tokens":\d+,"completion_tokens":(\d+)(?:,"[a-z_]+":null)*\}'
)
_WS_BYTES = frozenset(b" \t\r\n")
_FINAL_MARK = b'"choices":[]'
# What precedes the final usage event's member (an empty choices list).
_FINAL_BEFORE = re.compile(rb'"choices"\s*:\s*\[\s*\]\s*$')
# The final usage-only event, when the client did not ask for it.
_FINAL_EVENT = re.compile(rb'data: \{[^\n]*"choices"\s*:\s*\[\]\s*,\s*"usage"[^\n]*\n\n')
_ASK_BOTH = {"include_usage": True, "continuous_usage_stats": True}
_ASK_BOTH_MEMBER = b'"stream_options":{"include_usage":true,"continuous_usage_stats":true}'

# A stream whose events do not end within this many bytes is passed on as it comes (no stripping
# can be done on a half event, and the gateway must not buffer without bound).
_MAX_CARRY = 1 << 20
# A non-streamed body is kept for its usage up to this size; past it only its tail is searched.
_MAX_BODY = 4 << 20
_TAIL = 64 << 10


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seen: bool = False  # whether the engine's answer carried a usage object at all

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def parse_usage(text: bytes, usage: Usage) -> bool:
    """Update ``usage`` from the last usage object in ``text``; True if there was one."""
    at = text.rfind(b'"usage":{')
    if at >= 0:
        fast = _VLLM_USAGE.match(text, at)
        if fast is not None:
            usage.prompt_tokens = int(fast.group(1))
            usage.completion_tokens = int(fast.group(2))
            usage.seen = True
            return True
    last = None
    for last in _USAGE.finditer(text):  # noqa: B007 — the last match is the latest total
        pass
    if last is None:
        return False
    obj = last.group(0)
    p = _PROMPT.search(obj)
    c = _COMPLETION.search(obj)
    if p is None and c is None:
        return False  # "usage": null
    usage.prompt_tokens = int(p.group(1)) if p else 0
    usage.completion_tokens = int(c.group(1)) if c else 0
    usage.seen = True
    return True


@dataclass(frozen=True)
class StreamPlan:
    """What the client asked of a stream's usage; the gateway always asks the engine for both."""

    keep_final: bool  # the client asked for include_usage
    keep_continuous: bool  # the client asked for continuous_usage_stats


def plan_stream_usage(doc: dict[str, Any]) -> tuple[StreamPlan, dict[str, Any]] | None:
    """For a parsed request body that asks for a stream: what the client asked, and the
    ``stream_options`` to send upstream. None when the request is not a stream."""
    if doc.get("stream") is not True:
        return None
    options = doc.get("stream_options")
    asked: dict[str, Any] = options if isinstance(options, dict) else {}
    keep_final = asked.get("include_usage") is True
    keep_continuous = keep_final and asked.get("continuous_usage_stats") is True
    upstream = {**asked, "include_usage": True, "continuous_usage_stats": True}
    return StreamPlan(keep_final, keep_continuous), upstream


def with_stream_options(body: bytes, doc: dict[str, Any], options: dict[str, Any]) -> bytes:
    """``body`` with ``stream_options`` set to ``options``. Without one in the body, the member is
    appended before the closing brace (the rest goes upstream byte for byte); with one, the body
    is re-serialised (rare: the client asked for usage options itself)."""
    if "stream_options" in doc:
        if doc["stream_options"] == options:
            return body
        return json.dumps({**doc, "stream_options": options}, ensure_ascii=False).encode()
    end = body.rstrip().rfind(b"}")
    member = _ASK_BOTH_MEMBER if options == _ASK_BOTH else (
        b'"stream_options":' + json.dumps(options, separators=(",", ":")).encode())
    head = body[:end].rstrip()
    sep = b"" if head.endswith(b"{") else b","
    return head + sep + member + body[end:]


def ask_for_usage(body: bytes) -> tuple[bytes, StreamPlan | None]:
    """The body to send upstream and the client's own usage options, for a JSON request body that
    ``jsonbody.alias_model`` accepted (so its nesting is bounded). Not a stream: unchanged, None."""
    try:
        doc = json.loads(body)
    except ValueError:
        return body, None
    if not isinstance(doc, dict):
        return body, None
    planned = plan_stream_usage(doc)
    if planned is None:
        return body, None
    plan, options = planned
    return with_stream_options(body, doc, options), plan


class StreamMeter:
    """One stream's usage, read as its chunks pass; ``feed`` returns what the client gets."""

    __slots__ = ("_carry", "_plan", "usage")

    def __init__(self, plan: StreamPlan, usage: Usage | None = None) -> None:
        self._plan = plan
        self._carry = b""
        self.usage = usage if usage is not None else Usage()

    def feed(self, chunk: bytes) -> bytes:
        if self._carry:
            chunk = self._carry + chunk
            self._carry = b""
        if not chunk.endswith(b"\n\n"):
            cut = chunk.rfind(b"\n\n") + 2
            if cut == 1:  # no event ends in it yet
                if len(chunk) > _MAX_CARRY:
                    return chunk
                self._carry = chunk
                return b""
            self._carry = chunk[cut:]
            chunk = chunk[:cut]
        at = chunk.find(_VLLM_MEMBER_START)
        if at < 0:
            if _NAME not in chunk:
                return chunk
        elif chunk.find(_NAME, at + 10) < 0 and chunk[at - len(_FINAL_MARK):at] != _FINAL_MARK:
            # One event's running totals (nearly every chunk of a stream): read and cut in one go.
            m = _VLLM_MEMBER.match(chunk, at)
            if m is not None:
                usage = self.usage
                usage.prompt_tokens = int(m.group(1))
                usage.completion_tokens = int(m.group(2))
                usage.seen = True
                if self._plan.keep_continuous:
                    return chunk
                return chunk[:at] + chunk[m.end():]
        parse_usage(chunk, self.usage)
        plan = self._plan
        if not plan.keep_continuous:
            chunk = _strip_added(chunk)
            if not plan.keep_final and _FINAL_MARK in chunk:
                chunk = _FINAL_EVENT.sub(b"", chunk)
        return chunk

    def flush(self) -> bytes:
        """What is left of a stream that ended without a closing blank line."""
        rest, self._carry = self._carry, b""
        return rest


def _strip_added(chunk: bytes) -> bytes:
    """``chunk`` without the ``,"usage":{…}`` members of events that have choices (the running
    totals the gateway asked for); the final usage event's member (after ``"choices":[]``) stays."""
    at = chunk.find(_NAME)
    if at < 0:
        return chunk
    parts: list[bytes] = []
    last = 0
    while at >= 0:
        m = _USAGE_AT.match(chunk, at)
        if m is None:  # not an object we can read: leave the rest as it is
            break
        comma = at - 1
        while comma > 0 and chunk[comma] in _WS_BYTES:
            comma -= 1
        if chunk[comma] == 0x2C and not _FINAL_BEFORE.search(chunk, max(0, comma - 40), comma):
            parts.append(chunk[last:comma])
            last = m.end()
        at = chunk.find(_NAME, m.end())
    if not parts:
        return chunk
    parts.append(chunk[last:])
    return b"".join(parts)


class BodyMeter:
    """A non-streamed answer's usage: the body is kept (bounded) and searched once at its end."""

    __slots__ = ("_parts", "_size", "usage")

    def __init__(self, usage: Usage | None = None) -> None:
        self._parts: list[bytes] = []
        self._size = 0
        self.usage = usage if usage is not None else Usage()

    def feed(self, chunk: bytes) -> None:
        self._parts.append(chunk)
        self._size += len(chunk)
        if self._size > _MAX_BODY:
            tail = b"".join(self._parts)[-_TAIL:]
            self._parts, self._size = [tail], len(tail)

    def finish(self) -> Usage:
        if self._parts:
            body = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
            self._parts = []
            if b'"usage"' in body:
                parse_usage(body, self.usage)
        return self.usage
