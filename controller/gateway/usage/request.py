"""What a request body tells the meter, read exactly as the engine reads it.

vLLM's OpenAI server takes a body as JSON when its media type is ``application/json`` (compared
case-insensitively, parameters allowed: RFC 9110 §8.3.1), decodes it with ``json.loads`` (escapes in
member names decoded, the last of duplicate members wins) and validates it with pydantic models in lax
mode. So ``"stream": 1``, ``"true"``, ``"YES"``, ``"on"``, ``1.0`` and ``"str\\u0065am": true`` all
stream. The gateway decides the same way, with the same library: ``json.loads`` for the document and
pydantic's own lax ``bool``/``int`` validation for the members it needs (a hand-written list of
spellings would drift from pydantic's).

The media-type test is deliberately wider than the engine's (``+json`` suffixes and a missing type
are taken as JSON too, as FastAPI does on routes without vLLM's check): metering a body the engine
refuses costs nothing, missing one it serves is a quota bypass.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter, ValidationError

_BOOL: TypeAdapter[bool] = TypeAdapter(bool)
_INT: TypeAdapter[int] = TypeAdapter(int)

# One token per this many characters of prompt text: the usual English rule of thumb. Most
# tokenizers produce more tokens than this for code and non-Latin scripts, so the estimate stays
# at or under the engine's own count for most prompts (it is charged only when the engine's count
# never reached the gateway).
CHARS_PER_TOKEN = 4
# Members whose string values are prompt text, across the routes the engine serves.
_PROMPT_MEMBERS = ("messages", "prompt", "input", "system", "instructions", "text", "query",
                   "documents", "text_1", "text_2")
_OUTPUT_LIMITS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
# vLLM's completions default for max_tokens (its request model's field default, used only when the
# member is absent: an explicit null means no bound there).
_COMPLETIONS_DEFAULT_MAX_TOKENS = 16
_CHAT_ROUTES = ("/v1/chat/completions", "/v1/chat/completions/batch")
# One conversation per element of ``messages``, each generated on its own (vLLM 0.32).
_BATCH_ROUTE = "/v1/chat/completions/batch"


def is_json_media_type(content_type: bytes) -> bool:
    """Whether the engine may take a body with this Content-Type as JSON: no type at all,
    ``application/json`` or ``application/*+json``; type and subtype case-insensitive (RFC 9110),
    parameters ignored."""
    media = content_type.split(b";", 1)[0].strip().lower()
    if not media:
        return True
    kind, _, subtype = media.partition(b"/")
    return kind == b"application" and (subtype == b"json" or subtype.endswith(b"+json"))


def may_stream(body: bytes) -> bool:
    """False only when no member of ``body`` can be named ``stream``: the name is not spelled out,
    and no ``\\u`` escape could spell it (``"str\\u0065am"``). Saves parsing most bodies twice."""
    return b"stream" in body or b"\\u" in body


def lax_bool(value: Any) -> bool | None:
    """``value`` as pydantic's lax ``bool`` takes it (what the engine's request model does); None
    when pydantic refuses it (the engine answers 400 then). JSON null is the engine's default."""
    if value is None:
        return False
    try:
        return _BOOL.validate_python(value)
    except ValidationError:
        return None


def lax_int(value: Any) -> int | None:
    """``value`` as pydantic's lax ``int`` takes it (``4``, ``"4"``, ``4.0``); None if refused."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return _INT.validate_python(value)
    except ValidationError:
        return None


@dataclass(frozen=True)
class RequestFacts:
    """What the meter needs to know about one request before its answer comes."""

    stream: bool  # the engine will answer with an event stream
    choices: int = 1  # n: completions per prompt
    prompts: int = 1  # prompts in one request (``/v1/completions`` takes a list)
    max_tokens: int | None = None  # the output bound per choice, if the client set one
    prompt_estimate: int = 0  # tokens, from the text (``CHARS_PER_TOKEN``), never from a tokenizer

    @property
    def outputs(self) -> int:
        return self.choices * self.prompts

    def reservation(self) -> int | None:
        """Tokens this request can cost at most (prompt estimate + max_tokens x n x prompts);
        None when the client set no output bound (the engine then fills the context)."""
        if self.max_tokens is None:
            return None
        return self.prompt_estimate + self.max_tokens * self.outputs


def _text_chars(value: Any) -> int:
    """Characters of text in a JSON value; data URLs (base64 images, audio) are not text."""
    if isinstance(value, str):
        return 0 if value.startswith("data:") else len(value)
    if isinstance(value, list):
        return sum(_text_chars(v) for v in value)
    if isinstance(value, dict):
        return sum(_text_chars(v) for v in value.values())
    return 0


def _prompt_count(prompt: Any) -> int:
    # /v1/completions: a string, a list of strings, a list of token ids, or a list of such lists.
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        return len(prompt)
    return 1


def _token_ids(prompt: Any) -> int:
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    if isinstance(prompt, list):
        return sum(_token_ids(p) for p in prompt if isinstance(p, list))
    return 0


def _bound(value: Any) -> int | None:
    """An output bound as the engine's ``int | None`` field takes it; None: no usable bound."""
    bound = lax_int(value)
    return bound if bound is not None and bound >= 0 else None


def output_limit(doc: dict[str, Any], route: str | None) -> int | None:
    """The output bound per choice the engine applies on ``route``, read from the members that
    route reads (vLLM 0.32); None when there is none. Each route has its own member: a bound in a
    member the route ignores bounds nothing (chat ignores ``max_output_tokens``, and takes
    ``max_completion_tokens`` over ``max_tokens`` whenever it is not null), so the smallest of
    them all let ``{"max_output_tokens": 1, "max_tokens": 4000}`` reserve one token for 4000. On a
    route the gateway does not know, the largest bound given (a guess either way, so the safe one)."""
    if route in _CHAT_ROUTES:
        completion = doc.get("max_completion_tokens")
        return _bound(doc.get("max_tokens") if completion is None else completion)
    if route == "/v1/completions":
        # Absent: the model's default of 16; ``null``: no bound (the engine fills the context).
        return _bound(doc["max_tokens"]) if "max_tokens" in doc else _COMPLETIONS_DEFAULT_MAX_TOKENS
    if route == "/v1/responses":
        return _bound(doc.get("max_output_tokens"))
    if route == "/v1/messages":
        return _bound(doc.get("max_tokens"))
    bounds = [b for name in _OUTPUT_LIMITS if (b := _bound(doc.get(name))) is not None]
    return max(bounds) if bounds else None


def read_facts(doc: dict[str, Any], route: str | None = None) -> RequestFacts:
    """The facts of a parsed JSON request body (``json.loads``'s document: escapes decoded, the
    last duplicate member kept, as the engine sees it) sent to ``route``."""
    stream = lax_bool(doc.get("stream")) is True
    n = lax_int(doc.get("n"))
    choices = n if n is not None and n > 0 else 1
    prompt = doc.get("prompt")
    prompts = _prompt_count(prompt)
    messages = doc.get("messages")
    if route == _BATCH_ROUTE and isinstance(messages, list) and messages:
        prompts = len(messages)  # one generation per conversation
    chars = sum(_text_chars(doc.get(m)) for m in _PROMPT_MEMBERS)
    estimate = -(-chars // CHARS_PER_TOKEN) + _token_ids(prompt)
    return RequestFacts(stream, choices, prompts, output_limit(doc, route), estimate)


def parse_body(
    body: bytes, route: str | None = None
) -> tuple[dict[str, Any] | None, RequestFacts | None]:
    """The JSON object of a request body and its facts on ``route``; (None, None) if it is not one."""
    try:
        doc = json.loads(body)
    except ValueError:  # the engine refuses it too (400): nothing streams
        return None, None
    if not isinstance(doc, dict):
        return None, None
    return doc, read_facts(doc, route)
