"""The gate in the seed's order (DOMAIN §7, seeds 003/004): every step can fail, and does here."""

from __future__ import annotations

import pytest

from appliance.evaluation.accuracy import AccuracyResult, ItemResult, Kind
from appliance.evaluation.bench_result import (
    BenchResult,
    ProofResult,
    RequestRecord,
    SmokeResult,
    TierResult,
    goodput_summary,
)
from appliance.evaluation.bench_tiers import SEED_TIERS
from appliance.evaluation.gate import Flag, StepStatus, Verdict
from appliance.evaluation.protocol import (
    STEP_ORDER,
    Thresholds,
    gate,
    median_run,
    needs_more_rounds,
)

# A declared path marker seen in the log (the H200 fixture's attention line): an ACCEPT needs one.
PATH_PROVEN = ProofResult(markers={"Using FLASH_ATTN attention backend": True})


def _run(
    recipe: str,
    k: int = 0,
    *,
    seconds: tuple[float, float, float] = (10, 10, 10),
    lens: int = 100,
    ttft: tuple[float, float, float] = (100, 200, 400),
    tpot: float = 50,
    failed_tier: int | None = None,
    proof: ProofResult | None = None,
    smoke: SmokeResult | None = None,
    accuracy: AccuracyResult | None = None,
) -> BenchResult:
    tiers = []
    for i, t in enumerate(SEED_TIERS):
        reqs = [
            RequestRecord(
                tier=t.name, index=n, input_tokens=t.lo + n, output_tokens=lens, ttft_ms=ttft[i],
                tpot_ms=tpot, latency_ms=ttft[i] + tpot * (lens - 1), text=f"text {n}",
                ok=not (failed_tier == i and n == 0),
                error="HTTP 500" if failed_tier == i and n == 0 else None,
            )
            for n in range(5)
        ]
        tiers.append(TierResult(tier=t, requests=reqs, duration_s=seconds[i], concurrency=5))
    return BenchResult(
        id=f"b-{recipe}-{k}", launch_id=f"l-{recipe}", recipe=recipe, spec_hash="0" * 16,
        cache_vintage="warm", cache_root="/c", engine_url="http://e", prompt_set="ps-v1",
        tier_rule="seed", output_tokens=128, ignore_eos=False, tiers=tiers,
        proof=proof or PATH_PROVEN, started_at=0, finished_at=1, smoke=smoke, accuracy=accuracy,
    )


def _smoke(
    tokens: int = 100, *, ok: bool = True, alive: bool = True, errors: list[str] | None = None
) -> SmokeResult:
    return SmokeResult(
        request=RequestRecord(tier="8-16K", index=0, input_tokens=9000, output_tokens=tokens if ok else 0,
                              text="x" * tokens, ok=ok, error=None if ok else "HTTP 500"),
        alive_after=alive,
        new_error_lines=errors or [],
    )


def _acc(scores: dict[Kind, list[float]]) -> AccuracyResult:
    items = [ItemResult(kind=k, index=i, score=s, output=f"out {k.value} {i} {s}")
             for k, ss in scores.items() for i, s in enumerate(ss)]
    return AccuracyResult(context_tokens=700, items=items)


GOOD_ACC = {k: [1.0, 1.0, 0.0, 1.0, 0.5] for k in Kind}


def _arms(
    cand_seconds: float = 9.0, *, base_kw: dict[str, object] | None = None, **cand_kw: object
) -> tuple[list[BenchResult], list[BenchResult]]:
    base_kw = {"smoke": _smoke(), "accuracy": _acc(GOOD_ACC), **(base_kw or {})}
    cand = {"seconds": (cand_seconds,) * 3, "smoke": _smoke(), "accuracy": _acc(GOOD_ACC), **cand_kw}
    return [_run("base", **base_kw)], [_run("cand", **cand)]  # type: ignore[arg-type]


def _step(g, name: str):  # type: ignore[no-untyped-def]
    return next(s for s in g.steps if s.name == name)


def test_a_clear_gain_passes_every_step_in_the_seeds_order_and_is_accepted() -> None:
    base, cand = _arms()
    g = gate(base, cand)
    assert [s.name for s in g.steps] == list(STEP_ORDER)
    assert all(s.status is StepStatus.PASS for s in g.steps), [(s.name, s.reasons) for s in g.steps]
    assert g.verdict is Verdict.ACCEPT
    long_tier = _step(g, "first-five").evidence["tiers"]["16-32K"]
    assert long_tier["candidate"]["output_throughput"] == pytest.approx(500 / 9, abs=1e-3)


# ---- 1. proof


def test_a_must_not_appear_marker_in_the_log_fails_the_proof_step() -> None:
    base, cand = _arms(proof=ProofResult(forbidden={"Traceback (most recent call last)": True}))
    g = gate(base, cand)
    assert _step(g, "proof").status is StepStatus.FAIL
    assert g.verdict is Verdict.REJECT
    seen = "proof: candidate proof: must-not-appear marker seen: 'Traceback (most recent call last)'"
    assert seen in g.reasons


def test_a_missing_selected_marker_or_md5_mismatch_fails_the_proof_step() -> None:
    proof = ProofResult(
        markers={"gate/up decode Triton GEMV selected.": False}, checksums={"/x/_C.so": False}
    )
    g = gate(*_arms(proof=proof))
    assert _step(g, "proof").status is StepStatus.FAIL and g.verdict is Verdict.REJECT
    assert len(_step(g, "proof").reasons) == 2


def test_results_from_different_cards_are_not_gated_against_each_other() -> None:
    base, cand = _arms()
    base[0] = base[0].model_copy(update={"cards": {"platform": "gfx906", "devices": [0, 1]}})
    cand[0] = cand[0].model_copy(update={"cards": {"platform": "gfx906", "devices": [2, 3]}})
    g = gate(base, cand)
    assert _step(g, "proof").status is StepStatus.FAIL and g.verdict is Verdict.REJECT
    assert "not gated against each other" in _step(g, "proof").reasons[0]


@pytest.mark.parametrize(
    ("declared", "words"),
    [({}, "(nothing)"), ({"enforce_eager=False": True}, "only the mode: 'enforce_eager=False'")],
)
def test_a_candidate_that_proves_no_kernel_path_cannot_be_accepted(
    declared: dict[str, bool], words: str
) -> None:
    # Issue 33: the mode line cannot tell C from C′, nor an emulation kernel from its fallback.
    g = gate(*_arms(proof=ProofResult(markers=declared)))
    assert _step(g, "proof").status is StepStatus.FAIL and g.verdict is Verdict.REJECT
    assert words in _step(g, "proof").reasons[0]
    # One line proving the path (beside the mode) is enough.
    ok = gate(*_arms(proof=ProofResult(markers={**declared, "'cudagraph_mode': <CUDAGraphMode.NONE": True})))
    assert _step(ok, "proof").status is StepStatus.PASS and ok.verdict is Verdict.ACCEPT


# ---- 2. smoke


@pytest.mark.parametrize(
    ("smoke", "words"),
    [
        (_smoke(ok=False), "smoke request failed"),
        (_smoke(alive=False), "did not answer after the smoke request"),
        (_smoke(errors=["ERROR 12-01 engine.py: CUDA error"]), "new error line(s) since ready"),
        (_smoke(tokens=90), "smoke output length 90 vs control 100"),
    ],
)
def test_each_smoke_condition_fails_the_smoke_step(smoke: SmokeResult, words: str) -> None:
    g = gate(*_arms(smoke=smoke))
    step = _step(g, "smoke")
    assert step.status is StepStatus.FAIL and any(words in r for r in step.reasons)
    assert g.verdict is Verdict.REJECT


def test_a_smoke_length_within_the_stated_tolerance_passes() -> None:
    g = gate(*_arms(smoke=_smoke(tokens=101)))  # +1 % against the default ±2 %
    assert _step(g, "smoke").status is StepStatus.PASS
    assert _step(g, "smoke").evidence["length_tolerance"] == 0.02


# ---- 3. first five


def test_an_sla_breach_in_one_tier_fails_the_first_five_step() -> None:
    g = gate(*_arms(ttft=(100, 320, 400)))
    assert _step(g, "first-five").status is StepStatus.FAIL
    assert any("SLA breach in 8-16K: p99_ttft" in r for r in g.reasons)


def test_a_failed_request_and_a_long_tier_regression_fail_the_first_five_step() -> None:
    g = gate(*_arms(seconds=(5, 8, 10.5), failed_tier=0))
    reasons = _step(g, "first-five").reasons
    assert "candidate cand failed 1 request(s)" in reasons
    assert any("long tier 16-32K" in r for r in reasons)


# ---- 4. re-runs


def test_a_small_gain_after_one_round_asks_for_more_rounds_and_is_held_until_stable() -> None:
    base, cand = _arms(cand_seconds=10 / 1.02)  # +2 %: inside the [1 %, 3 %) band
    th = Thresholds()
    assert needs_more_rounds(base, cand, th)
    g = gate(base, cand, th)
    assert _step(g, "re-runs").status is StepStatus.HOLD
    assert g.verdict is Verdict.NOISE
    assert _step(g, "accuracy").status is StepStatus.SKIPPED  # accuracy waits for throughput to pass


def test_a_small_gain_stable_over_three_rounds_passes_the_rerun_step() -> None:
    base = [_run("base", k, smoke=_smoke() if k == 0 else None, accuracy=_acc(GOOD_ACC)) for k in range(3)]
    cand = [
        _run("cand", k, seconds=(s,) * 3, smoke=_smoke() if k == 0 else None, accuracy=_acc(GOOD_ACC))
        for k, s in enumerate((10 / 1.02, 10 / 1.021, 10 / 1.019))
    ]
    assert not needs_more_rounds(base, cand, Thresholds())
    g = gate(base, cand)
    assert _step(g, "re-runs").status is StepStatus.PASS
    assert _step(g, "re-runs").evidence["rounds"] == 3
    # Stable on the first five: pending the full run (issue 33 item 9), not a plain accept.
    assert g.verdict is Verdict.ACCEPT_PENDING_FULL


def test_a_small_gain_still_spread_at_the_round_cap_is_held() -> None:
    base = [_run("base", k, smoke=_smoke()) for k in range(3)]
    seconds = (10 / 1.005, 10 / 1.06, 10 / 1.02)  # median +2 %, spread 5.4 %
    cand = [_run("cand", k, seconds=(s,) * 3, smoke=_smoke()) for k, s in enumerate(seconds)]
    th = Thresholds()
    assert not needs_more_rounds(base, cand, th)  # the cap is reached
    g = gate(base, cand, th)
    step = _step(g, "re-runs")
    assert step.status is StepStatus.HOLD and "spread" in step.reasons[0]


def test_the_sla_is_checked_on_every_round_not_only_the_gated_one() -> None:
    base = [_run("base", k, smoke=_smoke()) for k in range(3)]
    cand = [
        _run("cand", 0, seconds=(9, 9, 9), smoke=_smoke()),
        _run("cand", 1, seconds=(9, 9, 9), tpot=80),  # round 2 breaches P99 TPOT (1.6×)
        _run("cand", 2, seconds=(9, 9, 9)),
    ]
    g = gate(base, cand)
    step = _step(g, "re-runs")
    assert step.status is StepStatus.FAIL
    assert any(r.startswith("round 2: SLA breach") for r in step.reasons)
    assert g.verdict is Verdict.REJECT


# ---- 5. score


def test_the_score_is_the_median_of_the_rounds_never_the_best() -> None:
    """With three rounds the old compare gated the run at sorted(...)[1]; with two it took the better
    one. One lucky round must not carry a candidate."""
    base = [_run("base", k, smoke=_smoke()) for k in range(3)]
    cand = [_run("cand", k, seconds=(s,) * 3, smoke=_smoke()) for k, s in enumerate((10.0, 9.98, 6.0))]
    g = gate(base, cand)
    assert _step(g, "score").evidence["median"]["candidate"] == pytest.approx(cand[1].score)
    assert g.verdict is Verdict.NOISE  # the median is +0.2 %; the best round was +67 %
    assert median_run(cand).id == cand[1].id
    two = [_run("cand", 0, seconds=(10,) * 3), _run("cand", 1, seconds=(5,) * 3)]
    assert median_run(two).id == two[0].id  # a tie goes to the lower score, never the better


@pytest.mark.parametrize(("lens", "flag"), [(90, Flag.SHORTER_OUTPUTS), (113, Flag.LONGER_OUTPUTS)])
def test_a_gain_with_outputs_shorter_or_longer_than_the_control_is_held_back(lens: int, flag: Flag) -> None:
    # +2 % score from 12.6 % longer outputs: accepted before, held back now (the example).
    seconds = 10 * (lens / 100) / 1.05
    g = gate(*_arms(cand_seconds=seconds, lens=lens, smoke=_smoke(tokens=100)))
    step = _step(g, "score")
    assert step.status is StepStatus.HOLD
    assert "outputs: not accepted" in step.reasons[0] and "not like for like" in step.reasons[1]
    assert flag in g.flags and g.verdict is Verdict.NOISE


def test_a_median_regression_fails_the_score_step() -> None:
    g = gate(*_arms(cand_seconds=10.5, ttft=(100, 200, 400)))
    assert _step(g, "score").status is StepStatus.FAIL and g.verdict is Verdict.REJECT


# ---- 6. accuracy: the last word


def test_an_accuracy_drop_over_three_points_rejects_a_clear_throughput_gain() -> None:
    worse = dict(GOOD_ACC)
    worse[Kind.RETRIEVAL] = [1.0, 1.0, 0.0, 1.0, 0.0]  # 70 → 60 points
    g = gate(*_arms(accuracy=_acc(worse)))
    assert all(_step(g, n).status is StepStatus.PASS for n in STEP_ORDER[:-1])
    acc = _step(g, "accuracy")
    assert acc.status is StepStatus.FAIL
    assert g.verdict is Verdict.REJECT
    assert "accuracy drop in retrieval_multi_point: 70.0 → 60.0" in acc.reasons[0]
    flipped = acc.evidence["flipped"]
    assert [(f["kind"], f["index"]) for f in flipped] == [("retrieval_multi_point", 4)]
    assert flipped[0]["baseline_output"] and flipped[0]["candidate_output"]
    assert Flag.ACCURACY_ITEMS_FLIPPED in g.flags


def test_the_accuracy_threshold_is_configurable() -> None:
    worse = dict(GOOD_ACC)
    worse[Kind.RETRIEVAL] = [1.0, 1.0, 0.0, 1.0, 0.0]
    g = gate(*_arms(accuracy=_acc(worse)), Thresholds(accuracy_drop=15))
    assert _step(g, "accuracy").status is StepStatus.PASS and g.verdict is Verdict.ACCEPT


def test_accuracy_is_not_run_for_a_candidate_the_throughput_steps_rejected() -> None:
    g = gate(*_arms(accuracy=None, ttft=(100, 400, 400)))
    acc = _step(g, "accuracy")
    assert acc.status is StepStatus.SKIPPED and "throughput steps did not pass" in acc.reasons[0]
    assert Flag.ACCURACY_NOT_RUN in g.flags


def test_an_accuracy_switched_off_compare_is_flagged_not_silently_accepted() -> None:
    g = gate(*_arms(accuracy=None), accuracy_why_not="not run: --no-accuracy")
    assert g.verdict is Verdict.ACCEPT and Flag.ACCURACY_NOT_RUN in g.flags


def test_allowed_differences_are_recorded_and_flagged() -> None:
    g = gate(*_arms(), allowed_diffs={"max_num_seqs": [8, 16]})
    assert g.allowed_diffs == {"max_num_seqs": [8, 16]} and Flag.SETTINGS_DIFFER in g.flags
    assert "max_num_seqs (8 → 16)" in g.reasons[-1]


# ---- goodput


def test_goodput_counts_the_requests_meeting_every_slo_target_per_tier() -> None:
    r = _run("a", ttft=(100, 250, 400))
    out = goodput_summary(r, {"4-8K": {"ttft_ms": 150, "tpot_ms": 60}, "8-16K": {"ttft_ms": 200}})
    assert out["4-8K"] == {"good": 5, "requests": 5, "share": 1.0, "goodput_rps": 0.5,
                           "targets": {"ttft_ms": 150, "tpot_ms": 60}}
    assert out["8-16K"]["good"] == 0  # type: ignore[index]
    assert out["16-32K"] is None  # no target: not computed


def test_the_bench_table_says_the_warmup_was_discarded_and_shows_goodput(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from controller.cli.evaluation_cmd import print_bench

    warm = RequestRecord(tier="warmup:4-8K", index=0, input_tokens=4096, ok=True)
    r = _run("a").model_copy(update={"warmup": [warm], "slo": {"4-8K": {"ttft_ms": 150.0}}})
    print_bench(r)
    out = capsys.readouterr().out
    assert "warm-up: 1 request(s) sent first and discarded" in out
    assert "goodput (requests meeting the recipe's SLO targets): 4-8K 5/5 (0.5 req/s)" in out


def test_a_failed_accuracy_request_voids_the_accuracy_step_instead_of_scoring_zero() -> None:
    acc = _acc(GOOD_ACC)
    broken = acc.model_copy(update={"items": [
        i.model_copy(update={"ok": False, "error": "ServerDisconnectedError", "score": 0.0})
        if (i.kind, i.index) == (Kind.SUMMARIZATION, 2) else i for i in acc.items]})
    g = gate(*_arms(base_kw={"accuracy": broken}))
    step = _step(g, "accuracy")
    assert step.status is StepStatus.FAIL and g.verdict is Verdict.REJECT
    assert "baseline accuracy request(s) failed (summarization #2): no valid reference" in step.reasons


def test_a_deployment_mismatch_or_a_missing_deployment_result_fails_the_proof_step() -> None:
    # Seed 004 §7: files compiled, byte-identical to the source, vllm imported from the expected root.
    mismatch = PATH_PROVEN.model_copy(update={"deployment_declared": True, "deployment": {
        "problems": ["installed file differs from its source: /site/vllm/platforms/rocm.py"]}})
    base, cand = _arms(proof=mismatch)
    step = _step(gate(base, cand), "proof")
    assert step.status is StepStatus.FAIL
    assert step.reasons == [
        "candidate proof: deployment: installed file differs from its source: /site/vllm/platforms/rocm.py"]
    base, cand = _arms(proof=PATH_PROVEN.model_copy(update={"deployment_declared": True}))
    assert _step(gate(base, cand), "proof").status is StepStatus.FAIL
    clean = PATH_PROVEN.model_copy(update={"deployment_declared": True, "deployment": {"problems": []}})
    base, cand = _arms(proof=clean)
    assert _step(gate(base, cand), "proof").status is StepStatus.PASS
