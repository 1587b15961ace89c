"""`appliance bench`: the tiered benchmark and the single-stream protocol against one engine.

DOMAIN §7: per tier, after discarding the warm-up (`warmup` requests of a prompt that is not one of
the measured ones, so the measured prompts meet no prefix cache they would not meet anyway; seed
004 §11 "discard the compile warm-up"), the fixed first five requests (more with
`requests_per_tier`) at a fixed concurrency → output tokens/s, P99 TTFT/TPOT, failures, output
lengths and texts; then the
single-stream protocol used in S9–S14 — decode median ms/token (n ≥ 5), TTFT at two prompt lengths
(the seed's ~3800 and 8K, scaled by the same rule as the tiers), and conc=8 tokens/s.
Progress goes to a callback after every request (long runs take many minutes on real hosts).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from appliance.evaluation.arm_settings import cards_of, settings_of
from appliance.evaluation.bench_result import (
    BenchResult,
    ProofResult,
    RequestRecord,
    SingleStream,
    TierResult,
)
from appliance.evaluation.bench_tiers import (
    FIRST_N,
    FULL_REQUESTS,
    SEED_TIERS,
    Tier,
    TierPlan,
    input_lengths,
    official_output_tokens,
    output_limit,
    plan_tiers,
)
from appliance.evaluation.prompts import PROMPT_SET_VERSION, bench_prompt
from controller.evaluation.client import EngineClient

Progress = Callable[[dict[str, Any]], None]
SEED_TTFT_INPUTS = (3800, 8192)  # DOMAIN §7: TTFT at ~3800 and 8K input tokens
# Requests that are not the task's measured requests keep small fixed outputs: the discarded
# warm-up only has to run the compile warm-up, and the single stream measures ms/token (ignore_eos).
WARMUP_OUTPUT_TOKENS = 16
SINGLE_STREAM_OUTPUT_TOKENS = 64


def _quiet(_: dict[str, Any]) -> None:
    return None


@dataclass(frozen=True)
class LaunchInfo:
    """What a result is tied to: the launch the engine belongs to (from the controller)."""

    launch_id: str | None
    recipe: str
    spec_hash: str | None
    cache_vintage: str | None  # cold / warm
    cache_root: str | None
    engine_url: str
    reproducibility: str | None = None  # the recipe's declared expect.reproducibility
    max_num_seqs: int | None = None
    proof: ProofResult = field(default_factory=ProofResult)
    # The recipe as the controller shows it (settings, cards and SLOs are recorded from it).
    recipe_doc: dict[str, Any] | None = field(default=None, repr=False, compare=False)
    cards: dict[str, Any] = field(default_factory=dict)  # what the host read about the cards
    # The launch's per-launch engine API key (the engine's /v1 answers 401 without it). Kept
    # out of repr and never written to a result; None for an engine given directly (then --key).
    engine_key: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class BenchParams:
    # None: each tier's declared official max output, stopping at EOS . A number is
    # the FAST MODE (a small fixed cap, for tests), and every result says so.
    output_tokens: int | None = None
    requests_per_tier: int = FIRST_N
    concurrency: int = 5
    ignore_eos: bool = False  # natural stops, as the seed ran (DOMAIN §7: output lengths are checked)
    warmup: int = 1  # discarded requests per tier before measuring (seed 004 §11)
    single_stream: bool = True
    decode_samples: int = 5  # n ≥ 5 (DOMAIN §7)
    conc: int = 8

    def __post_init__(self) -> None:
        if self.output_tokens is not None and self.output_tokens < 1:
            raise ValueError("output_tokens must be at least 1 (or None: the tiers' declared max output)")
        if self.requests_per_tier < FIRST_N:
            raise ValueError(f"at least the first {FIRST_N} requests of each tier (DOMAIN §7)")
        if self.decode_samples < 5:
            raise ValueError("decode median needs n >= 5 (DOMAIN §7)")
        if self.warmup < 0:
            raise ValueError("warmup must be 0 or more requests per tier")

    @property
    def mode(self) -> str:
        """fast (a fixed small cap), full (100 prompts per tier, seed 003 §1120) or standard."""
        if self.output_tokens is not None:
            return "fast"
        return "full" if self.requests_per_tier >= FULL_REQUESTS else "standard"

    @property
    def plan_output_tokens(self) -> int:
        """The output a tier plan leaves room for: the cap, or the largest declared max output."""
        return self.output_tokens if self.output_tokens is not None else official_output_tokens()

    def limit(self, tier: Tier) -> int:
        return output_limit(tier, self.output_tokens)


class PromptCache:
    """Prompts trimmed to exact token counts with the engine's tokenizer, tokenized once.

    A compare shares one cache between its arms: the candidate gets the very token ids the
    baseline's tokenizer produced (same prompts, DOMAIN §7), whatever its own context can hold.
    """

    def __init__(self, client: EngineClient | None = None) -> None:
        self.client = client
        self._ids: dict[tuple[str, int, int], list[int]] = {}

    async def ids(self, tier: str, index: int, length: int) -> list[int]:
        key = (tier, index, length)
        if key not in self._ids:
            if self.client is None:
                raise RuntimeError("PromptCache needs a client for prompts it has not tokenized yet")
            words = length + 16
            while True:
                ids = await self.client.tokenize(bench_prompt(tier, index, words))
                if len(ids) >= length:
                    break
                words *= 2
            self._ids[key] = ids[:length]
        return self._ids[key]


async def run_tier(
    client: EngineClient, prompts: PromptCache, tier: Tier, params: BenchParams, progress: Progress
) -> TierResult:
    lengths = input_lengths(tier, params.requests_per_tier)
    ids = [await prompts.ids(tier.name, i, n) for i, n in enumerate(lengths)]
    gate = asyncio.Semaphore(params.concurrency)
    done = 0

    async def one(i: int) -> RequestRecord:
        nonlocal done
        async with gate:
            rec = await client.timed(tier.name, i, ids[i], params.limit(tier), params.ignore_eos)
        done += 1
        progress(
            {
                "phase": "tier",
                "tier": tier.name,
                "done": done,
                "total": len(ids),
                "ok": rec.ok,
                "output_tokens": rec.output_tokens,
                "ttft_ms": rec.ttft_ms,
                "error": rec.error,
            }
        )
        return rec

    start = time.perf_counter()
    records = await asyncio.gather(*(one(i) for i in range(len(ids))))
    return TierResult(
        tier=tier,
        requests=list(records),
        duration_s=time.perf_counter() - start,
        concurrency=params.concurrency,
    )


async def run_warmup(
    client: EngineClient, prompts: PromptCache, plan: TierPlan, params: BenchParams, progress: Progress
) -> list[RequestRecord]:
    """`params.warmup` requests per tier at the tier's lower bound, under their own prompt name
    ("warmup:TIER"), recorded and never counted."""
    out: list[RequestRecord] = []
    for tier in plan.tiers:
        for k in range(params.warmup):
            ids = await prompts.ids(f"warmup:{tier.name}", k, tier.lo)
            limit = min(params.limit(tier), WARMUP_OUTPUT_TOKENS)
            rec = await client.timed(f"warmup:{tier.name}", k, ids, limit, params.ignore_eos)
            out.append(rec)
            progress(
                {"phase": "warmup", "tier": tier.name, "done": k + 1, "total": params.warmup, "ok": rec.ok}
            )
    return out


async def run_single_stream(
    client: EngineClient, prompts: PromptCache, plan: TierPlan, params: BenchParams, progress: Progress
) -> SingleStream:
    short = await prompts.ids("single", 0, max(16, plan.tiers[0].lo // 4))
    decode: list[float] = []
    failed = 0
    for k in range(params.decode_samples):
        rec = await client.timed("single", k, short, _single_tokens(params), True)
        failed += not rec.ok
        if rec.ok and rec.tpot_ms is not None:
            decode.append(rec.tpot_ms)
        progress({"phase": "decode", "done": k + 1, "total": params.decode_samples, "tpot_ms": rec.tpot_ms})
    ttft: dict[int, float] = {}
    for n in SEED_TTFT_INPUTS:
        length = min(max(int(n * plan.scale), 1), plan.max_model_len - 1)
        rec = await client.timed("ttft", n, await prompts.ids("ttft", n, length), 1, True)
        failed += not rec.ok
        if rec.ok and rec.ttft_ms is not None:
            ttft[length] = rec.ttft_ms
        progress({"phase": "ttft", "input_tokens": length, "ttft_ms": rec.ttft_ms})
    start = time.perf_counter()
    done = 0

    async def one(k: int) -> RequestRecord:
        # Each request is reported as it completes, not all together when the last one ends.
        nonlocal done
        rec = await client.timed("conc", k, short, _single_tokens(params), True)
        done += 1
        progress({"phase": "conc", "done": done, "total": params.conc, "ok": rec.ok, "error": rec.error})
        return rec

    recs = await asyncio.gather(*(one(k) for k in range(params.conc)))
    wall = time.perf_counter() - start
    failed += sum(not r.ok for r in recs)
    conc = sum(r.output_tokens for r in recs if r.ok) / wall if wall > 0 else None
    progress({"phase": f"conc{params.conc}", "tokens_per_s": conc})
    return SingleStream(
        decode_ms_samples=decode, ttft_ms_by_input=ttft, conc8_tokens_per_s=conc, failed=failed
    )


async def run_bench(
    launch: LaunchInfo,
    params: BenchParams,
    *,
    api_key: str | None = None,
    progress: Progress = _quiet,
    client: EngineClient | None = None,
    plan: TierPlan | None = None,
    prompts: PromptCache | None = None,
) -> BenchResult:
    """Bench the engine at `launch.engine_url`. Raises EngineNotReady / NoTierFits before sending
    a single measured request, so a refusal leaves nothing behind.

    `client`: an open client of the caller's (left open); otherwise one is opened and closed here.
    `plan` fixes the tiers (a compare plans once, from the baseline's context, so both arms get the
    same prompts: a candidate with a smaller context then fails the requests it cannot hold)."""
    if client is not None:
        return await _bench(client, launch, params, progress, plan, prompts)
    async with EngineClient(launch.engine_url, api_key or launch.engine_key) as c:
        return await _bench(c, launch, params, progress, plan, prompts)


async def _bench(
    c: EngineClient,
    launch: LaunchInfo,
    params: BenchParams,
    progress: Progress,
    plan: TierPlan | None,
    prompts: PromptCache | None,
) -> BenchResult:
    _, max_model_len = await c.discover()
    plan = plan or plan_tiers(max_model_len, params.plan_output_tokens)
    progress(
        {
            "phase": "plan",
            "recipe": launch.recipe,
            "tier_rule": plan.describe(),
            "max_model_len": max_model_len,
        }
    )
    prompts = prompts or PromptCache()
    prompts.client = c  # only for prompts not tokenized yet: a shared cache keeps the first arm's ids
    warm = await run_warmup(c, prompts, plan, params, progress)
    started = time.time()
    tiers = [await run_tier(c, prompts, t, params, progress) for t in plan.tiers]
    single = await run_single_stream(c, prompts, plan, params, progress) if params.single_stream else None
    return BenchResult(
        id=f"bench-{uuid.uuid4().hex[:12]}",
        launch_id=launch.launch_id,
        recipe=launch.recipe,
        spec_hash=launch.spec_hash,
        cache_vintage=launch.cache_vintage,
        cache_root=launch.cache_root,
        engine_url=launch.engine_url,
        prompt_set=PROMPT_SET_VERSION,
        tier_rule=plan.describe(),
        output_tokens=params.plan_output_tokens,
        ignore_eos=params.ignore_eos,
        tiers=tiers,
        mode=params.mode,
        output_limits={t.name: params.limit(t) for t in plan.tiers},
        single_stream=single,
        proof=launch.proof,
        started_at=started,
        finished_at=time.time(),
        settings=settings_of(
            launch.recipe_doc, output_tokens=output_setting(params), ignore_eos=params.ignore_eos,
            logged=launch.proof.engine_limits,
        ),
        cards=cards_of(launch.recipe_doc, launch.cards),
        warmup=warm,
        slo=recipe_slo(launch.recipe_doc),
    )


def _single_tokens(params: BenchParams) -> int:
    return min(params.plan_output_tokens, SINGLE_STREAM_OUTPUT_TOKENS)


def output_setting(params: BenchParams) -> int | dict[str, int]:
    """The output limit the requests carry, as recorded between arms (must not differ): the fast
    mode's cap, or each tier's declared max output."""
    if params.output_tokens is not None:
        return params.output_tokens
    return {t.name: t.max_output for t in SEED_TIERS}


def recipe_slo(recipe: dict[str, Any] | None) -> dict[str, dict[str, float]]:
    """The recipe's optional absolute per-tier SLO targets (`expect.slo`), None values dropped."""
    slo = ((recipe or {}).get("expect") or {}).get("slo") or {}
    return {
        tier: {k: float(v) for k, v in (targets or {}).items() if v is not None}
        for tier, targets in slo.items()
    }
