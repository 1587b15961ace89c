"""The choice runner (controller/evaluation/choose.py) driving whole tournaments through a fake
`ChoiceSeam` (the declared seam: it returns verdicts, fails starts, edits a recipe), with the real
choice store (SQLite) and the real metrics registry."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from appliance.evaluation.tournament import (
    DEFAULT_BENCH_S,
    DEFAULT_READY_S,
    ArmCost,
    ChoiceInputError,
    ChoiceRecord,
    Entry,
)
from controller.evaluation.choice_store import ChoiceStore
from controller.evaluation.choose import (
    ArmFailed,
    ChoiceBusy,
    Chooser,
    GateError,
    GateOutcome,
    Progress,
)
from controller.metrics import ControllerMetrics
from tests.unit.test_choose_tournament import OLD_BUDGET_WHY, old_record

COST = ArmCost(cold_ready_s=100, warm_ready_s=20, bench_s=60, from_history=True)  # 260 s an arm
ENTRIES = [
    Entry(recipe="eager", mode="eager", spec_hash="h-eager", admitted=True, admission="admit", margin_gib=9),
    Entry(recipe="piecewise", mode="graph", spec_hash="h-piecewise", admitted=True, admission="admit",
          margin_gib=6),
    Entry(recipe="graph", mode="graph", spec_hash="h-graph", admitted=True, admission="admit", margin_gib=4),
    Entry(recipe="huge", mode="graph", spec_hash=None, admitted=False, admission="refuse",
          reason="admission: predicted peak exceeds RAM + swap"),
]


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeSeam:
    """Verdicts by candidate; a start that fails; a spec hash that changes; each gate costs `step` s."""

    clock: Clock
    verdicts: dict[str, str]
    fail_start: set[str] = field(default_factory=set)
    hashes: dict[str, str | None] = field(default_factory=dict)
    step: float = 100.0
    serving_now: str | None = "eager"
    gates: list[tuple[str, str]] = field(default_factory=list)
    allowed: list[frozenset[str]] = field(default_factory=list)  # each gate's allow_diff
    switches: list[str] = field(default_factory=list)
    block: asyncio.Event | None = None  # a gate waits on it (a choice caught mid-gate)

    async def gate(
        self, champion: str, candidate: str, progress: Progress, allow_diff: frozenset[str] = frozenset()
    ) -> GateOutcome:
        self.gates.append((champion, candidate))
        self.allowed.append(allow_diff)
        if self.block is not None:
            await self.block.wait()
        self.clock.now += self.step
        self.serving_now = candidate
        if candidate in self.fail_start:
            raise ArmFailed(candidate, f"{candidate} failed to start: cuda_oom")
        if candidate not in self.verdicts:
            raise GateError("no tier fits")
        return GateOutcome(self.verdicts[candidate], f"cmp-{candidate}", [f"{candidate} judged"])

    async def spec_hash(self, recipe: str) -> str | None:
        return self.hashes.get(recipe, f"h-{recipe}")

    async def serving(self) -> str | None:
        return self.serving_now

    async def switch_to(self, recipe: str) -> None:
        self.switches.append(recipe)
        self.serving_now = recipe


def rig(tmp_path: Path, seam: FakeSeam, clock: Clock) -> tuple[Chooser, ChoiceStore, ControllerMetrics]:
    store = ChoiceStore(tmp_path / "appliance.sqlite3")
    metrics = ControllerMetrics()
    return Chooser(store, seam, metrics=metrics, clock=clock), store, metrics


def begin(chooser: Chooser, **kw: object) -> ChoiceRecord:
    args: dict[str, object] = dict(platform="cuda", pattern="*", baseline=None,
                                   costs={e.recipe: COST for e in ENTRIES}, budget_s=None,
                                   serving_before="eager")
    args.update(kw)
    return chooser.begin(list(ENTRIES), **args)  # type: ignore[arg-type]


def statuses(record: ChoiceRecord) -> dict[str, str]:
    return {x.recipe: x.status for x in record.lines}


async def test_a_whole_tournament_champion_changes_and_the_host_goes_back(tmp_path: Path) -> None:
    clock = Clock()
    seam = FakeSeam(clock, {"piecewise": "accept", "graph": "accept"})
    chooser, store, metrics = rig(tmp_path, seam, clock)
    record = await chooser.run(begin(chooser))
    # the seed's order: eager baseline, then the compiled modes by margin; each against the champion
    assert seam.gates == [("eager", "piecewise"), ("piecewise", "graph")]
    assert (record.state, record.champion, record.champion_verdict) == ("done", "graph", "accept")
    assert statuses(record) == {"eager": "baseline", "piecewise": "won", "graph": "won", "huge": "refused"}
    assert record.line("graph").comparison_id == "cmp-graph" and record.line("graph").against == "piecewise"
    assert seam.switches == ["eager"] and record.restored == "eager" and record.promoted is None
    assert store.get(record.id) == record
    assert metrics.value("appliance_choice_candidates_total", {"outcome": "accept"}) == 2
    assert metrics.value("appliance_choice_runs_total", {"outcome": "done"}) == 1
    assert metrics.value("appliance_choice_duration_seconds") == 200


async def test_a_failed_start_is_recorded_with_its_diagnosis_and_skipped_not_retried(tmp_path: Path) -> None:
    clock = Clock()
    seam = FakeSeam(clock, {"graph": "hold"}, fail_start={"piecewise"})
    chooser, _, metrics = rig(tmp_path, seam, clock)
    record = await chooser.run(begin(chooser))
    assert seam.gates == [("eager", "piecewise"), ("eager", "graph")]
    assert record.line("piecewise").status == "failed-start"
    assert "cuda_oom" in record.line("piecewise").why
    assert record.champion == "eager" and record.line("graph").status == "lost"
    assert metrics.value("appliance_choice_candidates_total", {"outcome": "failed-start"}) == 1


async def test_the_champion_failing_its_start_ends_the_choice_with_a_clear_record(tmp_path: Path) -> None:
    clock = Clock()
    seam = FakeSeam(clock, {})

    async def champion_down(champion: str, candidate: str, progress: Progress,
                            allow_diff: frozenset[str] = frozenset()) -> GateOutcome:
        raise ArmFailed(champion, f"{champion} failed to start: engine exited")

    seam.gate = champion_down  # type: ignore[method-assign]
    chooser, _, _ = rig(tmp_path, seam, clock)
    record = await chooser.run(begin(chooser))
    assert record.state == "failed" and "eager failed to start" in (record.ended_why or "")
    assert record.line("piecewise").status == "error" and record.line("graph").status == "planned"


async def test_the_budget_stops_with_the_champion_so_far(tmp_path: Path) -> None:
    clock = Clock()
    seam = FakeSeam(clock, {"piecewise": "accept", "graph": "accept"}, step=400.0)  # slower than planned
    chooser, _, metrics = rig(tmp_path, seam, clock)
    record = await chooser.run(begin(chooser, budget_s=600.0))
    assert seam.gates == [("eager", "piecewise")]  # 400 s spent + 260 s expected > 600 s
    assert (record.state, record.champion) == ("stopped-budget", "piecewise")
    assert record.line("graph").status == "not-tried" and record.line("graph").why.startswith("budget: 400 s")
    assert metrics.value("appliance_choice_runs_total", {"outcome": "stopped-budget"}) == 1


# A fresh host: no launch history, so each arm's ETA is the defaults' 2,100 s; `--budget 40m`. By the
# ETAs the second candidate would not fit (2,100 + 2,100 s > 2,400 s); the plan still has it planned.
FRESH = ArmCost(cold_ready_s=DEFAULT_READY_S, warm_ready_s=DEFAULT_READY_S, bench_s=DEFAULT_BENCH_S,
                from_history=False)


def fresh_host(tmp_path: Path, gate_s: float) -> tuple[Chooser, FakeSeam, ChoiceRecord]:
    clock = Clock()
    seam = FakeSeam(clock, {"piecewise": "accept", "graph": "accept"}, step=gate_s)
    chooser, _, _ = rig(tmp_path, seam, clock)
    record = begin(chooser, costs={e.recipe: FRESH for e in ENTRIES}, budget_s=2400.0)
    assert statuses(record)["graph"] == "planned" and "it may not fit" in record.line("graph").why
    return chooser, seam, record


async def test_a_first_gate_faster_than_its_eta_leaves_time_and_the_second_candidate_is_gated(
    tmp_path: Path,
) -> None:
    chooser, seam, record = fresh_host(tmp_path, gate_s=173.0)  # the H200's graph gate
    done = await chooser.run(record)
    assert seam.gates == [("eager", "piecewise"), ("piecewise", "graph")]  # 173 + 2100 s ≤ 2400 s
    assert (done.state, done.champion) == ("done", "graph")
    assert statuses(done) == {"eager": "baseline", "piecewise": "won", "graph": "won", "huge": "refused"}


async def test_a_first_gate_slower_than_that_leaves_the_second_not_tried_with_the_time_spent(
    tmp_path: Path,
) -> None:
    chooser, seam, record = fresh_host(tmp_path, gate_s=400.0)
    stopped = await chooser.run(record)
    assert seam.gates == [("eager", "piecewise")]  # 400 + 2100 s > 2400 s
    assert (stopped.state, stopped.champion) == ("stopped-budget", "piecewise")
    assert stopped.line("graph").status == "not-tried"
    assert stopped.line("graph").why == "budget: 400 s of 2400 s spent before its turn"


async def test_an_old_running_record_resumes_and_its_plan_time_budget_line_stays_not_tried(
    tmp_path: Path,
) -> None:
    record = old_record("running")
    graph = record.line("cuda-smollm2-graph")
    clock = Clock(record.started_at + 100.0)
    seam = FakeSeam(clock, {graph.recipe: "accept"}, hashes={graph.recipe: graph.spec_hash},
                    serving_now=record.baseline)
    chooser, store, _ = rig(tmp_path, seam, clock)
    assert store.claim(record) is None  # as the earlier version left it in the store
    task = chooser.resume()
    assert task is not None
    done = await task
    assert seam.gates == [(record.baseline, graph.recipe)]  # piecewise is not revived
    assert (done.state, done.champion) == ("done", graph.recipe)
    assert (done.line("cuda-smollm2-piecewise").status, done.line("cuda-smollm2-piecewise").why) == (
        "not-tried", OLD_BUDGET_WHY)


async def test_a_recipe_edited_during_the_choice_is_marked_stale_not_run(tmp_path: Path) -> None:
    clock = Clock()
    seam = FakeSeam(clock, {"piecewise": "accept", "graph": "accept"}, hashes={"graph": "h-graph-EDITED"})
    chooser, _, _ = rig(tmp_path, seam, clock)
    record = await chooser.run(begin(chooser))
    assert seam.gates == [("eager", "piecewise")]
    assert record.line("graph").status == "stale"
    assert "h-graph → h-graph-EDITED" in record.line("graph").why
    assert record.champion == "piecewise"


async def test_two_choices_cannot_run_at_once(tmp_path: Path) -> None:
    clock = Clock()
    seam = FakeSeam(clock, {"piecewise": "accept", "graph": "accept"})
    chooser, store, _ = rig(tmp_path, seam, clock)
    first = begin(chooser)
    with pytest.raises(ChoiceBusy, match=first.id):
        begin(chooser)
    # another process's chooser on the same file is refused too (the claim is one transaction)
    other = Chooser(ChoiceStore(store.path), seam, clock=clock)
    with pytest.raises(ChoiceBusy):
        begin(other)
    await chooser.run(first)
    assert begin(chooser).id != first.id  # once it ended, a new one may start


async def test_resume_after_a_restart_continues_from_the_next_candidate(tmp_path: Path) -> None:
    clock = Clock()
    seam = FakeSeam(clock, {"piecewise": "accept", "graph": "reject"})
    chooser, store, _ = rig(tmp_path, seam, clock)
    record = begin(chooser)
    seam.block = asyncio.Event()
    task = chooser.start(record)
    while not seam.gates:  # the first gate is under way
        await asyncio.sleep(0)
    task.cancel()  # the controller stops mid-gate
    with pytest.raises(asyncio.CancelledError):
        await task
    saved = store.running()
    assert saved is not None and saved.line("piecewise").status == "running"
    # a new controller: a new store handle and chooser on the same file
    seam2 = FakeSeam(clock, {"piecewise": "accept", "graph": "reject"})
    chooser2 = Chooser(ChoiceStore(store.path), seam2, clock=clock)
    resumed = chooser2.resume()
    assert resumed is not None
    done = await resumed
    assert seam2.gates == [("eager", "piecewise"), ("piecewise", "graph")]  # the cut gate runs again
    assert (done.state, done.champion) == ("done", "piecewise")
    assert done.line("graph").status == "lost"
    assert Chooser(ChoiceStore(store.path), seam2, clock=clock).resume() is None  # nothing left to resume


async def test_promote_applies_the_champion_but_not_one_pending_the_full_run(tmp_path: Path) -> None:
    clock = Clock()
    seam = FakeSeam(clock, {"piecewise": "accept", "graph": "hold"})
    chooser, _, _ = rig(tmp_path, seam, clock)
    record = await chooser.run(begin(chooser, promote=True))
    assert record.promoted == "piecewise" and seam.serving_now == "piecewise"
    assert (record.promoted_via, record.promoted_at) == ("choose --promote", clock.now)

    seam = FakeSeam(clock, {"piecewise": "accept-pending-full", "graph": "hold"})
    chooser, _, _ = rig(tmp_path / "b", seam, clock)
    record = await chooser.run(begin(chooser, promote=True))
    assert record.champion == "piecewise" and record.promoted is None and record.restored == "eager"
    assert "needs the full run" in (record.ended_why or "")


async def test_bad_input_is_refused_before_anything_runs_and_none_admitted_is_counted(tmp_path: Path) -> None:
    clock = Clock()
    seam = FakeSeam(clock, {})
    chooser, store, metrics = rig(tmp_path, seam, clock)
    with pytest.raises(ChoiceInputError, match="matches no recipe"):
        begin(chooser, pattern="nothing-*")
    with pytest.raises(ChoiceInputError, match="refused on this host"):
        begin(chooser, baseline="huge")
    with pytest.raises(ChoiceInputError, match="too small for one arm"):
        begin(chooser, budget_s=10.0)
    assert store.list() == [] and seam.gates == []
    assert metrics.value("appliance_choice_runs_total", {"outcome": "none-admitted"}) == 0
    with pytest.raises(ChoiceInputError, match="no recipe is admitted"):
        chooser.begin([ENTRIES[3]], platform="cuda", pattern="*", baseline=None, costs={}, budget_s=None,
                      serving_before=None)
    assert metrics.value("appliance_choice_runs_total", {"outcome": "none-admitted"}) == 1
