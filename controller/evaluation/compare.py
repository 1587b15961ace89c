"""`appliance compare BASELINE CANDIDATE`: switch the engine through the controller, bench each
arm warm with the same client and prompts, and apply the gate (appliance/evaluation/gate.py).

Arms alternate (A B A B … with `rounds` > 1: interleaving spreads host drift over both arms, which
is sound here because every switch is a full engine restart on a fixed cache root). An arm whose
ready launch was a compile-cache miss is restarted once on the same root before it is measured, so
both arms are warm (DOMAIN §7: same cache vintage). The benches and the verdict are stored in one
transaction at the end: a compare that cannot finish (an arm never ready, a context that fits no
tier) stores nothing; a candidate failing requests is a finished compare with a reject verdict.

The control of the engine is injected (`Control`): the CLI drives the controller over HTTP, the
admin API's `POST /compare` drives its own supervisor in-process.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from appliance.evaluation.bench_result import BenchResult, ProofResult
from appliance.evaluation.bench_tiers import TierPlan, plan_tiers
from appliance.evaluation.gate import GateResult, Verdict, decide
from controller.evaluation.bench import BenchParams, LaunchInfo, Progress, PromptCache, _quiet, run_bench
from controller.evaluation.client import EngineClient
from controller.evaluation.store import EvalStore


class CompareError(RuntimeError):
    """The compare could not produce a verdict (nothing was stored)."""


def vintage(cache: str | None) -> str | None:
    return {"hit": "warm", "miss": "cold"}.get(cache or "")


def launch_info(
    status: dict[str, Any],
    record: dict[str, Any],
    recipe: dict[str, Any] | None,
    cache_root: str | None,
    proof: ProofResult | None = None,
) -> LaunchInfo:
    """LaunchInfo from the controller's /status, /launches/{id} and /recipes/{name} answers."""
    launch = status.get("launch") or {}
    expect = (recipe or {}).get("expect") or {}
    engine = (recipe or {}).get("engine") or {}
    env = record.get("env") or {}
    return LaunchInfo(
        launch_id=record.get("id") or launch.get("id"),
        recipe=str(record.get("recipe") or status.get("recipe")),
        spec_hash=record.get("spec_hash"),
        cache_vintage=vintage(record.get("cache") or launch.get("cache")),
        cache_root=cache_root or env.get("VLLM_CACHE_ROOT"),
        engine_url=str(launch.get("engine_url")),
        reproducibility=expect.get("reproducibility"),
        max_num_seqs=engine.get("max_num_seqs"),
        proof=proof or ProofResult(),
    )


@dataclass
class Control:
    apply: Callable[[str], Awaitable[None]]
    restart: Callable[[], Awaitable[None]]
    status: Callable[[], Awaitable[dict[str, Any]]]
    describe: Callable[[dict[str, Any]], Awaitable[LaunchInfo]]
    poll_s: float = 1.0

    async def wait_ready(self, recipe: str, timeout_s: float, after: str | None) -> dict[str, Any]:
        """Until `recipe` is ready on a launch other than `after`; failed/idle end it with the reason."""
        deadline = time.monotonic() + timeout_s
        while True:
            s = await self.status()
            launch = s.get("launch") or {}
            if s.get("recipe") == recipe and launch.get("id") != after:
                if s.get("state") == "ready":
                    return s
                if s.get("state") == "failed":
                    diag = s.get("last_diagnosis") or {}
                    raise CompareError(
                        f"{recipe} failed to start: {diag.get('summary') or diag or 'no diagnosis'}"
                    )
            if time.monotonic() > deadline:
                raise CompareError(
                    f"{recipe} was not ready within {timeout_s:.0f} s (state {s.get('state')})"
                )
            await asyncio.sleep(self.poll_s)

    async def switch(self, recipe: str, *, warm: bool, timeout_s: float, progress: Progress) -> LaunchInfo:
        s = await self.status()
        current = (s.get("launch") or {}).get("id")
        if not (s.get("recipe") == recipe and s.get("state") == "ready"):
            progress({"phase": "switch", "recipe": recipe})
            await self.apply(recipe)
            s = await self.wait_ready(recipe, timeout_s, current)
        info = await self.describe(s)
        if warm and info.cache_vintage == "cold":
            # The first start on an empty root compiled: restart on the same root so the arm is warm.
            progress({"phase": "warm-restart", "recipe": recipe, "launch_id": info.launch_id})
            await self.restart()
            s = await self.wait_ready(recipe, timeout_s, info.launch_id)
            info = await self.describe(s)
        progress(
            {
                "phase": "arm-ready",
                "recipe": recipe,
                "launch_id": info.launch_id,
                "cache_vintage": info.cache_vintage,
            }
        )
        return info


@dataclass
class CompareOutcome:
    id: str
    baselines: list[BenchResult]
    candidates: list[BenchResult]
    gate: GateResult


def _tagged(progress: Progress, recipe: str) -> Progress:
    def tagged(event: dict[str, Any]) -> None:
        progress({**event, "recipe": recipe})

    return tagged


def _median_arm(results: list[BenchResult]) -> BenchResult:
    return sorted(results, key=lambda r: r.score)[len(results) // 2]


async def compare(
    control: Control,
    baseline: str,
    candidate: str,
    params: BenchParams,
    store: EvalStore | None,
    *,
    rounds: int = 1,
    warm: bool = True,
    ready_timeout_s: float = 3600,
    api_key: str | None = None,
    progress: Progress = _quiet,
) -> CompareOutcome:
    if baseline == candidate:
        raise CompareError("baseline and candidate are the same recipe")
    if rounds < 1:
        raise CompareError("rounds must be at least 1")
    arms: dict[str, list[BenchResult]] = {baseline: [], candidate: []}
    plan: TierPlan | None = None
    prompts = PromptCache()  # tokenized by the baseline, sent unchanged to the candidate
    for r in range(rounds):
        for recipe in (baseline, candidate):
            info = await control.switch(recipe, warm=warm, timeout_s=ready_timeout_s, progress=progress)
            if plan is None:  # the baseline's context decides the tiers for every arm (same prompts)
                async with EngineClient(info.engine_url, api_key or info.engine_key) as c:
                    _, max_model_len = await c.discover()
                plan = plan_tiers(max_model_len, params.output_tokens)
            progress({"phase": "bench", "recipe": recipe, "round": r + 1, "rounds": rounds})
            arms[recipe].append(
                await run_bench(
                    info,
                    params,
                    api_key=api_key,
                    progress=_tagged(progress, recipe),
                    plan=plan,
                    prompts=prompts,
                )
            )
    # The gate compares the median-score run of each arm (one run each with rounds=1); a failure in
    # any run of the candidate still rejects: failures are summed into the arm that is gated.
    base, cand = _median_arm(arms[baseline]), _median_arm(arms[candidate])
    gate = decide(base, cand)
    extra_fail = [r for r in arms[candidate] if r is not cand and r.failed]
    if extra_fail:
        gate = gate.model_copy(
            update={
                "verdict": Verdict.REJECT,
                "reasons": [
                    f"candidate failed {sum(r.failed for r in extra_fail)} request(s) in other rounds",
                    *gate.reasons,
                ],
            }
        )
    outcome = CompareOutcome(
        id=f"cmp-{uuid.uuid4().hex[:12]}", baselines=arms[baseline], candidates=arms[candidate], gate=gate
    )
    if store is not None:
        store.add_comparison(outcome.id, outcome.baselines, outcome.candidates, gate)
    progress({"phase": "verdict", "verdict": gate.verdict.value, "reasons": gate.reasons})
    return outcome
