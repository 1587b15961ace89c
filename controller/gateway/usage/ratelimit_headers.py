"""``x-ratelimit-*`` headers: where a key stands, on answers to keys with limits.

OpenAI's names (``x-ratelimit-limit-tokens``, ``-remaining-tokens``, ``-reset-tokens``, and the
``-requests`` ones where the key has a requests-per-minute limit), so SDKs and clients that pace
themselves by them work unchanged. Reset is the time until the bucket is full again, written as
OpenAI writes durations (``1s``, ``6m0s``; seconds rounded up).
"""

from __future__ import annotations

import math

Headers = list[tuple[bytes, bytes]]


def duration(seconds: float) -> str:
    whole = max(0, math.ceil(seconds))
    minutes, secs = divmod(whole, 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def ratelimit_headers(
    tokens: tuple[int, int, float] | None, requests: tuple[int, int, float] | None
) -> Headers:
    """The headers for a key's (limit, remaining, seconds to full) on tokens and on requests."""
    out: Headers = []
    for kind, standing in ((b"tokens", tokens), (b"requests", requests)):
        if standing is None:
            continue
        limit, remaining, reset = standing
        out.append((b"x-ratelimit-limit-" + kind, str(limit).encode()))
        out.append((b"x-ratelimit-remaining-" + kind, str(remaining).encode()))
        out.append((b"x-ratelimit-reset-" + kind, duration(reset).encode()))
    return out
