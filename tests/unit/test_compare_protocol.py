"""The compare's orchestration of the protocol (controller/evaluation/compare.py), with the engine
control and the engine client faked at their seams: what runs, in which order, and what is refused
before anything is switched."""

from __future__ import annotations

import asyncio
import time
import zlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from appliance.evaluation.accuracy import Kind, build_set
from appliance.evaluation.bench_result import ProofResult, RequestRecord
from appliance.evaluation.gate import StepStatus, Verdict
from controller.evaluation import bench as bench_mod
from controller.evaluation import compare as compare_mod
from controller.evaluation.accuracy_run import set_sizes
from controller.evaluation.bench import BenchParams, LaunchInfo
from controller.evaluation.client import ChatAnswer
from controller.evaluation.compare import CompareError, CompareOptions, Control, compare
from controller.evaluation.store import EvalStore

BASE, CAND = "r-base", "r-cand"


class World:
    """The controller's state and the engine's behaviour per recipe."""

    def __init__(self) -> None:
        self.current: str | None = None
        self.launch = 0
        self.applied: list[str] = []
        self.delay = {BASE: 0.02, CAND: 0.01}  # the candidate is twice as fast
        self.now = 1000.0  # the bench's clock (controller/evaluation/bench.py reads time.perf_counter)
        self.fail_tier: dict[str, str] = {}
        self.wrong_answers: set[str] = set()
        self.chats: dict[str, int] = {BASE: 0, CAND: 0}
        self.sent: list[tuple[str, str, int, list[int], int]] = []
        self.natural_len: dict[str, int] = {}
        self.thinks: set[str] = set()
        self.chat_budgets: list[int] = []
        self.recipes: dict[str, dict[str, Any]] = {
            BASE: {"platform": "cpu", "engine": {"max_num_seqs": 8}},
            CAND: {"platform": "cpu", "engine": {"max_num_seqs": 8}},
        }
        self.log = "INFO Application startup complete.\nINFO 200 OK\n"
        self.answers = {i.prompt: i.answers for i in build_set(*set_sizes(_plan()), 2)}

    def control(self) -> Control:
        async def apply(recipe: str) -> None:
            self.applied.append(recipe)
            self.current, self.launch = recipe, self.launch + 1

        async def restart() -> None:
            self.launch += 1

        async def status() -> dict[str, Any]:
            return {"recipe": self.current, "state": "ready",
                    "launch": {"id": f"L{self.launch}", "engine_url": "http://engine"}}

        async def describe(s: dict[str, Any]) -> LaunchInfo:
            return LaunchInfo(launch_id=s["launch"]["id"], recipe=str(s["recipe"]), spec_hash="h",
                              cache_vintage="warm", cache_root="/c", engine_url="http://engine",
                              recipe_doc=self.recipes[str(s["recipe"])],
                              # issue 33: an ACCEPT needs a seen marker proving the kernel path
                              proof=ProofResult(markers={"CPU KV cache size:": True}))

        async def recipe(name: str) -> dict[str, Any] | None:
            return self.recipes[name]

        async def log(launch_id: str, offset: int) -> tuple[str, int]:
            data = self.log.encode()[offset:]
            return data.decode(), offset + len(data)

        return Control(apply=apply, restart=restart, status=status, describe=describe, recipe=recipe,
                       log=log, poll_s=0.0)


def _plan() -> Any:
    from appliance.evaluation.bench_tiers import plan_tiers

    return plan_tiers(2048, 16)


def fake_client(world: World) -> type:
    class FakeClient:
        def __init__(self, url: str, key: str | None = None) -> None:
            self.model = "m"

        async def __aenter__(self) -> FakeClient:
            return self

        async def __aexit__(self, *_: object) -> None:
            return None

        async def discover(self) -> tuple[str, int]:
            return "m", 2048

        async def tokenize(self, text: str) -> list[int]:
            return [zlib.crc32(w.encode()) % 50000 for w in text.split()]

        async def timed(self, tier: str, index: int, prompt: list[int], max_tokens: int,
                        ignore_eos: bool) -> RequestRecord:
            recipe = str(world.current)
            world.sent.append((recipe, tier, index, list(prompt), max_tokens))
            # The engine's time passes on the bench's clock (the fixture's), never the wall clock's:
            # the arms' throughput ratio stays exactly 2 on a loaded machine.
            world.now += world.delay[recipe]
            await asyncio.sleep(0)
            if world.fail_tier.get(recipe) == tier:
                return RequestRecord(
                    tier=tier, index=index, input_tokens=len(prompt), ok=False, error="HTTP 500"
                )
            out = min(max_tokens, world.natural_len.get(recipe, max_tokens))
            return RequestRecord(tier=tier, index=index, input_tokens=len(prompt), output_tokens=out,
                                 ttft_ms=5.0, tpot_ms=1.0, latency_ms=20.0, text=f"{tier}-{index}", ok=True)

        async def alive(self) -> bool:
            return True

        async def chat_answer(self, prompt: str, max_tokens: int) -> ChatAnswer:
            recipe = str(world.current)
            world.chats[recipe] += 1
            world.chat_budgets.append(max_tokens)
            answer = "I do not know" if recipe in world.wrong_answers else " ".join(world.answers[prompt])
            if recipe in world.thinks:  # a reasoning parser moved the whole answer out of the content
                return ChatAnswer(content="", reasoning=f"Let me think. {answer}", finish_reason="length")
            return ChatAnswer(content=answer, reasoning=None, finish_reason="stop")

    return FakeClient


PARAMS = BenchParams(output_tokens=16, single_stream=False, warmup=1)
OPTS = CompareOptions(accuracy_items=2)


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> World:
    return install(World(), monkeypatch)


def install(w: World, monkeypatch: pytest.MonkeyPatch) -> World:
    """The fake engine in place of the real client, and the bench's clock on the fake engine's time:
    the gate's throughput and SLA steps compare the arms on it, so a busy CI machine cannot turn the
    2× faster candidate into a "regression" (with real sleeps it once read -15 %)."""
    monkeypatch.setattr(compare_mod, "EngineClient", fake_client(w))
    monkeypatch.setattr(bench_mod, "time", SimpleNamespace(perf_counter=lambda: w.now, time=time.time))
    return w


async def test_a_clear_gain_runs_every_step_and_scores_accuracy_on_both_arms(
    world: World, tmp_path: Path
) -> None:
    store = EvalStore(tmp_path / "db.sqlite3")
    events: list[dict[str, Any]] = []
    out = await compare(world.control(), BASE, CAND, PARAMS, store, options=OPTS, progress=events.append)
    g = out.gate
    assert [s.status for s in g.steps] == [StepStatus.PASS] * 6, [(s.name, s.reasons) for s in g.steps]
    assert g.verdict is Verdict.ACCEPT
    base, cand = out.baselines[0], out.candidates[0]
    assert base.smoke is not None and cand.smoke is not None and cand.smoke.log_checked
    assert len(cand.warmup) == 3 and all(w.tier.startswith("warmup:") for w in cand.warmup)
    assert cand.settings["max_num_seqs"] == 8 and cand.settings["output_limits"] == {
        "max_tokens": 16, "ignore_eos": False}
    assert base.accuracy is not None and cand.accuracy is not None
    assert {r.kind for r in cand.accuracy.items} == set(Kind) and world.chats == {BASE: 8, CAND: 8}
    phases = [e["phase"] for e in events]
    assert phases.index("smoke") < phases.index("bench") and phases[-1] == "verdict"
    assert store.comparisons()[0]["verdict"] == "accept"
    store.close()


async def test_accuracy_is_not_run_on_a_candidate_the_throughput_steps_rejected(world: World) -> None:
    world.fail_tier[CAND] = "16-32K"
    out = await compare(world.control(), BASE, CAND, PARAMS, None, options=OPTS)
    assert out.gate.verdict is Verdict.REJECT
    assert world.chats[CAND] == 0
    acc = next(s for s in out.gate.steps if s.name == "accuracy")
    assert acc.status is StepStatus.SKIPPED


async def test_accuracy_has_the_last_word_over_a_throughput_gain(world: World) -> None:
    world.wrong_answers.add(CAND)
    out = await compare(world.control(), BASE, CAND, PARAMS, None, options=OPTS)
    assert out.gate.verdict is Verdict.REJECT
    assert out.gate.reasons[0].startswith("accuracy: accuracy drop in")


async def test_a_new_error_line_in_the_engine_log_fails_the_smoke(world: World) -> None:
    world.log += "ERROR 12-01 [core.py:1] something broke\n"
    out = await compare(world.control(), BASE, CAND, PARAMS, None, options=OPTS)
    smoke = next(s for s in out.gate.steps if s.name == "smoke")
    assert smoke.status is StepStatus.FAIL and "new error line" in smoke.reasons[0]


async def test_a_forbidden_difference_is_refused_before_anything_is_switched(world: World) -> None:
    world.recipes[CAND] = {"platform": "cpu", "engine": {"max_num_seqs": 16}}
    with pytest.raises(CompareError, match="max_num_seqs: 8 vs 16"):
        await compare(world.control(), BASE, CAND, PARAMS, None, options=OPTS)
    assert world.applied == []
    allowed = CompareOptions(accuracy_items=2, allow_diff=frozenset({"max_num_seqs"}))
    out = await compare(world.control(), BASE, CAND, PARAMS, None, options=allowed)
    assert out.gate.allowed_diffs == {"max_num_seqs": [8, 16]}


async def test_other_cards_are_never_gated_against_each_other(world: World) -> None:
    world.recipes[BASE] = {"platform": "cuda", "devices": [0], "engine": {"max_num_seqs": 8}}
    world.recipes[CAND] = {"platform": "cuda", "devices": [1], "engine": {"max_num_seqs": 8}}
    with pytest.raises(CompareError, match="different cards"):
        await compare(world.control(), BASE, CAND, PARAMS, None, options=OPTS)
    assert world.applied == []


async def test_a_small_gain_is_rerun_in_interleaved_rounds(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[int] = []

    def once(base: list[Any], cand: list[Any], th: Any) -> bool:
        asked.append(len(base))
        return len(base) < 2

    monkeypatch.setattr(compare_mod, "needs_more_rounds", once)
    out = await compare(world.control(), BASE, CAND, PARAMS, None, options=OPTS)
    assert len(out.baselines) == len(out.candidates) == 2
    assert world.applied == [BASE, CAND, BASE, CAND]  # A B A B
    assert out.baselines[1].smoke is None  # the smoke runs once, before the first measurement


@pytest.mark.parametrize("model", [{"path": "/models/other"}, {"path": "/m", "checksum": "b" * 64}])
async def test_different_weights_are_refused_unless_allowed(world: World, model: dict[str, str]) -> None:
    # Seed 004 §1: the model weights and structure come first among what must not differ.
    world.recipes[BASE] = {**world.recipes[BASE], "model": {"path": "/m", "checksum": "a" * 64}}
    world.recipes[CAND] = {**world.recipes[CAND], "model": model}
    with pytest.raises(CompareError, match=r"model: .* vs .*--allow-diff model"):
        await compare(world.control(), BASE, CAND, PARAMS, None, options=OPTS)
    assert world.applied == []
    allowed = CompareOptions(accuracy_items=2, allow_diff=frozenset({"model"}))
    out = await compare(world.control(), BASE, CAND, PARAMS, None, options=allowed)
    assert set(out.gate.allowed_diffs) == {"model"}
