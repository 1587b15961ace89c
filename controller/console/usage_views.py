"""The Keys page's usage: tokens per key per hour as a chart, and each key's totals over the range.

Read from the gateway's usage file (``usage.sqlite3`` beside the key store), in the request's worker
thread. At most ``MAX_SERIES`` keys get a line (the busiest); the totals table lists every key.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from markupsafe import Markup

from controller.console.charts import PALETTE, Series, count_tick, line_chart
from controller.gateway.keystore import LIMIT_BOUNDS, KeyRecord
from controller.gateway.usage.store import HOUR_S, UsageStore, UsageStoreError, hour_of

MAX_SERIES = 8
RANGES_DAYS = (1, 7, 30)


@dataclass(frozen=True)
class KeyTotals:
    requests: int
    errors: int
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class UsageView:
    days: int
    chart: Markup
    totals: dict[str, KeyTotals]  # key id → totals over the range
    error: str | None = None
    # key id → the start of the last hour it sent a request in (whatever the range; hours kept)
    last_used: dict[str, int] = field(default_factory=dict)


def _hour_label(t: float) -> str:
    return time.strftime("%m-%d %H:00", time.localtime(t))


def usage_view(usage_db: Path, keys: Sequence[KeyRecord], days: int, now: float | None = None) -> UsageView:
    now = time.time() if now is None else now
    days = days if days in RANGES_DAYS else RANGES_DAYS[0]
    since = hour_of(now - days * 86400) + HOUR_S
    try:
        rows = UsageStore(usage_db).query(None, since, now + HOUR_S)
        last_used = UsageStore(usage_db).last_used()
    except UsageStoreError as exc:
        return UsageView(days, Markup(""), {}, f"usage cannot be read: {exc}")
    per_key: dict[str, dict[int, int]] = {}
    sums: dict[str, list[int]] = {}
    for r in rows:
        per_key.setdefault(r.key_id, {})[r.hour] = r.prompt_tokens + r.completion_tokens
        s = sums.setdefault(r.key_id, [0, 0, 0, 0])
        s[0] += r.requests
        s[1] += r.errors
        s[2] += r.prompt_tokens
        s[3] += r.completion_tokens
    names = {k.id: k.name for k in keys}
    busiest = sorted(per_key, key=lambda k: -sum(per_key[k].values()))[:MAX_SERIES]
    hours = range(since, hour_of(now) + HOUR_S, HOUR_S)
    series = [
        # Every hour of the range is a point (0 when the key was idle): a line, not scattered dots.
        Series(names.get(k, k), [(h + HOUR_S / 2, float(per_key[k].get(h, 0))) for h in hours],
               PALETTE[i % len(PALETTE)])
        for i, k in enumerate(busiest)
    ]
    chart = line_chart(series, title=f"Tokens per hour by key, last {days} day(s)",
                       x_range=(since, hour_of(now) + HOUR_S), x_format=_hour_label,
                       y_format=count_tick) if series else Markup("")
    totals = {k: KeyTotals(*v) for k, v in sums.items()}
    return UsageView(days, chart, totals, last_used=last_used)


def optional_quota(text: str, field: str, what: str) -> int | None:
    """A token quota from a form: empty is no limit; anything else a whole number in bounds."""
    text = text.strip()
    if not text:
        return None
    top = LIMIT_BOUNDS[field]
    if not text.isdigit() or not 1 <= int(text) <= top:
        raise ValueError(f"{what} must be a whole number from 1 to {top:,} (or empty for no limit)")
    return int(text)
