"""The acceptance gate between a baseline and a candidate benchmark. Pure: recorded results in,
verdict out, so a decision can be re-derived from the store at any time.

DOMAIN §7 (seed 004 §5.4), applied in this order; the first rule that rejects decides, later rules
still run so the report shows everything:

1. Failed requests — any failed request of the candidate rejects it; a baseline with failures is no
   reference (reject: the comparison is void).
2. Kernel-path / deployment proof — a declared log marker that did not appear, or a declared file
   checksum that did not match, rejects (the intended path was not proven to run).
3. SLA — per tier, P99 TTFT **and** P99 TPOT must be ≤ 1.5 × the baseline's; either alone breaches.
4. Long tier — a 16–32K throughput regression beyond the noise band rejects ("长桶明显回退").
5. Score — `0.20·thr(4–8K) + 0.50·thr(8–16K) + 0.30·thr(16–32K)`: |Δ| < 1 % is noise, a drop
   ≥ 1 % rejects, a gain ≥ 1 % accepts — unless the outputs got shorter or longer.

This is the comparison of one run of each arm; appliance/evaluation/protocol.py puts it inside the
seed's full sequence of steps (proof → smoke → first five → re-runs → score → accuracy).

The shorter-outputs trap (seed 004 §6): a candidate 6.26 % better on P99 TPOT lost 0.43 % throughput
because it stopped earlier (775 vs 887 output tokens, 3 of 5 texts identical). Whenever the total
output length moves by more than the tolerance (default: the noise band) the result is flagged; a
score gain that comes with shorter *or longer* outputs is not accepted (verdict noise: unproven),
because tokens/s and TPOT are then not like for like.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field

from appliance.evaluation.bench_result import BenchResult

NOISE_BAND = 0.01  # DOMAIN §7: "a change under 1% is noise"
SLA_FACTOR = 1.5  # DOMAIN §7: P99 TTFT and P99 TPOT ≤ 1.5 × baseline
LONG_TIER = "16-32K"


class Verdict(StrEnum):
    ACCEPT = "accept"
    # A stable small gain measured on the first five: accepted once the full run (`compare --full`:
    # 100 prompts per tier, steady state over 3 rounds; seed 003 §1120, 004 §194) confirms it.
    ACCEPT_PENDING_FULL = "accept-pending-full"
    REJECT = "reject"
    NOISE = "noise"


class Flag(StrEnum):
    SHORTER_OUTPUTS = "shorter-outputs"
    LONGER_OUTPUTS = "longer-outputs"
    TEXTS_DIFFER = "texts-differ"
    TPOT_GAIN_WITHOUT_THROUGHPUT = "tpot-gain-without-throughput"
    ACCURACY_NOT_RUN = "accuracy-not-run"
    ACCURACY_ITEMS_FLIPPED = "accuracy-items-flipped"
    SETTINGS_DIFFER = "settings-differ"
    FAST_MODE = "fast-mode"  # outputs capped small for tests: not the task's output lengths
    EAGER_TWIN_EVIDENCE = "eager-twin-evidence"  # an arm's token-stream evidence came from its eager twin
    # Both arms' token-stream evidence is one and the same eager twin's: length and accuracy are vacuous
    SHARED_EAGER_TWIN = "shared-eager-twin"
    STOPPED_EARLY = "stopped-early"  # a failed proof or smoke ended the compare before the tiers


class StepStatus(StrEnum):
    PASS = "pass"
    FAIL = "fail"  # rejects the candidate
    HOLD = "hold"  # not accepted, not rejected (noise, unstable, unlike-for-like)
    SKIPPED = "skipped"


class GateStep(BaseModel):
    """One step of the seed's sequence, with what it decided on (appliance/evaluation/protocol.py)."""

    name: str
    status: StepStatus
    reasons: list[str] = Field(default_factory=list)
    evidence: dict[str, Any] = Field(default_factory=dict)


class GateResult(BaseModel):
    verdict: Verdict
    reasons: list[str]
    flags: list[Flag] = Field(default_factory=list)
    score_baseline: float
    score_candidate: float
    score_delta: float | None  # relative (0.01 = +1 %); None when the baseline scored 0
    output_tokens_baseline: int
    output_tokens_candidate: int
    texts_identical: int
    texts_compared: int
    sla: dict[str, dict[str, float | None]] = Field(default_factory=dict)  # tier → ratios
    # The full protocol (empty for a bare one-run decide): every step in order, with its evidence.
    steps: list[GateStep] = Field(default_factory=list)
    allowed_diffs: dict[str, list[Any]] = Field(default_factory=dict)  # field → [baseline, candidate]


def _rel(new: float, old: float) -> float | None:
    return None if old == 0 else (new - old) / old


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:+.2f}%"


def decide(
    baseline: BenchResult,
    candidate: BenchResult,
    *,
    noise: float = NOISE_BAND,
    sla_factor: float = SLA_FACTOR,
    length_tolerance: float | None = None,
) -> GateResult:
    """`length_tolerance`: how far the total output length may move before a gain is held back
    (default: the noise band)."""
    tolerance = noise if length_tolerance is None else length_tolerance
    rejects: list[str] = []
    notes: list[str] = []
    flags: list[Flag] = []

    # 1. failed requests first.
    if baseline.failed:
        rejects.append(f"baseline {baseline.recipe} failed {baseline.failed} request(s): no valid reference")
    if candidate.failed:
        rejects.append(f"candidate {candidate.recipe} failed {candidate.failed} request(s)")

    # 2. kernel-path / deployment proof.
    for problem in candidate.proof.problems:
        rejects.append(f"candidate proof: {problem}")

    # 3. SLA, per tier (a tier the candidate lacks is a failure to measure, never a pass).
    sla: dict[str, dict[str, float | None]] = {}
    for base_tier in baseline.tiers:
        name = base_tier.tier.name
        cand_tier = candidate.tier(name)
        if cand_tier is None:
            rejects.append(f"candidate has no {name} tier")
            continue
        ratios: dict[str, float | None] = {}
        for metric, b, c in (
            ("p99_ttft", base_tier.p99_ttft_ms, cand_tier.p99_ttft_ms),
            ("p99_tpot", base_tier.p99_tpot_ms, cand_tier.p99_tpot_ms),
        ):
            ratio = None if b is None or c is None or b == 0 else c / b
            ratios[metric] = ratio
            if ratio is not None and ratio > sla_factor:
                rejects.append(
                    f"SLA breach in {name}: {metric} {c:.1f} ms = {ratio:.2f}x baseline {b:.1f} ms "
                    f"(limit {sla_factor}x)"
                )
        sla[name] = ratios

    # 4. long-tier regression.
    base_long, cand_long = baseline.tier(LONG_TIER), candidate.tier(LONG_TIER)
    if base_long and cand_long:
        d = _rel(cand_long.output_throughput, base_long.output_throughput)
        if d is not None and d <= -noise:
            rejects.append(f"long tier {LONG_TIER} throughput regressed {_pct(d)}")

    # The shorter-outputs trap: compare lengths and texts request by request.
    out_b, out_c = baseline.total_output_tokens, candidate.total_output_tokens
    length_delta = _rel(out_c, out_b)
    if length_delta is not None and length_delta < -tolerance:
        flags.append(Flag.SHORTER_OUTPUTS)
    elif length_delta is not None and length_delta > tolerance:
        flags.append(Flag.LONGER_OUTPUTS)
    base_texts = {(r.tier, r.index): r.text for t in baseline.tiers for r in t.requests if r.ok}
    pairs = [
        (base_texts[(r.tier, r.index)], r.text)
        for t in candidate.tiers
        for r in t.requests
        if r.ok and (r.tier, r.index) in base_texts
    ]
    identical = sum(1 for b, c in pairs if b == c)
    if identical < len(pairs):
        flags.append(Flag.TEXTS_DIFFER)

    # 5. score.
    s_b, s_c = baseline.score, candidate.score
    delta = _rel(s_c, s_b)
    tpot_delta = (
        _rel(candidate.p99_tpot_ms or 0.0, baseline.p99_tpot_ms or 0.0) if baseline.p99_tpot_ms else None
    )
    if tpot_delta is not None and tpot_delta <= -noise and (delta is None or delta < noise):
        flags.append(Flag.TPOT_GAIN_WITHOUT_THROUGHPUT)
    if flags and (Flag.SHORTER_OUTPUTS in flags or Flag.LONGER_OUTPUTS in flags):
        notes.append(
            f"output length changed: {out_c} vs {out_b} tokens ({_pct(length_delta)}), "
            f"{identical}/{len(pairs)} texts identical — tokens/s and TPOT are not like for like"
        )
    if Flag.TPOT_GAIN_WITHOUT_THROUGHPUT in flags:
        notes.append(f"P99 TPOT improved {_pct(tpot_delta)} but the score moved {_pct(delta)}")

    if rejects:
        verdict = Verdict.REJECT
        reasons = rejects + notes
    elif delta is None:
        verdict, reasons = Verdict.NOISE, ["baseline score is 0: nothing to compare against", *notes]
    elif abs(delta) < noise:
        verdict, reasons = (
            Verdict.NOISE,
            [
                f"score {s_c:.3f} vs {s_b:.3f} ({_pct(delta)}): under the {noise * 100:.0f}% noise band",
                *notes,
            ],
        )
    elif delta < 0:
        verdict, reasons = Verdict.REJECT, [f"score regressed {_pct(delta)} ({s_c:.3f} vs {s_b:.3f})", *notes]
    elif Flag.SHORTER_OUTPUTS in flags or Flag.LONGER_OUTPUTS in flags:
        # Longer outputs inflate tokens/s as surely as shorter ones deflate it: neither is like for like.
        which = "shorter" if Flag.SHORTER_OUTPUTS in flags else "longer"
        verdict, reasons = (
            Verdict.NOISE,
            [f"score gain {_pct(delta)} comes with {which} outputs: not accepted (seed 004 §6)", *notes],
        )
    else:
        verdict, reasons = (
            Verdict.ACCEPT,
            [f"score {s_c:.3f} vs {s_b:.3f} ({_pct(delta)}), no failures, SLA held", *notes],
        )
    return GateResult(
        verdict=verdict,
        reasons=reasons,
        flags=flags,
        score_baseline=s_b,
        score_candidate=s_c,
        score_delta=delta,
        output_tokens_baseline=out_b,
        output_tokens_candidate=out_c,
        texts_identical=identical,
        texts_compared=len(pairs),
        sla=sla,
    )
