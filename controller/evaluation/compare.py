"""`appliance compare BASELINE CANDIDATE`: switch the engine through the controller, bench each
arm warm with the same client and prompts, and apply the gate (appliance/evaluation/gate.py).

The gate is the seed's whole protocol (appliance/evaluation/protocol.py: proof → smoke → first five
→ re-runs → score → accuracy). Arms alternate (A B A B … when more rounds run: interleaving spreads
host drift over both arms, which is sound here because every switch is a full engine restart on a
fixed cache root). An arm whose
ready launch was a compile-cache miss is restarted once on the same root before it is measured, so
both arms are warm (DOMAIN §7: same cache vintage). The benches and the verdict are stored in one
transaction at the end: a compare that cannot finish (an arm never ready, a context that fits no
tier) stores nothing; a candidate failing requests is a finished compare with a reject verdict.

an arm whose text varies across restarts gets its smoke length, length hold and accuracy
evidence from its eager twin (appliance/evaluation/eager_twin.py; the other arm when it qualifies,
so no extra switch; a third recipe is switched to once, after round 1); a failed proof or smoke
stops the compare before the next tiers are benched (the baseline's failure before the candidate is
even switched to); a `full` run (100 prompts per tier) runs at least three rounds.

The control of the engine is injected (`Control`): the CLI drives the controller over HTTP, the
admin API's `POST /compare` drives its own supervisor in-process.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from appliance.evaluation.accuracy import ITEMS_PER_KIND, AccuracyResult
from appliance.evaluation.arm_settings import ArmsDiffer, card_mismatch, cards_of, check, settings_of
from appliance.evaluation.bench_result import BenchResult, ProofResult, SmokeResult
from appliance.evaluation.bench_tiers import TierPlan, plan_tiers
from appliance.evaluation.eager_twin import NoEagerTwin, Twin, needs_twin, resolve
from appliance.evaluation.gate import GateResult
from appliance.evaluation.protocol import (
    Thresholds,
    Tokens,
    early_stop,
    needs_more_rounds,
    throughput_passed,
    throughput_steps,
)
from appliance.evaluation.protocol import gate as protocol_gate
from controller.evaluation.accuracy_run import reasoning_parser, run_accuracy
from controller.evaluation.bench import (
    BenchParams,
    LaunchInfo,
    Progress,
    PromptCache,
    _quiet,
    output_setting,
    run_bench,
)
from controller.evaluation.cards import read_cards
from controller.evaluation.client import EngineClient
from controller.evaluation.deployment import PROBE_TIMEOUT_S
from controller.evaluation.smoke import SMOKE_TIER, LogReader, run_smoke
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
        recipe_doc=recipe,
        cards=read_cards((recipe or {}).get("platform"), (recipe or {}).get("devices")),
    )


@dataclass
class Control:
    apply: Callable[[str], Awaitable[None]]
    restart: Callable[[], Awaitable[None]]
    status: Callable[[], Awaitable[dict[str, Any]]]
    describe: Callable[[dict[str, Any]], Awaitable[LaunchInfo]]
    poll_s: float = 1.0
    # The recipe as the controller shows it (None: unknown); the engine log of a launch by offset.
    recipe: Callable[[str], Awaitable[dict[str, Any] | None]] | None = None
    log: LogReader | None = None
    # Every recipe the controller can launch (name → document): where an eager twin is derived from.
    catalogue: Callable[[], Awaitable[dict[str, dict[str, Any]]]] | None = None

    async def wait_ready(self, recipe: str, timeout_s: float, after: str | None) -> dict[str, Any]:
        """Until `recipe` is ready on a launch other than `after`, alone (the engine it replaced by
        blue/green — possibly on the same card — is gone: an arm is measured without another engine
        beside it); failed/idle end it with the reason."""
        deadline = time.monotonic() + timeout_s
        while True:
            s = await self.status()
            launch = s.get("launch") or {}
            if s.get("recipe") == recipe and launch.get("id") != after:
                if s.get("state") == "ready" and not s.get("blue_green"):
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

    async def deployment_landed(self, info: LaunchInfo, s: dict[str, Any]) -> LaunchInfo:
        """The arm's record once its declared deployment probe has landed (it runs in the engine's
        interpreter after ready: seconds), bounded by the probe's own timeout; after that the proof
        step fails on the missing result (ProofResult.problems), never passes without it."""
        deadline = time.monotonic() + PROBE_TIMEOUT_S + 30.0
        while (info.proof.deployment_declared and info.proof.deployment is None
               and time.monotonic() < deadline):
            await asyncio.sleep(self.poll_s)
            info = await self.describe(s)
        return info

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
        info = await self.deployment_landed(info, s)
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
    twins: dict[str, Twin] = field(default_factory=dict)  # arm → whose token streams stand for it
    twin_runs: dict[str, list[BenchResult]] = field(default_factory=dict)  # a third recipe's runs


@dataclass(frozen=True)
class CompareOptions:
    """The protocol's knobs (appliance/evaluation/protocol.py); defaults are the seed's."""

    thresholds: Thresholds = field(default_factory=Thresholds)
    smoke: bool = True
    accuracy: bool = True
    accuracy_items: int = ITEMS_PER_KIND
    allow_diff: frozenset[str] = frozenset()


def _tagged(progress: Progress, recipe: str) -> Progress:
    def tagged(event: dict[str, Any]) -> None:
        progress({**event, "recipe": recipe})

    return tagged


async def _arm_settings(
    control: Control, baseline: str, candidate: str, params: BenchParams, options: CompareOptions
) -> tuple[dict[str, list[Any]], list[dict[str, Any] | None]]:
    """Refuse arms that differ in a forbidden field (unless allowed) or run on other cards, before
    anything is switched (DOMAIN §7). Returns the allowed differences and both recipe documents."""
    if control.recipe is None:
        return {}, [None, None]
    docs = [await control.recipe(baseline), await control.recipe(candidate)]
    settings = [
        settings_of(d, output_tokens=output_setting(params), ignore_eos=params.ignore_eos) for d in docs
    ]
    try:
        allowed = check(settings[0], settings[1], options.allow_diff)
    except ArmsDiffer as exc:
        raise CompareError(str(exc)) from exc
    cards = [cards_of(d) for d in docs]
    mismatch = card_mismatch(cards[0], cards[1])
    if mismatch:
        raise CompareError(
            f"the arms run on different cards ({mismatch}): results from different cards are not "
            "gated against each other (DOMAIN §7: cards 0/1 vs 2/3 differ by ~16%)"
        )
    return allowed, docs


async def eager_twins(
    control: Control, baseline: str, candidate: str, docs: list[dict[str, Any] | None]
) -> dict[str, Twin]:
    """Each arm's token-stream source (appliance/evaluation/eager_twin.py), before anything is
    switched; an arm that needs a twin and has none refuses the compare with the reason."""
    arms = {baseline: docs[0], candidate: docs[1]}
    out: dict[str, Twin] = {}
    catalogue: dict[str, dict[str, Any]] | None = None
    for name, doc in arms.items():
        if doc is None:  # no recipe document (a bare control): the arm's own evidence, as before
            out[name] = Twin(recipe=name, how="own", why="no recipe document to read")
            continue
        known: dict[str, dict[str, Any]] = {n: d for n, d in arms.items() if d is not None}
        if needs_twin(doc) and control.catalogue is not None:
            if catalogue is None:
                catalogue = await control.catalogue()
            known = {**{n: d for n, d in catalogue.items() if not d.get("abstract")}, **known}
        other = candidate if name == baseline else baseline
        try:
            out[name] = resolve(name, doc, known, prefer=other)
        except NoEagerTwin as exc:
            raise CompareError(str(exc)) from exc
    return out


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
    options: CompareOptions | None = None,
) -> CompareOutcome:
    """The seed's protocol (appliance/evaluation/protocol.py). Round 1: per arm, the proof and the
    smoke request (a failure stops the compare there), the discarded warm-up and the first five of
    each tier (the baseline's token-stream source also scores its accuracy then: it is the reference
    either way). More interleaved rounds follow while a small gain is not yet stable (or up to
    `rounds`, the operator's minimum; three at least for a full run). The candidate's accuracy is
    scored only when the throughput steps passed; then the gate decides over everything recorded."""
    options = options or CompareOptions()
    th = options.thresholds
    if baseline == candidate:
        raise CompareError("baseline and candidate are the same recipe")
    if rounds < 1:
        raise CompareError("rounds must be at least 1")
    if params.mode == "full":  # seed 003 §1120: steady state over three runs
        rounds = max(rounds, th.min_rounds)
    allowed, docs = await _arm_settings(control, baseline, candidate, params, options)
    twins = await eager_twins(control, baseline, candidate, docs)
    reasoning = reasoning_parser(*docs) is not None
    arms: dict[str, list[BenchResult]] = {baseline: [], candidate: []}
    twin_runs: dict[str, list[BenchResult]] = {}
    plan: TierPlan | None = None
    prompts = PromptCache()  # tokenized by the baseline, sent unchanged to the candidate
    cap = max(rounds, th.max_rounds)
    stopped: str | None = None

    def runs_of(recipe: str) -> list[BenchResult]:
        return arms[recipe] if recipe in arms else twin_runs.setdefault(recipe, [])

    def smoke_of(recipe: str) -> SmokeResult | None:
        return next((r.smoke for r in runs_of(recipe) if r.smoke), None)

    async def measure(recipe: str, r: int, *, accuracy: bool) -> str | None:
        """One arm's turn: switch, (round 1) proof and smoke, bench, accuracy. Returns why the
        compare stops here, if it does."""
        nonlocal plan
        info = await control.switch(recipe, warm=warm, timeout_s=ready_timeout_s, progress=progress)
        async with EngineClient(info.engine_url, api_key or info.engine_key) as c:
            _, max_model_len = await c.discover()
            if plan is None:  # the baseline's context decides the tiers for every arm (same prompts)
                plan = plan_tiers(max_model_len, params.plan_output_tokens)
            prompts.client = c
            smoke = None
            if r == 0 and options.smoke:
                progress({"phase": "smoke", "recipe": recipe})
                tier = next(t for t in plan.tiers if t.name == SMOKE_TIER)
                smoke = await run_smoke(
                    c, prompts, plan, params.limit(tier), params.ignore_eos,
                    launch_id=info.launch_id, read_log=control.log,
                )
                progress({"phase": "smoke-done", "recipe": recipe, "ok": smoke.request.ok,
                          "output_tokens": smoke.request.output_tokens, "alive_after": smoke.alive_after,
                          "new_error_lines": len(smoke.new_error_lines)})
            if r == 0:
                # The length check against the control only where both streams are the arms' own.
                control_smoke = None
                if recipe == candidate and twins[candidate].how == "own" and twins[baseline].how == "own":
                    control_smoke = smoke_of(baseline)
                label = {baseline: "baseline", candidate: "candidate"}.get(recipe, "eager twin")
                why = early_stop(label, recipe, info.proof.problems, smoke, control_smoke, th)
                if why:
                    progress({"phase": "stopped", "recipe": recipe, "why": why})
                    runs_of(recipe).append(_unbenched(info, params, plan, why, smoke))
                    return why
            progress({"phase": "bench", "recipe": recipe, "round": r + 1})
            result = await run_bench(
                info, params, api_key=api_key, progress=_tagged(progress, recipe),
                client=c, plan=plan, prompts=prompts,
            )
            acc = None
            if accuracy and options.accuracy:
                progress({"phase": "accuracy", "recipe": recipe})
                acc = await run_accuracy(c, plan, options.accuracy_items, _tagged(progress, recipe),
                                         reasoning=reasoning)
        runs_of(recipe).append(result.model_copy(update={"smoke": smoke, "accuracy": acc}))
        return None

    ref_source = twins[baseline].recipe  # whose accuracy is the reference
    r = 0
    while stopped is None and (r == 0 or r < rounds or (
        r < cap and needs_more_rounds(arms[baseline], arms[candidate], th)
    )):
        for recipe in (baseline, candidate):
            stopped = await measure(recipe, r, accuracy=r == 0 and recipe == ref_source)
            if stopped:
                break
        if r == 0 and stopped is None:
            for twin in dict.fromkeys(t.recipe for t in twins.values() if t.recipe not in arms):
                # A third recipe stands for an arm: measured once (smoke, lengths, accuracy).
                stopped = await measure(twin, 0, accuracy=True)
                if stopped:
                    break
        r += 1
    if not arms[candidate]:  # the baseline stopped the compare: the candidate was never switched to
        arms[candidate].append(_unbenched(None, params, plan, f"not switched to: {stopped}", None, candidate))
    base_runs, cand_runs = arms[baseline], arms[candidate]
    tokens = {arm: _tokens(twins[arm], runs_of(twins[arm].recipe)) for arm in (baseline, candidate)}
    steps, _ = throughput_steps(base_runs, cand_runs, th, tokens[baseline], tokens[candidate])
    why_not: str | None = None
    cand_source = twins[candidate].recipe
    if not options.accuracy:
        why_not = "not run: accuracy switched off for this compare (--no-accuracy)"
    elif not throughput_passed(steps):
        why_not = "not run: the throughput steps did not pass (accuracy runs only after them)"
    elif _accuracy_of(runs_of(cand_source)) is None:
        # The candidate's source (itself, usually the engine up now) has not been scored yet.
        info = await control.switch(cand_source, warm=warm, timeout_s=ready_timeout_s, progress=progress)
        progress({"phase": "accuracy", "recipe": cand_source})
        async with EngineClient(info.engine_url, api_key or info.engine_key) as c:
            await c.discover()
            assert plan is not None
            acc = await run_accuracy(c, plan, options.accuracy_items, _tagged(progress, cand_source),
                                     reasoning=reasoning)
        runs = runs_of(cand_source)
        runs[0] = runs[0].model_copy(update={"accuracy": acc})
        tokens = {arm: _tokens(twins[arm], runs_of(twins[arm].recipe)) for arm in (baseline, candidate)}
    gate = protocol_gate(base_runs, cand_runs, th, allowed_diffs=allowed, accuracy_why_not=why_not,
                         base_tokens=tokens[baseline], cand_tokens=tokens[candidate])
    outcome = CompareOutcome(
        id=f"cmp-{uuid.uuid4().hex[:12]}", baselines=base_runs, candidates=cand_runs, gate=gate,
        twins=twins, twin_runs=twin_runs,
    )
    if store is not None:
        others = [run for runs in twin_runs.values() for run in runs]
        store.add_comparison(outcome.id, outcome.baselines, outcome.candidates, gate, others)
    progress({"phase": "verdict", "verdict": gate.verdict.value, "reasons": gate.reasons})
    return outcome


def _accuracy_of(runs: list[BenchResult]) -> AccuracyResult | None:
    return next((r.accuracy for r in runs if r.accuracy), None)


def _tokens(twin: Twin, runs: list[BenchResult]) -> Tokens | None:
    return None if twin.how == "own" else Tokens(source=twin.recipe, why=twin.why, runs=runs)


def _unbenched(
    info: LaunchInfo | None,
    params: BenchParams,
    plan: TierPlan | None,
    why: str,
    smoke: SmokeResult | None,
    recipe: str | None = None,
) -> BenchResult:
    """The record of an arm the compare stopped before benching: its launch, proof and smoke."""
    now = time.time()
    return BenchResult(
        id=f"bench-{uuid.uuid4().hex[:12]}",
        launch_id=info.launch_id if info else None,
        recipe=info.recipe if info else str(recipe),
        spec_hash=info.spec_hash if info else None,
        cache_vintage=info.cache_vintage if info else None,
        cache_root=info.cache_root if info else None,
        engine_url=info.engine_url if info else "",
        prompt_set="-",
        tier_rule=plan.describe() if plan else "-",
        output_tokens=params.plan_output_tokens,
        ignore_eos=params.ignore_eos,
        tiers=[],
        proof=info.proof if info else ProofResult(),
        started_at=now,
        finished_at=now,
        smoke=smoke,
        mode=params.mode,
        stopped=why,
    )
