"""Issue 33, the runner's side (controller/evaluation/compare.py) with the engine faked at its seams
(test_compare_protocol.py's World): what is sent, what is switched to, and when it stops."""

from __future__ import annotations

from typing import Any

import pytest

from appliance.evaluation.bench_result import ProofResult
from appliance.evaluation.bench_tiers import SEED_TIERS
from appliance.evaluation.eager_twin import NoEagerTwin, resolve
from appliance.evaluation.gate import Flag, StepStatus, Verdict
from controller.evaluation import compare as compare_mod
from controller.evaluation.bench import BenchParams, LaunchInfo
from controller.evaluation.compare import CompareError, CompareOptions, compare
from controller.evaluation.smoke import SMOKE_TIER
from tests.unit.test_compare_protocol import BASE, CAND, OPTS, PARAMS, World, install

EAGER: dict[str, Any] = {
    "platform": "cpu", "model": {"path": "/m"}, "engine": {"max_num_seqs": 8, "mode": "eager"},
    "expect": {"reproducibility": "bitwise"}}
GRAPH: dict[str, Any] = {
    "platform": "cpu", "model": {"path": "/m"}, "engine": {"max_num_seqs": 8, "mode": "graph"},
    "expect": {"reproducibility": "varies-across-restarts"}}


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> World:
    w = install(World(), monkeypatch)
    return w


def _step(out: Any, name: str) -> Any:
    return next(s for s in out.gate.steps if s.name == name)


# ---- item 8: the smoke request has its own prompt


async def test_the_smoke_prompt_is_not_a_measured_requests_prompt(world: World) -> None:
    await compare(world.control(), BASE, CAND, PARAMS, None, options=OPTS)
    base_sent = [s for s in world.sent if s[0] == BASE]
    smoke = base_sent[0]  # the first request the baseline gets is its smoke
    measured = [s for s in base_sent if not s[1].startswith(("warmup:", "single", "ttft", "conc"))][1:]
    first = next(s for s in measured if s[1] == SMOKE_TIER and s[2] == 0)
    assert smoke[1] == SMOKE_TIER and len(smoke[3]) == len(first[3])  # the same length
    assert smoke[3] != first[3]  # its own tokens: no prefix-cache hit for the measured request 0


# ---- item 2: the tiers' declared max output, stopping at EOS; the fast mode named


async def test_measured_requests_carry_each_tiers_declared_max_output(world: World) -> None:
    world.natural_len = {BASE: 150, CAND: 150}  # both stop at EOS well before the cap
    params = BenchParams(single_stream=False, warmup=1)  # no cap: the standard mode
    world_plan = 4096  # room for 1024 output tokens next to the scaled inputs
    world_ctx(world, world_plan)
    out = await compare(world.control(), BASE, CAND, params, None, options=CompareOptions(accuracy=False))
    measured = [s for s in world.sent if s[1] in {t.name for t in SEED_TIERS}]
    assert {s[4] for s in measured} == {t.max_output for t in SEED_TIERS} == {1024}
    run = out.candidates[0]
    assert run.mode == "standard" and run.output_limits == {t.name: 1024 for t in SEED_TIERS}
    dist = _step(out, "score").evidence["output_lengths"]["candidate"]["all"]
    assert dist["max"] == 150 and dist["at_cap"] == 0
    assert Flag.FAST_MODE not in out.gate.flags


async def test_a_capped_run_is_the_fast_mode_and_says_so(world: World) -> None:
    out = await compare(world.control(), BASE, CAND, PARAMS, None, options=OPTS)
    assert out.candidates[0].mode == "fast" and Flag.FAST_MODE in out.gate.flags
    assert any(r.startswith("FAST MODE") for r in out.gate.reasons)


def world_ctx(world: World, max_model_len: int) -> None:
    """The fake engine's context (the default 2048 cannot hold 1024 output tokens and a tier)."""
    cls = getattr(compare_mod, "EngineClient")  # noqa: B009 — the fake the fixture put there

    async def discover(self: Any) -> tuple[str, int]:
        return "m", max_model_len

    cls.discover = discover


# ---- item 9: stop early; the full run


async def test_a_failed_candidate_proof_stops_before_its_tiers_are_benched(world: World) -> None:
    control = world.control()
    describe = control.describe

    async def with_proof(s: dict[str, Any]) -> LaunchInfo:
        info = await describe(s)
        if info.recipe == CAND:
            import dataclasses

            return dataclasses.replace(info, proof=ProofResult(markers={"X selected.": False}))
        return info

    control.describe = with_proof
    out = await compare(control, BASE, CAND, PARAMS, None, options=OPTS)
    assert out.gate.verdict is Verdict.REJECT and Flag.STOPPED_EARLY in out.gate.flags
    cand_sent = [s for s in world.sent if s[0] == CAND]
    assert [s[1] for s in cand_sent] == [SMOKE_TIER]  # the smoke ran; no warm-up, no tier
    assert out.candidates[0].tiers == [] and out.candidates[0].stopped
    assert world.chats[CAND] == 0
    assert [s.status for s in out.gate.steps][2:] == [StepStatus.SKIPPED] * 4


async def test_a_failed_baseline_smoke_stops_before_the_candidate_is_switched_to(world: World) -> None:
    world.fail_tier[BASE] = SMOKE_TIER  # the smoke (8-16K) request fails
    out = await compare(world.control(), BASE, CAND, PARAMS, None, options=OPTS)
    assert world.applied == [BASE]
    assert out.gate.verdict is Verdict.REJECT
    assert _step(out, "smoke").status is StepStatus.FAIL
    assert "baseline smoke request failed" in _step(out, "smoke").reasons[0]


async def test_the_full_run_is_three_rounds_at_a_hundred_prompts(world: World) -> None:
    params = BenchParams(output_tokens=16, single_stream=False, warmup=0, requests_per_tier=100,
                         concurrency=50)
    assert params.mode == "fast"  # the cap names it fast, even at 100 prompts
    full = BenchParams(single_stream=False, warmup=0, requests_per_tier=100, concurrency=50)
    assert full.mode == "full"
    world_ctx(world, 4096)
    world.delay = {BASE: 0.08, CAND: 0.02}  # a clear gain over the fake's own overhead
    out = await compare(world.control(), BASE, CAND, full, None, options=CompareOptions(accuracy=False))
    assert len(out.baselines) == len(out.candidates) == 3
    assert out.gate.verdict is Verdict.ACCEPT


# ---- item 1: eager twins


async def test_a_graph_candidate_reads_its_eager_twins_evidence_and_is_not_scored_itself(
    world: World,
) -> None:
    world.recipes = {BASE: EAGER, CAND: GRAPH}
    world.wrong_answers.add(CAND)  # its own token stream would fail the veto: it is never read
    world.natural_len = {BASE: 16, CAND: 14}  # its own lengths would fail the smoke and the hold
    world.delay = {BASE: 0.06, CAND: 0.02}
    out = await compare(world.control(), BASE, CAND, PARAMS, None, options=OPTS)
    assert out.twins[CAND].recipe == BASE and out.twins[CAND].how == "derived"
    assert world.chats[CAND] == 0 and world.applied == [BASE, CAND]  # no extra switch
    assert out.gate.verdict is Verdict.ACCEPT, out.gate.reasons
    assert Flag.EAGER_TWIN_EVIDENCE in out.gate.flags
    assert _step(out, "accuracy").evidence["sources"] == {"baseline": "own", "candidate": BASE}
    assert _step(out, "smoke").evidence["own_output_tokens"]["candidate"] == 14  # shown, not gated


async def test_a_graph_arm_without_an_eager_twin_is_refused_before_any_switch(world: World) -> None:
    graph2 = {**GRAPH, "engine": {**GRAPH["engine"], "dtype": "float16"}}
    world.recipes = {BASE: {**GRAPH, "engine": {**GRAPH["engine"], "dtype": "bfloat16"}}, CAND: graph2}
    with pytest.raises(CompareError, match="no eager recipe with the same model"):
        await compare(world.control(), BASE, CAND, PARAMS, None, options=OPTS)
    assert world.applied == []


def test_a_declared_twin_is_checked_and_a_third_recipe_can_be_the_twin() -> None:
    other = {**EAGER, "model": {"path": "/other"}}
    declared = {**GRAPH, "expect": {**GRAPH["expect"], "eager_twin": "e2"}}
    assert resolve("g", declared, {"e2": EAGER}).how == "declared"
    with pytest.raises(NoEagerTwin, match="model '/other' vs '/m'"):
        resolve("g", declared, {"e2": other})
    assert resolve("g", GRAPH, {"z-eager": EAGER, "a-graph": GRAPH}).recipe == "z-eager"
    assert resolve("e", EAGER, {}).how == "own"  # an eager arm is its own twin


# ---- item 6: reasoning models


async def test_a_reasoning_recipes_answers_are_scored_from_the_reasoning_text_with_a_budget(
    world: World,
) -> None:
    for name in (BASE, CAND):
        engine = {"max_num_seqs": 8, "reasoning_parser": "qwen3"}
        world.recipes[name] = {**world.recipes[name], "engine": engine}
    world.thinks = {BASE, CAND}
    out = await compare(world.control(), BASE, CAND, PARAMS, None, options=OPTS)
    acc = out.baselines[0].accuracy
    assert acc is not None and all(i.answered_in == "reasoning" for i in acc.items)
    assert acc.by_kind()["multihop_qa"] == 100.0  # 0 points when only the empty content was scored
    assert min(world.chat_budgets) > 1024
    assert out.gate.verdict is Verdict.ACCEPT
