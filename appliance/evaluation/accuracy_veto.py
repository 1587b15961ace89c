"""The accuracy step of the gate: the final veto, and when it cannot bite. Pure.

The unit (seed 003 §1136: "Δ > 3% 立即回退"). Every kind's score is on a 0–100 scale (the share of
items answered right, token F1 × 100, ROUGE-L F1 × 100, the share of asked values named), so the
bar is in **percentage points, for every kind**: a kind fails when baseline − candidate > 3.0
points; a drop of exactly 3.0 points passes. Relative drops were considered and refused: on a kind
the baseline scores 10 points, 3 % relative is 0.3 points — less than a single retrieval value on
five items (6.7 points) — so the veto would fire on any one flipped answer, and at 0 it is
undefined. Seed 003's own table (§1157) compares the four scores side by side on one scale.

Fails closed: the veto is vacuous in a kind where the baseline scores near zero (under
`veto_floor` points, default 10: less than half an item of five right) — the candidate cannot
drop by more than the bar there, so 0 vs 0 would pass. Such a kind fails the step ("cannot
discriminate"), as do a kind or an item the candidate lacks (never scored as a pass, never an
exception), a kind the baseline lacks, and a failed request on either arm.

A step whose two arms' evidence is one and the same eager twin's (`sources`, both the same recipe, not
"own": piecewise against graph, both deriving the eager recipe) compares the twin with itself. That is
not a failure to measure: under the seed's own rule a graph arm's quality IS its eager twin's (same
weights, dtype and sampling), so two arms on one twin have the same quality by that rule, exactly as a
graph candidate against its own eager twin (the first gate of a tournament) does. The step passes on
the twin's figures and says, in its notes and in the gate's `shared-eager-twin` flag, that it could
not tell the arms apart; rejecting here instead would let graph beat eager but never piecewise (the
tournament's verdict would depend on its order).
"""

from __future__ import annotations

from typing import Any

from appliance.evaluation.accuracy import AccuracyResult, compare_accuracy
from appliance.evaluation.gate import GateStep, StepStatus

ACCURACY = "accuracy"
OWN = "own"  # an arm's own token streams (appliance/evaluation/protocol.py Tokens)
VETO_FLOOR_POINTS = 10.0
# Float sums of item scores land a hair off the exact figure (57.00000000000001): a drop equal to
# the bar must pass, so drops are compared to the bar with this slack.
_EPS = 1e-9


def accuracy_step(
    base: AccuracyResult | None,
    cand: AccuracyResult | None,
    *,
    max_drop: float,
    veto_floor: float = VETO_FLOOR_POINTS,
    why_not: str | None = None,
    sources: dict[str, str] | None = None,
) -> GateStep:
    """`sources`: whose token streams stand for each arm ("own", or the eager twin)."""
    if base is None or cand is None:
        why = [why_not or "accuracy was not measured"]
        return GateStep(name=ACCURACY, status=StepStatus.SKIPPED, reasons=why)
    d = compare_accuracy(base, cand)
    b_items = {(r.kind.value, r.index) for r in base.items}
    c_items = {(r.kind.value, r.index) for r in cand.items}
    fails: list[str] = []
    notes: list[str] = []
    missing_kinds = sorted(set(d.baseline) - set(d.candidate))
    if missing_kinds:
        fails.append(f"the candidate has no {', '.join(missing_kinds)} items: not scored, never a pass")
    extra_kinds = sorted(set(d.candidate) - set(d.baseline))
    if extra_kinds:
        fails.append(f"the baseline has no {', '.join(extra_kinds)} items: no reference")
    missing_items = sorted(b_items - c_items)
    if missing_items and not missing_kinds:
        shown = ", ".join(f"{k} #{i}" for k, i in missing_items[:5])
        fails.append(f"the candidate lacks {len(missing_items)} item(s) the baseline scored ({shown})")
    for kind, drop in d.drops.items():
        if kind in missing_kinds:
            continue
        if drop > max_drop + _EPS:
            fails.append(
                f"accuracy drop in {kind}: {d.baseline[kind]:.1f} → {d.candidate[kind]:.1f} "
                f"(−{drop:.1f} points > {max_drop:g})"
            )
    vacuous = sorted(k for k, v in d.baseline.items() if v < veto_floor)
    for kind in vacuous:
        fails.append(
            f"{kind} cannot discriminate: the baseline scores {d.baseline[kind]:.1f} points, under the "
            f"{veto_floor:g}-point floor — a drop beyond {max_drop:g} points cannot show, so the veto "
            "would be vacuous (fails closed)"
        )
    # A request that failed scores 0 and would pass for a wrong answer: the comparison is void.
    for label, acc in (("baseline", base), ("candidate", cand)):
        failed = [f"{r.kind.value} #{r.index}" for r in acc.items if not r.ok]
        if failed:
            fails.append(
                f"{label} accuracy request(s) failed ({', '.join(failed)}): "
                + ("no valid reference" if label == "baseline" else "not scored")
            )
    sources = sources or {}
    # "own" on both arms is the ordinary gate: two different recipes' own evidence.
    shared = sources.get("baseline")
    if shared and shared != OWN and shared == sources.get("candidate"):
        notes.append(
            f"both arms' evidence is the same eager twin's ({shared}): not discriminating — both arms' "
            "quality is that twin's by the seed's rule (a graph arm's quality is its eager twin's, seed "
            "000 §一.6 S14d), so the veto has nothing to compare"
        )
    from_reasoning = sum(1 for acc in (base, cand) for r in acc.items if r.answered_in == "reasoning")
    if from_reasoning:
        notes.append(f"{from_reasoning} answer(s) scored from the reasoning text (the content was empty)")
    evidence: dict[str, Any] = d.model_dump(mode="json") | {
        "unit": "percentage points per kind (0-100 scale); fail when drop > max_drop_points",
        "max_drop_points": max_drop,
        "veto_floor_points": veto_floor,
        "cannot_discriminate": vacuous,
        "set_version": cand.set_version,
        "items": len(cand.items),
        "sources": sources,
    }
    flipped = f"{len(d.flipped)} item(s) scored differently"
    if fails:
        reasons = [*fails, flipped, *notes]
        return GateStep(name=ACCURACY, status=StepStatus.FAIL, reasons=reasons, evidence=evidence)
    return GateStep(
        name=ACCURACY,
        status=StepStatus.PASS,
        reasons=[
            f"accuracy {d.overall_candidate:.1f} vs {d.overall_baseline:.1f} points; no kind dropped more "
            f"than {max_drop:g} points; {flipped}",
            *notes,
        ],
        evidence=evidence,
    )
