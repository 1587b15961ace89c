"""What the gateway reads of a JSON request body: the top-level ``model``, and nothing else.

``json.loads`` + ``json.dumps`` of every body cost the event loop ~0.7 s for a 16 MiB body (every
other client waited), and a deeply nested body raised ``RecursionError`` (a plain-text 500). The
gateway needs one member, to check the model name (the served name or one of the recipe's aliases;
any other is a 404) and alias it to the engine's served name, so it walks the
top-level object with C-speed regular expressions instead: member names and string values are
matched whole, nested values are skipped bracket to bracket (strings inside them skipped whole,
nothing built), nesting deeper than ``max_depth`` is refused. The model's value is spliced in place,
so everything else goes upstream byte for byte. The walk checks the top-level structure only; the
engine still parses, and answers for, the rest.

The cost is one regex step per top-level member and per bracket inside nested values; bodies over
``inline_json_bytes`` are walked in a worker thread (``proxy.py``), whose regex steps release the
GIL between them, so the event loop keeps serving others meanwhile. A small body (≤ 64 KiB) whose
bracket count cannot reach ``max_depth`` (nearly every chat request) is read with ``json.loads``
instead, which is faster there; the walk then runs only when the model name must change.
"""

from __future__ import annotations

import json
import re

_WS = re.compile(rb"[ \t\n\r]*+")
# A JSON string, escapes included (possessive: no backtracking on a 16 MiB string).
_STRING = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"', re.S)
# Everything up to the next bracket, strings skipped whole (a bracket inside a string is text).
_TO_BRACKET = re.compile(rb'(?:[^"\[\]{}]++|"[^"\\]*+(?:\\.[^"\\]*+)*+")*+', re.S)
# A top-level number, true, false or null (its spelling is the engine's to check).
_SCALAR = re.compile(rb'[^\s,\[\]{}"]++')
_MODEL = b'"model"'
_OPEN = (0x7B, 0x5B)  # { [
# Larger bodies are never handed to json.loads: 16 MiB of `[1,1,…]` takes it over a second.
_LOADS_MAX_BYTES = 64 * 1024
_CLOSE = (0x7D, 0x5D)  # } ]


class BodyError(ValueError):
    """The body cannot be accepted; ``str(exc)`` says why (sent to the client with a 400)."""


def model_spans(body: bytes, max_depth: int) -> list[tuple[int, int]]:
    """Byte spans of the string values of the top-level ``"model"`` members (usually one).
    Raises ``BodyError`` if the body is not a JSON object or nests deeper than ``max_depth``."""
    n = len(body)
    ws = _WS.match
    p = ws(body, 0).end()  # type: ignore[union-attr]
    if p >= n or body[p] != 0x7B:
        raise BodyError("malformed JSON body: expected a JSON object")
    p = ws(body, p + 1).end()  # type: ignore[union-attr]
    spans: list[tuple[int, int]] = []
    if p < n and body[p] == 0x7D:
        p += 1
    else:
        while True:
            m = _STRING.match(body, p)
            if m is None:
                raise BodyError(f"malformed JSON body: expected a member name at byte {p}")
            is_model = m.end() - p == 7 and body[p : m.end()] == _MODEL
            p = ws(body, m.end()).end()  # type: ignore[union-attr]
            if p >= n or body[p] != 0x3A:
                raise BodyError(f"malformed JSON body: expected ':' at byte {p}")
            p = ws(body, p + 1).end()  # type: ignore[union-attr]
            if p >= n:
                raise BodyError("malformed JSON body: unexpected end")
            c = body[p]
            if c == 0x22:
                m = _STRING.match(body, p)
                if m is None:
                    raise BodyError(f"malformed JSON body: unterminated string at byte {p}")
                if is_model:
                    spans.append((p, m.end()))
                p = m.end()
            elif c in _OPEN:
                p = _skip_container(body, p, max_depth)
            else:
                m = _SCALAR.match(body, p)
                if m is None:
                    raise BodyError(f"malformed JSON body: unexpected byte at {p}")
                p = m.end()
            p = ws(body, p).end()  # type: ignore[union-attr]
            if p >= n:
                raise BodyError("malformed JSON body: unexpected end")
            c = body[p]
            if c == 0x2C:
                p = ws(body, p + 1).end()  # type: ignore[union-attr]
            elif c == 0x7D:
                p += 1
                break
            else:
                raise BodyError(f"malformed JSON body: expected ',' or '}}' at byte {p}")
    if ws(body, p).end() != n:  # type: ignore[union-attr]
        raise BodyError(f"malformed JSON body: data after the object at byte {p}")
    return spans


def _skip_container(body: bytes, p: int, max_depth: int) -> int:
    """``body[p]`` opens a member value (depth 2: the top-level object is depth 1). Returns the
    index after its closing bracket."""
    n = len(body)
    to_bracket = _TO_BRACKET.match
    depth = 1
    while True:
        c = body[p]
        if c in _OPEN:
            depth += 1
            if depth > max_depth:
                raise BodyError(f"JSON body nested deeper than {max_depth} levels")
        elif c in _CLOSE:
            depth -= 1
            if depth == 1:
                return p + 1
        else:  # a quote the string pattern could not close
            raise BodyError(f"malformed JSON body: unterminated string at byte {p}")
        p = to_bracket(body, p + 1).end()  # type: ignore[union-attr]
        if p >= n:
            raise BodyError("malformed JSON body: unexpected end")


class ModelNotFound(Exception):
    """The body names a model the gateway does not serve (neither the served name nor an alias).
    ``body()`` is OpenAI's answer for it (sent with a 404)."""

    # A model name is echoed back; a name of megabytes is not.
    _SHOWN_CHARS = 256

    def __init__(self, model: str) -> None:
        super().__init__(model)
        self.model = model

    def body(self) -> bytes:
        shown = self.model if len(self.model) <= self._SHOWN_CHARS else self.model[: self._SHOWN_CHARS] + "…"
        return json.dumps({"error": {
            "message": f"The model `{shown}` does not exist or you do not have access to it.",
            "type": "invalid_request_error", "param": "model", "code": "model_not_found",
        }}, ensure_ascii=False).encode()


class ModelRef:
    """A JSON body's top-level model name, read once: ``name`` is the string the engine reads (the
    last string ``"model"`` member; None when there is none), ``spans`` the byte spans of every string
    ``"model"`` member when the body was walked (None: read with ``json.loads``, walked only if the
    name must be rewritten). The gateway routes on ``name`` (a dict lookup) and then rewrites with
    ``aliased``: one read of the body for both."""

    __slots__ = ("body", "max_depth", "name", "spans")

    def __init__(self, body: bytes, max_depth: int, name: str | None,
                 spans: list[tuple[int, int]] | None) -> None:
        self.body = body
        self.max_depth = max_depth
        self.name = name
        self.spans = spans

    def aliased(self, served_model: str | None, aliases: frozenset[str] = frozenset()) -> bytes:
        """The body to send to an engine serving ``served_model`` (see ``alias_model``)."""
        body = self.body
        if served_model is None:
            return body
        spans = self.spans
        if spans is None:
            # json.loads keeps the last of repeated "model" members; the walk checks each of them.
            if body.count(_MODEL) < 2 and (self.name is None or self.name == served_model):
                return body
            spans = self.spans = model_spans(body, self.max_depth)
        return _splice(body, spans, served_model, aliases, self.name)


def read_model(body: bytes, max_depth: int) -> ModelRef:
    """Read ``body``'s top-level model name (``ModelRef``). Raises ``BodyError`` for a body that is
    not a JSON object or nests deeper than ``max_depth``."""
    if len(body) <= _LOADS_MAX_BYTES and body.count(b"[") + body.count(b"{") <= max_depth:
        # Too few brackets to nest past the bound (even counting those inside strings), so the C
        # parser's recursion is bounded too; and small, so the parse (one C call that holds the
        # GIL throughout) is short.
        try:
            doc = json.loads(body)
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
            raise BodyError(f"malformed JSON body: {exc}") from exc
        if not isinstance(doc, dict):
            raise BodyError("malformed JSON body: expected a JSON object")
        model = doc.get("model")
        return ModelRef(body, max_depth, model if isinstance(model, str) else None, None)
    spans = model_spans(body, max_depth)
    name: str | None = None
    if spans:
        start, end = spans[-1]
        try:
            last = json.loads(body[start:end])
        except ValueError as exc:  # a bad escape or bad UTF-8 inside the name
            raise BodyError(f"malformed JSON body: model name: {exc}") from exc
        name = last if isinstance(last, str) else None
    return ModelRef(body, max_depth, name, spans)


def alias_model(
    body: bytes, served_model: str | None, max_depth: int, aliases: frozenset[str] = frozenset()
) -> bytes:
    """The body to send upstream: ``body`` itself, or a copy whose top-level ``model`` string is
    ``served_model`` (the engine knows one served name; the recipe's aliases are rewritten to it).
    Raises ``ModelNotFound`` for a model string that is neither, so that an unknown name is never
    served by whatever engine runs (a client asking for `gpt-4o` must not get smollm2's answer).
    Not checked: a body without a string ``model`` (the engine answers for it), and any body while
    the served name is unknown (``served_model`` None: the gateway was started without one).
    Raises ``BodyError`` for a body that is not a JSON object or nests deeper than ``max_depth``."""
    return read_model(body, max_depth).aliased(served_model, aliases)


def _splice(
    body: bytes, spans: list[tuple[int, int]], served_model: str | None, aliases: frozenset[str],
    last_name: str | None = None,
) -> bytes:
    if served_model is None or not spans:
        return body
    served = json.dumps(served_model, ensure_ascii=False).encode()
    parts: list[bytes] = []
    last = 0
    for start, end in spans:
        if body[start:end] == served:
            continue
        if last_name is not None and (start, end) == spans[-1]:
            current: str = last_name  # decoded once already (``read_model``)
        else:
            try:
                current = json.loads(body[start:end])
            except ValueError as exc:  # a bad escape or bad UTF-8 inside the name
                raise BodyError(f"malformed JSON body: model name: {exc}") from exc
        if current == served_model:
            continue
        if current not in aliases:
            raise ModelNotFound(current)
        parts += (body[last:start], served)
        last = end
    if not parts:
        return body
    parts.append(body[last:])
    return b"".join(parts)
