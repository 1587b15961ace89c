"""Byte-offset log reading shared by both runtimes (poll-based streaming: "what is new since offset")."""

from __future__ import annotations

import codecs
from pathlib import Path

# One poll returns at most this much: a 30-minute engine start logs well under this per second, and a
# caller that is behind simply calls again with the returned offset.
MAX_CHUNK_BYTES = 4 * 1024 * 1024


def decode_from(data: bytes, offset: int) -> tuple[str, int]:
    """Decode `data` (which starts at byte `offset`) without splitting a UTF-8 character.

    An incomplete multi-byte sequence at the end is left unread (the returned offset stops before
    it), so the next poll decodes it whole; invalid bytes elsewhere become U+FFFD instead of raising.
    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    text = decoder.decode(data, final=False)
    pending = len(decoder.getstate()[0])
    return text, offset + len(data) - pending


def slice_log(blob: bytes, offset: int) -> tuple[str, int]:
    """The text of `blob` after byte `offset` (for runtimes that can only fetch the whole log)."""
    if offset > len(blob):
        offset = 0  # the log was replaced by a shorter one: start again rather than return nothing forever
    return decode_from(blob[offset : offset + MAX_CHUNK_BYTES], offset)


def read_log_file(path: Path, offset: int) -> tuple[str, int]:
    """Text appended to `path` since byte `offset`, and the new offset. A missing file is empty."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, 2)
            if offset > size:
                offset = 0  # truncated or replaced (e.g. an operator emptied it): start again
            f.seek(offset)
            data = f.read(MAX_CHUNK_BYTES)
    except FileNotFoundError:
        return "", offset
    return decode_from(data, offset)
