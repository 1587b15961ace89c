"""StreamRedactor: the engine's output, cut anywhere by pipe reads, reaches the log without a key."""

from __future__ import annotations

import pytest

from appliance.engine_secret import REDACTED, StreamRedactor, redact

KEY = "eng_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8S9t0U1v"  # the appliance's own shape (43 after eng_)
OWN = "recipe-own-key-not-a-pattern"
TEXT = (
    f"INFO non-default args: {{'api_key': ['{OWN}'], 'port': 8000}}\n"
    f"argv: --api-key {OWN} --port 8000\r"
    f"progress 10%\rprogress 20% {KEY}\n"
    "caf\xe9 \udcff ok\n"  # non-UTF-8 bytes pass through (surrogateescape)
    f"last line without an end {OWN}"
).encode("utf-8", "surrogateescape")


def _through(chunks: list[bytes], **kw: int) -> bytes:
    r = StreamRedactor([OWN], **kw)
    return b"".join(r.feed(c) for c in chunks) + r.flush()


def test_whole_stream_is_redact_of_the_text() -> None:
    want = redact(TEXT.decode("utf-8", "surrogateescape"), [OWN]).encode("utf-8", "surrogateescape")
    assert _through([TEXT]) == want
    assert KEY.encode() not in want and OWN.encode() not in want and want.count(REDACTED.encode()) == 4


@pytest.mark.parametrize("cut", range(1, len(TEXT)))
def test_a_key_cut_by_any_read_boundary_is_still_redacted(cut: int) -> None:
    assert _through([TEXT[:cut], TEXT[cut:]]) == _through([TEXT])


def test_byte_by_byte_is_the_same() -> None:
    assert _through([TEXT[i:i + 1] for i in range(len(TEXT))]) == _through([TEXT])


def test_a_line_that_never_ends_is_passed_on_at_whitespace_without_splitting_a_key() -> None:
    noise = b"x" * 100 + b" "
    stream = noise * 5 + OWN.encode() + b" " + noise
    r = StreamRedactor([OWN], max_line=150)
    out = [r.feed(stream[i:i + 7]) for i in range(0, len(stream), 7)]
    assert any(out) and len(r._pending) <= 150 + 7  # bounded while the line goes on
    got = b"".join(out) + r.flush()
    assert OWN.encode() not in got and REDACTED.encode() in got
