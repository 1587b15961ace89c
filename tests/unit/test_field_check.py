"""What the upstream client refuses to write (``controller/gateway/field_check.py``), called directly:
the whole message of each refusal (it names the field, never the value) and the one-header cases the
fast path must not wave through. ``test_upstream_client.py`` holds the client to the same rules on
real sockets; these were written from mutation testing's survivors (docs/mutation-testing.md)."""

from __future__ import annotations

import pytest

from controller.gateway.field_check import UnsafeField, check_origin_part, check_request
from controller.gateway.upstream_client import Origin


def refusal(method: bytes, target: bytes, headers: list[tuple[bytes, bytes]]) -> UnsafeField:
    with pytest.raises(UnsafeField) as info:
        check_request(method, target, headers)
    return info.value


@pytest.mark.parametrize(("method", "target", "headers", "field", "message"), [
    (b"GE T", b"/", [], "method b'GE T'", "refused to send method b'GE T': not an RFC 9110 token"),
    (b"GET", b"", [], "the request target",
     "refused to send the request target: empty, or holds whitespace or a control character"),
    (b"GET", b"/a\tb", [], "the request target",
     "refused to send the request target: empty, or holds whitespace or a control character"),
    (b"GET", b"/", [(b"x a", b"secret")], "header name b'x a'",
     "refused to send header name b'x a': not an RFC 9110 token"),
    (b"GET", b"/", [(b"x-key", b"secret\r\nx-injected: 1")], "the value of header b'x-key'",
     "refused to send the value of header b'x-key': it holds CR, LF or NUL"),
])
def test_each_refusal_names_the_field_and_why_but_never_the_value(
    method: bytes, target: bytes, headers: list[tuple[bytes, bytes]], field: str, message: str
) -> None:
    exc = refusal(method, target, headers)
    assert exc.field == field
    assert str(exc) == message
    assert "secret" not in str(exc)


def test_a_long_name_is_shown_cut_to_40_bytes() -> None:
    name = b"x" * 39 + b"\x01" + b"y" * 10  # the 40th byte is the last one shown
    exc = refusal(b"GET", b"/", [(name, b"1")])
    assert exc.field == "header name " + repr(b"x" * 39 + b"\x01")


@pytest.mark.parametrize("name", [b"x:a", b"a:b:c", b":", b"x:"])
def test_a_lone_header_whose_name_holds_a_colon_is_refused(name: bytes) -> None:
    """The fast path joins the names with ':' and counts the separators: a single name holding a
    colon matches the joined pattern, only the count tells it apart."""
    assert refusal(b"POST", b"/", [(name, b"1")]).field == f"header name {name!r}"


def test_good_heads_pass() -> None:
    check_request(b"POST", b"/v1/chat?x=1", [])
    check_request(b"POST", b"/v1/chat", [(b"content-type", b"application/json"), (b"x-a", b"b\tc")])


def test_an_upstream_url_part_with_whitespace_is_refused_by_name() -> None:
    with pytest.raises(UnsafeField) as info:
        check_origin_part("the URL path", b"/base path")
    assert info.value.field == "the URL path"
    assert str(info.value) == "refused to send the URL path: it holds whitespace or a control character"
    check_origin_part("the URL path", b"/base")
    with pytest.raises(ValueError) as parsed:
        Origin.parse("http://127.0.0.1:9/base path/")
    assert str(parsed.value) == (
        "unusable upstream URL: refused to send the URL path: it holds whitespace or a control character")
