"""Round time ticks and a value axis that fits the data (controller/console/charts.py): the step
ladder's boundaries, ticks on round local times (a half-hour zone included), the ends of the range,
and the Keys page's usage chart (its top a nice number at or above the busiest hour, counts as 1.5k/2M)."""

from __future__ import annotations

import calendar
import itertools
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.console import charts
from controller.console.charts import Series
from controller.console.usage_views import usage_view
from controller.gateway.keystore import KeyStore
from controller.gateway.usage.store import HourUsage, UsageStore

MIN, HOUR, DAY = 60, 3600, 86400


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.fixture
def india(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "IST-5:30")  # POSIX form: UTC+05:30, no tzdata needed
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def at(text: str) -> float:
    """A UTC time as epoch seconds."""
    return float(calendar.timegm(time.strptime(text, "%Y-%m-%d %H:%M:%S")))


@pytest.mark.parametrize(("span", "step"), [
    (5, 1), (6, 2),  # 6 ticks of 1 s would be 7 labels: the next step
    (299, MIN), (300, MIN), (360, 2 * MIN),  # 0,1,…,5 min: 6 ticks; 6 min → 7 ticks, too many
    (HOUR, 15 * MIN), (HOUR - 1, 10 * MIN),
    (DAY, 6 * HOUR), (DAY - 1, 6 * HOUR), (7 * DAY, 2 * DAY), (30 * DAY, 7 * DAY),
    (365 * DAY, 9 * 7 * DAY),  # past the ladder: whole weeks
])
def test_time_step_boundaries(span: int, step: int) -> None:
    assert charts.time_step(span) == step
    assert span / step < charts.MAX_TIME_TICKS


def test_ticks_fall_on_round_minutes_inside_the_range(utc: None) -> None:
    x0, x1 = at("2026-12-01 10:03:17"), at("2026-12-01 11:03:17")
    ticks, step = charts.time_ticks(x0, x1)
    assert step == 15 * MIN
    assert [charts.time_label(step)(t) for t in ticks] == ["10:15", "10:30", "10:45", "11:00"]
    assert all(x0 <= t <= x1 for t in ticks)


def test_round_ends_are_ticks_themselves(utc: None) -> None:
    x0, x1 = at("2026-12-01 10:00:00"), at("2026-12-01 10:05:00")
    ticks, step = charts.time_ticks(x0, x1)
    assert step == MIN and ticks[0] == x0 and ticks[-1] == x1 and len(ticks) == 6
    seconds, s_step = charts.time_ticks(x0 + 0.5, x0 + 4.5)
    assert s_step == 1 and [charts.time_label(s_step)(t) for t in seconds] == [
        "10:00:01", "10:00:02", "10:00:03", "10:00:04"]


def test_hour_ticks_are_round_on_the_local_clock(india: None) -> None:
    # A day from 03:20 UTC: in UTC+05:30 that is 08:50 local; 6-hour ticks on 12:00, 18:00, 00:00, 06:00.
    x0 = at("2026-12-01 03:20:00")
    ticks, step = charts.time_ticks(x0, x0 + DAY)
    assert step == 6 * HOUR
    assert [charts.time_label(step)(t) for t in ticks] == ["12:00", "18:00", "00:00", "06:00"]
    week, week_step = charts.time_ticks(x0, x0 + 7 * DAY)
    assert week_step == 2 * DAY
    assert all(time.localtime(t)[3:6] == (0, 0, 0) for t in week)  # local midnights
    assert 0 < week[0] - x0 <= 2 * DAY and all(b - a == 2 * DAY for a, b in itertools.pairwise(week))
    assert charts.time_label(week_step)(week[0]) in ("12-02", "12-03")


def test_an_empty_or_reversed_range_has_no_ticks() -> None:
    assert charts.time_ticks(100.0, 100.0) == ([], 1)
    assert charts.time_ticks(200.0, 100.0) == ([], 1)
    assert charts.time_ticks(0.0, float("inf")) == ([], 1)


def _ticks(svg: str) -> list[str]:
    return re.findall(r'class="tick">([^<]+)</text>', svg)


def test_a_line_chart_labels_its_time_axis_on_round_times(utc: None) -> None:
    x0 = at("2026-12-01 10:03:17")
    svg = charts.line_chart([Series("a", [(x0, 1.0), (x0 + HOUR, 2.0)], "#000")], title="t",
                            x_range=(x0, x0 + HOUR))
    assert [t for t in _ticks(svg) if ":" in t] == ["10:15", "10:30", "10:45", "11:00"]
    assert "10:03:17" not in svg


@pytest.mark.parametrize(("v", "text"), [
    (0, "0"), (800, "800"), (999, "999"), (1000, "1k"), (1500, "1.5k"), (200_000, "200k"),
    (1_000_000, "1M"), (1_400_000, "1.4M"), (2_500_000_000, "2.5G")])
def test_count_tick(v: float, text: str) -> None:
    assert charts.count_tick(v) == text


def test_the_usage_chart_axis_is_a_nice_number_above_the_busiest_hour(tmp_path: Path, utc: None) -> None:
    keys = KeyStore(tmp_path / "keys.sqlite3")
    record, _ = keys.create("alice")
    now = at("2026-12-01 12:30:00")
    hour = int(now) - int(now) % HOUR
    UsageStore(tmp_path / "usage.sqlite3").write({
        (record.id, hour - 2 * HOUR): HourUsage(3, 0, 1_000_000, 234_567, 1.0),
        (record.id, hour - HOUR): HourUsage(1, 0, 10, 10, 0.1)})
    chart = str(usage_view(tmp_path / "usage.sqlite3", keys.list(), 1, now=now).chart)
    values = [t for t in _ticks(chart) if ":" not in t]
    assert values[0] == "0" and values[-1] == "1.4M"  # 1,234,567 tokens in the busiest hour: top 1.4M
    assert "e+" not in chart
    times = [t for t in _ticks(chart) if ":" in t]
    assert times and all(t.endswith(":00") and int(t[-5:-3]) % 6 == 0 for t in times), times
