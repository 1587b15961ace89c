"""Which characters an engine API key may hold. Pure, a leaf (imports nothing of the appliance).

The key travels raw in an HTTP header (`Authorization: Bearer KEY`, from the gateway and the
readiness probe to the engine): a CR or LF would end the header and start another one (header
injection), a NUL or other control character breaks the request, and non-ASCII has no defined
encoding in a header. A key is refused where it is set — the gateway's admin API and the recipe —
unless every character is visible ASCII (RFC 9110 §5.5 `VCHAR`, %x21-7E); a space, legal inside a
header value, is refused too: no bearer token (RFC 6750 §2.1 `b64token`) holds one.
"""

from __future__ import annotations

# The pydantic error type of a refused key: the recipe loader quotes no input for it (the key).
ERROR_TYPE = "engine-key-chars"
RULE = ("an engine API key may hold only visible ASCII characters "
        "(0x21-0x7E: no space, control character, CR, LF, NUL or non-ASCII)")


def bad_key_chars(key: str) -> list[str]:
    """The offending characters of `key` (each as its repr, at most 5, in order), [] if it is fine.
    Never the key itself: the caller's error message must not echo a secret."""
    bad: list[str] = []
    for ch in key:
        if not "\x21" <= ch <= "\x7e" and repr(ch) not in bad:
            bad.append(repr(ch))
    return bad[:5]


def key_problem(key: str) -> str | None:
    """None if `key` may go into a header; else the rule and what broke it (no secret in it)."""
    bad = bad_key_chars(key)
    return f"{RULE}; found {', '.join(bad)}" if bad else None
