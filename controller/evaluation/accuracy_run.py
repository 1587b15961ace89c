"""Scoring one arm on the offline accuracy sets (appliance/evaluation/accuracy.py) with the bench's
own client: greedy chat completions that stop naturally, one at a time (a fixed batch composition,
so the two arms see the same schedule; DOMAIN §7: eager's reproducibility holds for a fixed batch).
A failed request scores 0 and is recorded with its error.

What is scored is what the model answered: the content, or the reasoning text
when the content is empty and the recipe runs a reasoning parser (the reference recipes run qwen3's,
which moves everything before `</think>` out of `message.content`). A reasoning recipe's items get
`REASONING_BUDGET_TOKENS` more than the answer budgets, so a thinking model is not cut off before
it answers."""

from __future__ import annotations

from typing import Any

from appliance.evaluation.accuracy import (
    REASONING_BUDGET_TOKENS,
    AccuracyResult,
    ItemResult,
    build_set,
    score_item,
    scored_text,
)
from appliance.evaluation.bench_tiers import TierPlan
from controller.evaluation.bench import Progress, _quiet
from controller.evaluation.client import ClientError, EngineClient


def set_sizes(plan: TierPlan) -> tuple[int, int]:
    """Context tokens of the passage kinds and of the long-context kinds: the middle of the 4–8K and
    of the 8–16K tier as the plan fitted them into the context (the tiers' scaling rule)."""
    t0, t1 = plan.tiers[0], plan.tiers[1]
    return (t0.lo + t0.hi) // 2, (t1.lo + t1.hi) // 2


def reasoning_parser(*recipes: dict[str, Any] | None) -> str | None:
    """The reasoning parser either arm's recipe runs (both arms get the same item budgets)."""
    for r in recipes:
        parser = ((r or {}).get("engine") or {}).get("reasoning_parser")
        if parser:
            return str(parser)
    return None


def item_budget(answer_tokens: int, reasoning: bool) -> int:
    return answer_tokens + (REASONING_BUDGET_TOKENS if reasoning else 0)


async def run_accuracy(
    client: EngineClient,
    plan: TierPlan,
    items_per_kind: int,
    progress: Progress = _quiet,
    *,
    reasoning: bool = False,
) -> AccuracyResult:
    short, long = set_sizes(plan)
    items = build_set(short, long, items_per_kind)
    results: list[ItemResult] = []
    for k, item in enumerate(items):
        try:
            answer = await client.chat_answer(item.prompt, item_budget(item.max_tokens, reasoning))
            text, where = scored_text(answer.content, answer.reasoning if reasoning else None)
            results.append(
                ItemResult(kind=item.kind, index=item.index, score=score_item(item, text), output=text,
                           answered_in=where)
            )
        except ClientError as exc:
            results.append(ItemResult(kind=item.kind, index=item.index, score=0.0, ok=False, error=str(exc)))
        progress({"phase": "accuracy", "done": k + 1, "total": len(items), "kind": item.kind.value})
    return AccuracyResult(context_tokens=long, items=results)
