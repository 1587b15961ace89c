"""The operator's latency bound of a choice (appliance/evaluation/sla_bound.py): parsing `--sla`,
the per-tier P99s it reads from an arm's runs (the median over the re-runs), and its breaches."""

from __future__ import annotations

import pytest

from appliance.evaluation.sla_bound import SlaBound, SlaInputError, breaches, measured, parse_sla
from tests.unit.test_protocol import _run


@pytest.mark.parametrize(("text", "want"), [
    ("ttft=2000,tpot=80", SlaBound(ttft_p99_ms=2000, tpot_p99_ms=80)),
    ("tpot=12.5ms", SlaBound(tpot_p99_ms=12.5)),
    (" TTFT = 500 , ", SlaBound(ttft_p99_ms=500)),
    ("ttft_p99_ms=750", SlaBound(ttft_p99_ms=750)),
])
def test_sla_text_parses(text: str, want: SlaBound) -> None:
    assert parse_sla(text) == want


@pytest.mark.parametrize(("text", "words"), [
    ("ttft", "'ttft' is not NAME=MILLISECONDS"),
    ("ttft=fast", "is not NAME=MILLISECONDS"),
    ("ttft=-5", "is not NAME=MILLISECONDS"),
    ("latency=200", "unknown bound 'latency' (known: ttft, tpot)"),
    ("ttft=1,ttft=2", "ttft named twice"),
    ("ttft=0", "ttft_p99_ms: Input should be greater than 0"),
    ("tpot=70000", "tpot_p99_ms: Input should be less than or equal to 60000"),
    ("", "'' is not NAME=MILLISECONDS"),
])
def test_a_bad_sla_names_the_part_and_the_rule(text: str, words: str) -> None:
    with pytest.raises(SlaInputError) as err:
        parse_sla(text)
    assert str(err.value).startswith("--sla: ") and words in str(err.value)


def test_an_sla_with_no_bound_is_refused_saying_what_it_needs() -> None:
    with pytest.raises(ValueError, match="at least one bound: ttft_p99_ms or tpot_p99_ms"):
        SlaBound.model_validate({})
    with pytest.raises(ValueError):
        SlaBound.model_validate({"ttft_p99_ms": True})  # strict: a bool is not a number of ms


def test_measured_is_the_median_over_the_runs_of_each_runs_p99() -> None:
    runs = [_run("a", 0, ttft=(100, 200, 400), tpot=50), _run("a", 1, ttft=(300, 200, 900), tpot=70),
            _run("a", 2, ttft=(200, 600, 500), tpot=60)]
    got = measured(runs)
    assert got["4-8K"] == {"ttft_p99_ms": 200, "tpot_p99_ms": 60}
    assert got["8-16K"]["ttft_p99_ms"] == 200 and got["16-32K"]["ttft_p99_ms"] == 500


def test_breaches_name_each_tier_and_bound_over_it_and_none_when_it_holds() -> None:
    runs = [_run("a", ttft=(100, 200, 400), tpot=50)]
    assert breaches(SlaBound(ttft_p99_ms=400, tpot_p99_ms=50), runs) == []  # equal holds
    assert breaches(SlaBound(ttft_p99_ms=199), runs) == [
        "P99 TTFT in 8-16K: 200.0 ms > 199 ms", "P99 TTFT in 16-32K: 400.0 ms > 199 ms"]
    assert breaches(SlaBound(tpot_p99_ms=49.5), runs) == [
        f"P99 TPOT in {t}: 50.0 ms > 49.5 ms" for t in ("4-8K", "8-16K", "16-32K")]


def test_a_tier_with_nothing_measured_or_no_run_at_all_is_a_breach_never_a_pass() -> None:
    run = _run("a")
    for r in run.tiers[2].requests:
        r.ok = False
    said = breaches(SlaBound(ttft_p99_ms=10_000), [run])
    assert said == ["P99 TTFT in 16-32K: not measured (no successful request), bound 10000 ms"]
    assert breaches(SlaBound(ttft_p99_ms=10_000), []) == ["no run was measured"]


def test_words() -> None:
    words = SlaBound(ttft_p99_ms=2000, tpot_p99_ms=80).words()
    assert words == "P99 TTFT ≤ 2000 ms, P99 TPOT ≤ 80 ms in every tier"
