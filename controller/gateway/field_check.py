"""What the upstream client refuses to write: a request line or header field that would change the
framing of the request it is part of (RFC 9110 §5.1, §5.5; RFC 9112 §3, §5).

The headers the gateway sends upstream are mostly the client's (uvicorn's parser already refused
CR/LF in them), but some are not: the engine key set through ``PUT /admin/upstream``
(``upstream.authorization``) and whatever a caller of ``UpstreamPool.request`` passes. A CR or LF in
one of those splits the request into two (header injection, request smuggling toward the engine), a
NUL is refused or cut by some parsers and not others. So the check sits where the bytes are written,
for every request, whoever built the headers: a name must be an RFC 9110 token, a value must hold no
CR, LF or NUL, the method must be a token and the target hold no space or control character. The
checks are one regular expression over all names and one over all values (the common case costs two
scans); only a refusal looks for the field to name. Errors name the field, never its value (the
value may be a key)."""

from __future__ import annotations

import re

# RFC 9110 §5.6.2: token = 1*tchar.
_TCHAR = rb"!#$%&'*+\-.^_`|~0-9A-Za-z"
_TOKEN = re.compile(rb"[" + _TCHAR + rb"]+")
# Names joined by a colon (never a tchar): all tokens when this matches and the colons are exactly the
# separators (a name holding a colon adds one).
_TOKENS = re.compile(rb"[" + _TCHAR + rb"]+(?::[" + _TCHAR + rb"]+)*")
# RFC 9110 §5.5: CR, LF and NUL are never valid in a field value.
_UNSAFE_VALUE = re.compile(rb"[\r\n\x00]")
# RFC 9112 §3.2: the target has no whitespace; no control character either (nothing legitimate has one).
_UNSAFE_TARGET = re.compile(rb"[\x00-\x20\x7f]")


class UnsafeField(ValueError):
    """A request line or header field the client will not write (``field`` names it)."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"refused to send {field}: {why}")
        self.field = field


def _shown(name: bytes) -> str:
    # A name is not secret, but it may be long or hold control bytes: shown escaped and cut.
    return repr(name[:40])


def check_request(method: bytes, target: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    """Raise ``UnsafeField`` unless every part of the request head can be written as it is."""
    if not _TOKEN.fullmatch(method):
        raise UnsafeField(f"method {_shown(method)}", "not an RFC 9110 token")
    if not target or _UNSAFE_TARGET.search(target):
        raise UnsafeField("the request target", "empty, or holds whitespace or a control character")
    if not headers:
        return
    names = b":".join([name for name, _ in headers])
    if _TOKENS.fullmatch(names) is None or names.count(b":") != len(headers) - 1:
        for name, _ in headers:
            if not _TOKEN.fullmatch(name):
                raise UnsafeField(f"header name {_shown(name)}", "not an RFC 9110 token")
    if _UNSAFE_VALUE.search(b"".join([value for _, value in headers])) is not None:
        for name, value in headers:
            if _UNSAFE_VALUE.search(value):
                raise UnsafeField(f"the value of header {_shown(name)}", "it holds CR, LF or NUL")


def check_origin_part(what: str, value: bytes) -> None:
    """The Host header and path prefix an upstream URL gives every request (checked once per URL)."""
    if _UNSAFE_TARGET.search(value):
        raise UnsafeField(what, "it holds whitespace or a control character")
