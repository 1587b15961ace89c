"""The acceptance gate on recorded results (DOMAIN §7, seed 004 §5.4/§6)."""

from __future__ import annotations

import pytest

from appliance.evaluation.bench_result import BenchResult, ProofResult, RequestRecord, TierResult, percentile
from appliance.evaluation.bench_tiers import SEED_TIERS
from appliance.evaluation.gate import Flag, Verdict, decide


def _tier(
    i: int,
    lens: list[int],
    duration_s: float,
    ttft: float,
    tpot: float,
    texts: list[str] | None = None,
    failed: int = 0,
) -> TierResult:
    t = SEED_TIERS[i]
    reqs = [
        RequestRecord(
            tier=t.name,
            index=k,
            input_tokens=t.lo + k,
            output_tokens=n,
            ttft_ms=ttft,
            tpot_ms=tpot,
            latency_ms=ttft + tpot * (n - 1),
            text=(texts[k] if texts else f"text {k}"),
            ok=k >= failed,
            error=None if k >= failed else "HTTP 500",
        )
        for k, n in enumerate(lens)
    ]
    return TierResult(tier=t, requests=reqs, duration_s=duration_s, concurrency=5)


def _result(
    recipe: str,
    *,
    lens: list[int] | None = None,
    duration_s: tuple[float, float, float] = (10, 10, 10),
    ttft: tuple[float, float, float] = (100, 200, 400),
    tpot: tuple[float, float, float] = (50, 50, 50),
    texts: list[str] | None = None,
    failed: int = 0,
    proof: ProofResult | None = None,
) -> BenchResult:
    lens = lens or [100] * 5
    return BenchResult(
        id=f"b-{recipe}",
        launch_id=f"l-{recipe}",
        recipe=recipe,
        spec_hash="0" * 16,
        cache_vintage="warm",
        cache_root="/c",
        engine_url="http://e",
        prompt_set="ps-v1",
        tier_rule="seed",
        output_tokens=128,
        ignore_eos=True,
        tiers=[
            _tier(i, lens, duration_s[i], ttft[i], tpot[i], texts, failed if i == 1 else 0) for i in range(3)
        ],
        proof=proof or ProofResult(),
        started_at=0,
        finished_at=1,
    )


def test_score_is_the_seed_weighting_of_output_throughput() -> None:
    r = _result("a", duration_s=(5, 10, 20))  # 500 tokens per tier → 100, 50, 25 tok/s
    assert r.score == pytest.approx(0.20 * 100 + 0.50 * 50 + 0.30 * 25)


def test_percentile_interpolates_like_numpy() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 99) == pytest.approx(3.97)
    assert percentile([], 99) is None


def test_a_clear_gain_is_accepted() -> None:
    g = decide(_result("base"), _result("cand", duration_s=(9, 9, 9)))
    assert g.verdict is Verdict.ACCEPT
    assert g.score_delta == pytest.approx(10 / 9 - 1)
    assert g.flags == []


@pytest.mark.parametrize("seconds", [10.05, 9.95])  # ±0.5 % of the score
def test_a_change_under_one_percent_is_noise(seconds: float) -> None:
    g = decide(_result("base"), _result("cand", duration_s=(seconds,) * 3))
    assert g.verdict is Verdict.NOISE
    assert "noise band" in g.reasons[0]


def test_a_regression_of_one_percent_or_more_is_rejected() -> None:
    g = decide(_result("base"), _result("cand", duration_s=(10.2, 10.2, 10.2)))
    assert g.verdict is Verdict.REJECT


def test_failed_requests_reject_first_even_with_a_better_score() -> None:
    g = decide(_result("base"), _result("cand", duration_s=(5, 5, 5), failed=1))
    assert g.verdict is Verdict.REJECT
    assert g.reasons[0] == "candidate cand failed 1 request(s)"


def test_a_baseline_with_failures_is_no_reference() -> None:
    g = decide(_result("base", failed=2), _result("cand"))
    assert g.verdict is Verdict.REJECT
    assert "no valid reference" in g.reasons[0]


def test_sla_breach_on_ttft_only_rejects() -> None:
    # 8–16K P99 TTFT 200 → 320 ms = 1.6×, TPOT unchanged, score better.
    g = decide(_result("base"), _result("cand", duration_s=(9, 9, 9), ttft=(100, 320, 400)))
    assert g.verdict is Verdict.REJECT
    assert any("SLA breach in 8-16K: p99_ttft" in r for r in g.reasons)
    assert not any("p99_tpot" in r for r in g.reasons)
    assert g.sla["8-16K"]["p99_ttft"] == pytest.approx(1.6)


def test_sla_breach_on_tpot_only_rejects() -> None:
    g = decide(_result("base"), _result("cand", duration_s=(9, 9, 9), tpot=(50, 50, 76)))
    assert g.verdict is Verdict.REJECT
    assert any("SLA breach in 16-32K: p99_tpot" in r for r in g.reasons)
    assert not any("p99_ttft" in r for r in g.reasons)


def test_sla_at_exactly_one_and_a_half_times_holds() -> None:
    g = decide(
        _result("base"), _result("cand", duration_s=(9, 9, 9), ttft=(150, 300, 600), tpot=(75, 75, 75))
    )
    assert g.verdict is Verdict.ACCEPT


def test_long_tier_regression_rejects_even_when_the_score_gains() -> None:
    g = decide(_result("base"), _result("cand", duration_s=(5, 8, 10.5)))
    assert g.score_delta is not None and g.score_delta > 0.01
    assert g.verdict is Verdict.REJECT
    assert any("long tier 16-32K" in r for r in g.reasons)


def test_the_shorter_outputs_trap_of_seed_004() -> None:
    """TPOT 6.26 % better, 775 vs 887 output tokens, throughput 0.43 % lower, 3/5 texts identical."""
    base_lens = [180, 178, 177, 176, 176]  # 887
    cand_lens = [155, 155, 155, 155, 155]  # 775
    base_texts = [f"t{k}" for k in range(5)]
    cand_texts = ["t0", "t1", "t2", "shorter", "shorter"]
    # Same per-tier wall time scaled so the throughput drops 0.43 %.
    dur_b = 10.0
    dur_c = dur_b * (775 / 887) / (1 - 0.0043)
    base = _result("base", lens=base_lens, duration_s=(dur_b,) * 3, texts=base_texts)
    cand = _result(
        "cand", lens=cand_lens, duration_s=(dur_c,) * 3, texts=cand_texts, tpot=(50 * (1 - 0.0626),) * 3
    )
    g = decide(base, cand)
    assert g.score_delta == pytest.approx(-0.0043, abs=1e-6)
    assert g.verdict is Verdict.NOISE
    assert Flag.SHORTER_OUTPUTS in g.flags and Flag.TEXTS_DIFFER in g.flags
    assert Flag.TPOT_GAIN_WITHOUT_THROUGHPUT in g.flags
    assert (g.output_tokens_baseline, g.output_tokens_candidate) == (887 * 3, 775 * 3)
    assert (g.texts_identical, g.texts_compared) == (9, 15)
    assert any("not like for like" in r for r in g.reasons)


def test_a_throughput_gain_from_shorter_outputs_is_not_accepted() -> None:
    base = _result("base", lens=[200] * 5)
    cand = _result("cand", lens=[150] * 5, duration_s=(7, 7, 7))  # 750/7 > 1000/10
    g = decide(base, cand)
    assert g.score_delta is not None and g.score_delta > 0.01
    assert g.verdict is Verdict.NOISE
    assert "shorter outputs" in g.reasons[0]


def test_a_missing_marker_or_checksum_mismatch_fails_the_gate() -> None:
    proof = ProofResult(markers={"Using AOT": False}, checksums={"/lib/_C_stable_libtorch.so": False})
    g = decide(_result("base"), _result("cand", duration_s=(5, 5, 5), proof=proof))
    assert g.verdict is Verdict.REJECT
    assert "candidate proof: log marker not seen: 'Using AOT'" in g.reasons
    assert "candidate proof: checksum mismatch: /lib/_C_stable_libtorch.so" in g.reasons


def test_a_candidate_missing_a_tier_is_rejected_not_passed() -> None:
    cand = _result("cand")
    cand = cand.model_copy(update={"tiers": cand.tiers[:2]})
    # A verdict, not an exception (issue 33: a compare must end with a verdict): the missing tier
    # is named and scores 0 tokens/s, never a pass.
    g = decide(_result("base"), cand)
    assert g.verdict is Verdict.REJECT and "candidate has no 16-32K tier" in g.reasons
    assert cand.missing_tiers == ["16-32K"]
