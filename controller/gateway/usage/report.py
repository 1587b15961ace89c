"""Usage as the operator asks for it: a time range in words, keys by name or id, rows and totals.

Shared by ``appliance usage`` (which reads the file itself, or the API) and the controller's
``GET /usage``, so both accept the same ``--since``/``since`` spellings and refuse the same ranges.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from datetime import UTC, datetime

from controller.gateway.keystore import KeyRecord
from controller.gateway.usage.store import UsageRow

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
# Ten years back is as far as a query may reach (retention keeps far less); "absurd" is refused.
MAX_SPAN_S = 10 * 365 * 86400


class RangeError(ValueError):
    """A time or range the operator wrote that cannot be used; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def parse_time(field: str, text: str | None, now: float) -> float | None:
    """``24h``/``7d``/``30m`` (ago), ISO 8601 (``2026-12-01``, ``2026-12-01T10:00``, UTC unless it
    says otherwise) or Unix seconds. None/empty: no bound."""
    if text is None or not text.strip():
        return None
    text = text.strip()
    m = _RELATIVE.match(text)
    if m:
        return now - float(m.group(1)) * _UNIT_S[m.group(2)]
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        if value != value or value in (float("inf"), float("-inf")):
            raise RangeError(field, f"{text!r} is not a time")
        return value
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise RangeError(
            field, f"{text!r} is not a time: write 24h, 7d, 2026-12-01, 2026-12-01T10:00 or Unix seconds"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def parse_range(since: str | None, until: str | None, now: float | None = None) -> tuple[float, float]:
    """The [since, until) to query; default the last 24 hours. ``RangeError`` for a range that is
    empty, reversed, in the future only, or longer than ten years."""
    now = time.time() if now is None else now
    end = parse_time("until", until, now)
    start = parse_time("since", since, now)
    end = now if end is None else end
    start = end - 86400 if start is None else start
    if start >= end:
        raise RangeError("since", "must be before until")
    if start > now:
        raise RangeError("since", "is in the future")
    if end - start > MAX_SPAN_S:
        raise RangeError("since", "the range is longer than ten years")
    return start, end


def resolve_keys(wanted: Sequence[str], keys: Sequence[KeyRecord]) -> list[str]:
    """Key ids for names or ids; ``RangeError`` (field ``key``) naming the first unknown one."""
    out: list[str] = []
    for w in wanted:
        matches = [k.id for k in keys if w in (k.id, k.name)]
        if not matches:
            raise RangeError("key", f"no key named or with id {w!r}")
        out.extend(matches)
    return list(dict.fromkeys(out))


def iso_hour(t: int) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:00Z")


GROUPINGS = ("key", "model")


def report(
    rows: Sequence[UsageRow], keys: Sequence[KeyRecord], since: float, until: float, by: str = "key"
) -> dict[str, object]:
    """Rows (per key, model and hour) with each key's name, and totals per key, or per model with
    ``by="model"`` (a model "" is usage recorded before models were)."""
    if by not in GROUPINGS:
        raise RangeError("by", f"must be one of {', '.join(GROUPINGS)}, got {by!r}")
    names = {k.id: k.name for k in keys}
    totals: dict[str, dict[str, object]] = {}
    out_rows = []
    for r in rows:
        d = r.as_dict()
        d["key_name"] = names.get(r.key_id)
        d["hour_utc"] = iso_hour(r.hour)
        out_rows.append(d)
        zero: dict[str, object] = {"requests": 0, "errors": 0, "prompt_tokens": 0, "completion_tokens": 0,
                                   "total_tokens": 0, "duration_s": 0.0}
        if by == "model":
            t = totals.setdefault(r.model, {"model": r.model, **zero})
        else:
            t = totals.setdefault(r.key_id, {"key_id": r.key_id, "key_name": names.get(r.key_id), **zero})
        for field in ("requests", "errors", "prompt_tokens", "completion_tokens", "total_tokens"):
            t[field] = int(t[field]) + int(d[field])  # type: ignore[call-overload]
        t["duration_s"] = round(float(t["duration_s"]) + r.duration_s, 3)  # type: ignore[arg-type]
    return {"since": since, "until": until, "by": by, "rows": out_rows, "totals": list(totals.values())}
