"""Scoring one arm on the offline accuracy sets (appliance/evaluation/accuracy.py) with the bench's
own client: greedy chat completions that stop naturally, one at a time (a fixed batch composition,
so the two arms see the same schedule; DOMAIN §7: eager's reproducibility holds for a fixed batch).
A failed request scores 0 and is recorded with its error."""

from __future__ import annotations

from appliance.evaluation.accuracy import AccuracyResult, ItemResult, build_set, score_item
from appliance.evaluation.bench_tiers import TierPlan
from controller.evaluation.bench import Progress, _quiet
from controller.evaluation.client import ClientError, EngineClient


def set_sizes(plan: TierPlan) -> tuple[int, int]:
    """Context tokens of the passage kinds and of the long-context kinds: the middle of the 4–8K and
    of the 8–16K tier as the plan fitted them into the context (the tiers' scaling rule)."""
    t0, t1 = plan.tiers[0], plan.tiers[1]
    return (t0.lo + t0.hi) // 2, (t1.lo + t1.hi) // 2


async def run_accuracy(
    client: EngineClient, plan: TierPlan, items_per_kind: int, progress: Progress = _quiet
) -> AccuracyResult:
    short, long = set_sizes(plan)
    items = build_set(short, long, items_per_kind)
    results: list[ItemResult] = []
    for k, item in enumerate(items):
        try:
            output = await client.chat(item.prompt, item.max_tokens)
            results.append(
                ItemResult(kind=item.kind, index=item.index, score=score_item(item, output), output=output)
            )
        except ClientError as exc:
            results.append(ItemResult(kind=item.kind, index=item.index, score=0.0, ok=False, error=str(exc)))
        progress({"phase": "accuracy", "done": k + 1, "total": len(items), "kind": item.kind.value})
    return AccuracyResult(context_tokens=long, items=results)
