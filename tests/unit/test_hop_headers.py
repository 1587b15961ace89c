"""The hop-by-hop header filter (``controller/gateway/hop_headers.py``), called directly. The proxy's
use of it (both directions, real sockets) is in ``test_upstream_client.py``; this pins the list
syntax of ``Connection`` (written from a mutation-testing survivor: docs/mutation-testing.md)."""

from __future__ import annotations

from controller.gateway.hop_headers import HOP_BY_HOP, connection_options, end_to_end


def test_connection_options_are_trimmed_of_spaces_and_tabs_only() -> None:
    """RFC 9110 §5.6.1: the whitespace around a list member is OWS (SP / HTAB); any other byte is part
    of the name (a vertical tab does not make "x-b" hop-by-hop)."""
    headers = [(b"Connection", b" X-A ,\tx-b\t,, \x0bx-c\x0c"), (b"x-a", b"1"), (b"x-c", b"2")]
    assert connection_options(headers) == frozenset({b"x-a", b"x-b", b"\x0bx-c\x0c"})
    assert end_to_end(headers) == [(b"x-c", b"2")]


def test_the_fixed_list_and_the_named_fields_are_dropped_any_case() -> None:
    headers = [(b"Keep-Alive", b"5"), (b"connection", b"close, X-Secret"), (b"x-secret", b"k"),
               (b"x-kept", b"1"), (b"Transfer-Encoding", b"chunked")]
    assert end_to_end(headers) == [(b"x-kept", b"1")]
    assert end_to_end([(b"x-kept", b"1")], HOP_BY_HOP | {b"x-kept"}) == []
