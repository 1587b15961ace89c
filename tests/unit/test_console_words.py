"""The console in words: a launch's cache outcome said as why (not the raw log line that proved it,
kept as a tooltip), and an expected first-start compile-cache miss not drawn red."""

from __future__ import annotations

import re

import httpx
import pytest

from controller.console.views import _phase_bars, cache_words
from controller.store import LaunchRecord, PhaseRecord
from tests.unit.test_api import Rig
from tests.unit.test_console import client, home, login, rig  # noqa: F401  (fixtures)
from tests.unit.test_console_controls import _launch_with_log

RAW = "[rank0]:I1201 12:00:00.123 fx graph cache miss for key fabc123"


def _record(reason: str | None) -> LaunchRecord:
    return LaunchRecord(
        id="l", recipe="r", spec_hash="h", kind="cold", runtime="process", status="ready", created_at=0.0,
        ready_s=100.0, cache="miss", exit_code=None, exit_signal=None, oom_killed=None, diagnosis_code=None,
        mem_available_min_bytes=None, swap_peak_bytes=None, argv=[], env={}, image=None, image_id=None,
        image_digest=None, interpreter=None, packages={}, handle=None, started_at=0.0, ready_at=100.0,
        ended_at=None, diagnosis=None, log_tail=None, oom=[], events=[],
        phases=[PhaseRecord(name="weights_loading", at=0, elapsed_s=5, detail=""),
                PhaseRecord(name="compile_cache_miss", at=0, elapsed_s=30, detail=RAW),
                PhaseRecord(name="kv_cache", at=0, elapsed_s=80, detail="")],
        compile_cache={"miss": {"reason": reason, "details": []}} if reason else {},
    )


@pytest.mark.parametrize("reason", ["cold_first", "cache_emptied"])
def test_an_expected_miss_is_not_drawn_red(reason: str) -> None:
    bars = _phase_bars(_record(reason))
    assert bars[1].color != "#dc2626"
    assert bars[1].label == "compile cache miss (expected: nothing to reuse)"


@pytest.mark.parametrize("reason", ["env", "flag", "unknown", None])
def test_a_miss_that_should_have_been_a_hit_stays_red(reason: str | None) -> None:
    assert _phase_bars(_record(reason))[1].color == "#dc2626"


def test_cache_outcomes_in_words() -> None:
    assert cache_words("miss", {"miss": {"reason": "cold_first"}}) is not None
    assert "first start" in (cache_words("miss", {"miss": {"reason": "cold_first"}}) or "")
    assert "environment variable" in (cache_words("miss", {"miss": {"reason": "env"}}) or "")
    assert "loaded" in (cache_words("hit", {}) or "")
    assert cache_words(None, {}) is None


async def test_the_launches_table_says_why_not_the_log_line(client: httpx.AsyncClient, rig: Rig) -> None:  # noqa: F811
    _launch_with_log(rig, "L1", "")
    rig.store.add_phase("L1", "compile_cache_miss", 0.0, 30.0, RAW)
    rig.store.set_cache("L1", "miss")
    rig.store.update_compile_cache("L1", {"miss": {"reason": "cold_first", "details": []}})
    await login(client)
    page = (await client.get("/console/launches")).text
    row = re.search(r'<tr class="launch-row" id="launch-L1">.*?</tr>', page, re.S)
    assert row is not None
    cell = re.search(r'<div class="muted small evidence"[^>]*>([^<]*)</div>', row.group(0))
    assert cell is not None and "first start of this variant" in cell.group(1)
    assert RAW not in cell.group(1)  # the raw line is only the tooltip
    detail = (await client.get("/console/launches/L1")).text
    assert "first start of this variant" in detail
    assert "<summary>the log line that shows it</summary>" in detail
    assert "vLLM hash <code>?</code>" not in detail
