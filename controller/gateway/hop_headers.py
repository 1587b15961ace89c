"""Hop-by-hop header fields: what a proxy must not forward, either direction (RFC 9110 §7.6.1).

A fixed list is not enough: a sender may name any other field in ``Connection`` to make it
hop-by-hop (``Connection: x-secret`` says "x-secret is for the next hop only"), so every field named
in any ``Connection`` header (comma-separated, case-insensitive) is dropped too, with ``Connection``
itself. The caller adds the fields it drops for its own reasons (credentials, framing it redoes)."""

from __future__ import annotations

Headers = list[tuple[bytes, bytes]]

# RFC 9110 §7.6.1 and the ones every proxy drops in practice (RFC 7230 §6.1's list, Proxy-Connection).
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)


def connection_options(headers: Headers) -> frozenset[bytes]:
    """The field names listed in the ``Connection`` headers, lower-cased."""
    named: set[bytes] = set()
    for name, value in headers:
        if name.lower() == b"connection":
            for option in value.split(b","):
                option = option.strip(b" \t").lower()
                if option:
                    named.add(option)
    return frozenset(named)


def end_to_end(headers: Headers, drop: frozenset[bytes] = HOP_BY_HOP) -> Headers:
    """``headers`` without the hop-by-hop ones: ``drop`` (lower-case names; it should include
    ``HOP_BY_HOP``) and every field a ``Connection`` header names. Names are compared lower-cased,
    so this works on a client's lower-cased names and on an upstream's as sent."""
    named = connection_options(headers)
    if named:
        drop = drop | named
    return [(name, value) for name, value in headers if name.lower() not in drop]
