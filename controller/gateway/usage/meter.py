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

Every route the engine serves is read: OpenAI's ``prompt_tokens``/``completion_tokens`` and the
Responses and Anthropic Messages APIs' ``input_tokens``/``output_tokens``, in bodies and in streamed
events (a Responses stream's ``response.completed`` carries ``response.usage``; a Messages stream's
``message_start`` carries ``usage.input_tokens`` and each ``message_delta`` the running
``usage.output_tokens``). With ``n`` > 1 or several prompts, vLLM's running totals are per choice
(each event's ``usage.completion_tokens`` counts its own choice index), so they are summed per index
and the prompt counted once per prompt; the final usage event, when it comes, is the engine's total.

The engine's argv is not changed (vLLM's ``--enable-force-include-usage`` turns on continuous stats
for every client, which would change what clients receive).

Cost: an event as vLLM writes it is read and cut with one ``find`` and one anchored match (1.2 µs
per streamed event on the development host, ~40 µs for a 32-token stream); other spellings take a
general path (~4 µs). A non-streamed body is searched once at its end (~6 µs).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from controller.gateway.usage.request import RequestFacts, lax_bool, parse_body

# The routes whose streams accept ``stream_options`` in vLLM's OpenAI server.
STREAM_USAGE_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions"})
# The routes whose streams carry their usage without being asked (the Responses API's
# ``response.completed``, the Messages API's ``message_start``/``message_delta``).
USAGE_EVENT_ROUTES = frozenset({"/v1/responses", "/v1/messages"})

# One usage object: flat members plus at most one level of nesting (``prompt_tokens_details``).
# vLLM writes compact JSON; optional whitespace keeps other servers readable too. A string value
# cannot contain an unescaped quote, so ``"usage":`` here is always a member name, never text.
_USAGE_OBJ = rb'"usage"\s*:\s*(?:null|\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\})'
_USAGE = re.compile(_USAGE_OBJ)
_PROMPT = re.compile(rb'"(?:prompt|input)_tokens"\s*:\s*(\d+)')
_COMPLETION = re.compile(rb'"(?:completion|output)_tokens"\s*:\s*(\d+)')
# The choice an OpenAI event is about (vLLM sends one choice per event).
_INDEX = re.compile(rb'"choices"\s*:\s*\[\s*\{\s*"index"\s*:\s*(\d+)')
_CHOICES = b'"choices"'
_EMPTY_CHOICES = re.compile(rb'"choices"\s*:\s*\[\s*\]')
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
    estimated: bool = False  # no count reached the gateway; the prompt was estimated (``settle``)

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
    """What the client asked of a stream's usage; the gateway always asks the engine for both.
    An observed stream (one the gateway did not ask usage of) keeps both: nothing is removed."""

    keep_final: bool  # the client asked for include_usage
    keep_continuous: bool  # the client asked for continuous_usage_stats
    choices: int = 1  # n: choice indices i*n .. i*n+n-1 belong to prompt i (vLLM's numbering)


OBSERVE = StreamPlan(keep_final=True, keep_continuous=True)


@dataclass(frozen=True)
class RequestPlan:
    """A JSON request as it goes upstream, and what the meter knows of it."""

    body: bytes
    facts: RequestFacts | None  # None: not a JSON object (the engine refuses it)
    stream: StreamPlan | None  # None: the engine will not stream it


def plan_stream_usage(doc: dict[str, Any], choices: int = 1) -> tuple[StreamPlan, dict[str, Any]] | None:
    """For a parsed request body that asks for a stream (``stream`` as pydantic's lax bool reads
    it, as the engine does): what the client asked, and the ``stream_options`` to send upstream.
    None when the request is not a stream, or its ``stream_options`` is not an object (the engine
    refuses the request; the gateway does not repair it)."""
    if lax_bool(doc.get("stream")) is not True:
        return None
    options = doc.get("stream_options")
    if options is not None and not isinstance(options, dict):
        return None
    asked: dict[str, Any] = options if isinstance(options, dict) else {}
    keep_final = lax_bool(asked.get("include_usage")) is True
    keep_continuous = keep_final and lax_bool(asked.get("continuous_usage_stats")) is True
    upstream = {**asked, "include_usage": True, "continuous_usage_stats": True}
    return StreamPlan(keep_final, keep_continuous, choices), upstream


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


def plan_request(body: bytes, route: str) -> RequestPlan:
    """The body to send upstream for a JSON request that ``jsonbody.alias_model`` accepted (so its
    nesting is bounded), and what the meter knows of it. On the two routes that take
    ``stream_options``, a stream asks the engine for running totals; any other stream is observed
    (its usage events read, nothing changed)."""
    doc, facts = parse_body(body, route)
    if doc is None or facts is None or not facts.stream:
        return RequestPlan(body, facts, None)
    if route in STREAM_USAGE_ROUTES:
        planned = plan_stream_usage(doc, facts.choices)
        if planned is not None:
            plan, options = planned
            return RequestPlan(with_stream_options(body, doc, options), facts, plan)
    return RequestPlan(body, facts, StreamPlan(True, True, facts.choices))


def ask_for_usage(body: bytes) -> tuple[bytes, StreamPlan | None]:
    """``plan_request`` on a chat completion: the body to send and the client's usage options."""
    planned = plan_request(body, "/v1/chat/completions")
    return planned.body, planned.stream


class StreamMeter:
    """One stream's usage, read as its chunks pass; ``feed`` returns what the client gets."""

    __slots__ = ("_by_choice", "_by_prompt", "_carry", "_final", "_plan", "usage")

    def __init__(self, plan: StreamPlan, usage: Usage | None = None) -> None:
        self._plan = plan
        self._carry = b""
        self.usage = usage if usage is not None else Usage()
        # The latest running total per choice index, and the prompt tokens per prompt: the sums
        # are the usage until the engine's own final total arrives (``_final``).
        self._by_choice: dict[int, int] = {}
        self._by_prompt: dict[int, int] = {}
        self._final = False

    def _running(self, index: int, prompt: int, completion: int) -> None:
        """One event's running totals (vLLM's: for its own choice index)."""
        if self._final:
            return
        usage = self.usage
        usage.seen = True
        by_choice = self._by_choice
        usage.completion_tokens += completion - by_choice.get(index, 0)
        by_choice[index] = completion
        group = index // self._plan.choices if self._plan.choices > 0 else 0
        by_prompt = self._by_prompt
        usage.prompt_tokens += prompt - by_prompt.get(group, 0)
        by_prompt[group] = prompt

    def _total(self, prompt: int | None, completion: int | None) -> None:
        """The engine's total for the whole request (a final usage event): it replaces the sums."""
        usage = self.usage
        self._final = usage.seen = True
        if prompt is not None:
            usage.prompt_tokens = prompt
        if completion is not None:
            usage.completion_tokens = completion

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
                start = chunk.rfind(b"\n\n", 0, at) + 2
                index = _INDEX.search(chunk, start, at)
                self._running(int(index.group(1)) if index is not None else 0,
                              int(m.group(1)), int(m.group(2)))
                if self._plan.keep_continuous:
                    return chunk
                return chunk[:at] + chunk[m.end():]
        for event in chunk.split(b"\n\n"):
            if event:
                self._read_event(event)
        plan = self._plan
        if not plan.keep_continuous:
            chunk = _strip_added(chunk)
            if not plan.keep_final and _FINAL_MARK in chunk:
                chunk = _FINAL_EVENT.sub(b"", chunk)
        return chunk

    def _read_event(self, event: bytes) -> None:
        """The usage in one event (without its closing blank line), whatever API wrote it."""
        if _NAME not in event:
            return
        if _CHOICES in event:  # OpenAI's chunks: running totals per choice, or the final total
            u = Usage()
            if not parse_usage(event, u):
                return
            if _EMPTY_CHOICES.search(event) is not None:
                self._total(u.prompt_tokens, u.completion_tokens)
            else:
                index = _INDEX.search(event)
                self._running(int(index.group(1)) if index is not None else 0,
                              u.prompt_tokens, u.completion_tokens)
            return
        doc = _event_json(event)
        if doc is None:
            u = Usage()
            if parse_usage(event, u):  # not JSON we can read: its last usage object, as a total
                self._total(u.prompt_tokens, u.completion_tokens)
            return
        kind = doc.get("type")
        if kind == "message_start":  # Anthropic: the prompt, counted before the first token
            message = doc.get("message")
            found = _usage_numbers(message.get("usage") if isinstance(message, dict) else None)
            if found is not None:
                self._messages(*found)
            return
        if kind == "message_delta":  # Anthropic: output_tokens is the running total
            found = _usage_numbers(doc.get("usage"))
            if found is not None:
                self._messages(*found)
            return
        response = doc.get("response")
        if isinstance(response, dict) and "usage" in response:  # Responses: response.completed & co
            found = _usage_numbers(response.get("usage"))
        else:
            found = _usage_numbers(doc.get("usage"))
        if found is not None:
            self._total(*found)

    def _messages(self, prompt: int | None, completion: int | None) -> None:
        # A Messages stream's counts arrive piecemeal (input at the start, output as it grows); a
        # member an event does not carry keeps its earlier value, and a zero never lowers one.
        usage = self.usage
        usage.seen = True
        if prompt:
            usage.prompt_tokens = max(usage.prompt_tokens, prompt)
        if completion:
            usage.completion_tokens = max(usage.completion_tokens, completion)

    def flush(self) -> bytes:
        """What is left of a stream that ended without a closing blank line."""
        rest, self._carry = self._carry, b""
        return rest


def _event_json(event: bytes) -> dict[str, Any] | None:
    """The JSON object of an SSE event's ``data:`` lines; None if it has none or is not JSON."""
    data = [line[5:] for line in event.split(b"\n") if line.startswith(b"data:")]
    if not data:
        return None
    try:
        doc = json.loads(b"\n".join(data))
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _count(obj: dict[str, Any], *names: str) -> int | None:
    for name in names:
        value = obj.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def _usage_numbers(obj: Any) -> tuple[int | None, int | None] | None:
    """(prompt, completion) of a usage object in either API's names; None if it has neither."""
    if not isinstance(obj, dict):
        return None
    prompt = _count(obj, "prompt_tokens", "input_tokens")
    completion = _count(obj, "completion_tokens", "output_tokens")
    if prompt is None and completion is None:
        return None
    return prompt, completion


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


@dataclass
class Metering:
    """One request's metering, from admission to the record (``usage.Accounting.record``)."""

    usage: Usage = field(default_factory=Usage)
    facts: RequestFacts | None = None  # what its JSON body said (None: not JSON, or not read yet)
    plan: StreamPlan | None = None  # a stream the gateway planned for (asked or observes usage of)
    quota: bool = False  # the key has a token quota: an answer that cannot be metered is refused
    reserved: int = 0  # tokens taken from the key's buckets at admission (``quota.reserve``)
    sent: bool = False  # the request went to the engine (which then may have done work for it)
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)  # x-ratelimit-* for answers
    body: bytes = b""  # the JSON body sent, for ``settle``'s estimate when ``facts`` was not read
    # The served name of the engine that took the request (``engines.Engine.label``), "unknown" until
    # one did: the metrics' and the usage record's ``model``; never a string the client chose.
    model: str = "unknown"

    def stream_plan(self, path: str) -> StreamPlan | None:
        """How to read an event stream the engine answered with; None when it cannot be metered.
        A stream nobody planned for (the engine decided otherwise than the gateway) is observed:
        its usage events are read, nothing is removed."""
        if self.plan is not None:
            return self.plan
        if path in USAGE_EVENT_ROUTES or not self.quota:
            return OBSERVE
        return None

    def settle(self) -> None:
        """The request reached the engine but no count reached the gateway (the client left
        during the prefill or before a non-streamed body, the answer broke off before its usage):
        charge what is known of it, the prompt, estimated from its text (``usage.request``)."""
        usage = self.usage
        if not self.sent or usage.seen:
            return
        facts = self.facts if self.facts is not None or not self.body else parse_body(self.body)[1]
        if facts is not None:
            usage.prompt_tokens = max(usage.prompt_tokens, facts.prompt_estimate)
            usage.estimated = True
