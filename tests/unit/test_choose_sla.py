"""A choice with the operator's latency bound (`--sla`): the runner (controller/evaluation/choose.py)
over the declared seam, whose gates report each arm's breaches; and the real gate (DriverSeam →
compare, test_compare_protocol's faked engine) measuring them from the arms' runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from appliance.evaluation.sla_bound import SlaBound
from appliance.evaluation.tournament import markdown, promotion_refusal, sla_of
from controller.evaluation.choice_seam import DriverSeam
from controller.evaluation.choose import GateOutcome, Progress
from controller.evaluation.store import EvalStore
from controller.supervisor.preflight import Preflight
from tests.unit import test_choose_twins as _twins
from tests.unit.test_choose_runner import Clock, FakeSeam, begin, rig
from tests.unit.test_compare_protocol import OPTS, PARAMS, World

world, _control = _twins.world, _twins._control  # the faked engine's world (a fixture) and its control
BOUND = {"tpot_p99_ms": 80.0}
EXTRA = {"settings": {"sla": BOUND}}  # where a choice keeps its bound: the body as asked


@dataclass
class SlaSeam(FakeSeam):
    """FakeSeam whose gates also say each arm's breaches of the bound (none listed: it held)."""

    over: dict[str, list[str]] = field(default_factory=dict)

    async def gate(self, champion: str, candidate: str, progress: Progress,
                   allow_diff: frozenset[str] = frozenset()) -> GateOutcome:
        out = await super().gate(champion, candidate, progress, allow_diff)
        return GateOutcome(out.verdict, out.comparison_id, out.reasons,
                           {champion: self.over.get(champion, []), candidate: self.over.get(candidate, [])})


async def test_a_gate_won_over_the_bound_does_not_make_a_champion(tmp_path: Path) -> None:
    clock = Clock()
    seam = SlaSeam(clock, {"piecewise": "accept", "graph": "accept"},
                   over={"piecewise": ["P99 TPOT in 16-32K: 95.0 ms > 80 ms"]})
    chooser, store, _ = rig(tmp_path, seam, clock)
    record = await chooser.run(begin(chooser, extra=EXTRA))
    # piecewise won its gate but broke the bound: graph is then gated against the baseline, not it
    assert seam.gates == [("eager", "piecewise"), ("eager", "graph")]
    pw = record.line("piecewise")
    assert (pw.status, pw.verdict) == ("lost", "accept")
    said = "won its gate against eager (accept) but breaks the SLA: P99 TPOT in 16-32K: 95.0 ms > 80 ms"
    assert pw.why == said
    assert pw.sla == ["P99 TPOT in 16-32K: 95.0 ms > 80 ms"]
    assert (record.champion, record.line("graph").status, record.line("graph").sla) == ("graph", "won", [])
    assert record.line("eager").sla == []  # the baseline measured in its first gate: it held
    assert promotion_refusal(record) is None
    md = markdown(record)
    assert "- SLA (--sla): P99 TPOT ≤ 80 ms in every tier; the champion holds it" in md
    assert store.get(record.id) == record  # the breaches are stored with the record


async def test_a_baseline_over_the_bound_is_named_and_not_promoted(tmp_path: Path) -> None:
    clock = Clock()
    over = ["P99 TPOT in 4-8K: 120.0 ms > 80 ms"]
    seam = SlaSeam(clock, {"piecewise": "reject", "graph": "hold"},
                   over={"eager": over, "graph": ["P99 TPOT in 4-8K: 81.0 ms > 80 ms"]})
    chooser, _, _ = rig(tmp_path, seam, clock)
    record = await chooser.run(begin(chooser, extra=EXTRA, promote=True))
    assert record.champion == "eager" and record.line("eager").sla == over
    assert record.line("piecewise").sla == [] and record.line("piecewise").status == "lost"
    why = promotion_refusal(record)
    assert why is not None and "eager breaks the SLA asked for this choice" in why and over[0] in why
    assert record.promoted is None and record.restored == "eager"
    assert "not promoted: eager breaks the SLA" in (record.ended_why or "")
    md = markdown(record)
    assert f"the champion breaks it: {over[0]}" in md
    assert f"; over the SLA: {over[0]}" in md  # the baseline's row says it too


async def test_without_a_bound_nothing_is_measured_against_one(tmp_path: Path) -> None:
    clock = Clock()
    seam = FakeSeam(clock, {"piecewise": "accept", "graph": "accept"})
    chooser, _, _ = rig(tmp_path, seam, clock)
    record = await chooser.run(begin(chooser))
    assert sla_of(record) is None and all(x.sla is None for x in record.lines)
    assert "SLA" not in markdown(record)


async def _real_gate(tmp_path: Path, world: World, bound: SlaBound) -> Any:
    class GateSeam(FakeSeam):
        async def gate(self, champion: str, candidate: str, progress: Any,
                       allow_diff: frozenset[str] = frozenset()) -> GateOutcome:
            self.gates.append((champion, candidate))
            return await driver.gate(champion, candidate, progress, allow_diff)

    clock = Clock()
    seam = GateSeam(clock, {})
    driver = DriverSeam(control=_control(world), preflight=cast(Preflight, None),
                        evals=EvalStore(tmp_path / "evals.sqlite3"), params=PARAMS, options=OPTS, sla=bound)
    chooser, _, _ = rig(tmp_path, seam, clock)
    return await chooser.run(begin(chooser, extra={"settings": {"sla": bound.model_dump(exclude_none=True)}}))


async def test_the_real_gate_measures_each_arm_against_the_bound(tmp_path: Path, world: World) -> None:
    # A bound nothing can hold (TTFT within a microsecond): every arm over it, so no candidate's win
    # counts and the baseline stays champion, named as over the bound.
    record = await _real_gate(tmp_path / "tight", world, SlaBound(ttft_p99_ms=0.001))
    assert record.line("piecewise").verdict == "accept" and record.line("piecewise").status == "lost"
    assert all(x.sla and all("P99 TTFT in" in b for b in x.sla) for x in record.lines
               if x.recipe in ("eager", "piecewise", "graph"))
    assert record.champion == "eager" and promotion_refusal(record) is not None
    # A bound everything holds: the same choice as without one, each measured arm's line says [].
    record = await _real_gate(tmp_path / "loose", world, SlaBound(ttft_p99_ms=3_600_000, tpot_p99_ms=60_000))
    assert record.champion == "graph" and [record.line(r).sla for r in ("eager", "piecewise", "graph")] == [
        [], [], []]


def test_the_cli_refuses_a_bad_sla_with_exit_2_before_asking_the_controller() -> None:
    from typer.testing import CliRunner

    from controller.cli import main

    if not main.app.registered_commands:
        main._register()
    out = CliRunner().invoke(main.app, ["choose", "--sla", "latency=200", "--api", "http://127.0.0.1:9"])
    assert out.exit_code == 2 and "--sla: unknown bound 'latency' (known: ttft, tpot)" in out.output


def test_the_cli_plan_says_the_sla_and_what_it_does(capsys: Any) -> None:
    from controller.cli.choose_cmd import print_plan
    from tests.unit.test_choose_sweep import _plan

    record = _plan().model_copy(update={"settings": {"sla": {"ttft_p99_ms": 2000.0}}})
    print_plan(record.model_dump(mode="json"))
    out = capsys.readouterr().out
    assert ("SLA: P99 TTFT ≤ 2000 ms in every tier — a candidate over it does not become champion, a "
            "champion over it is not promoted") in out
    print_plan(_plan().model_dump(mode="json"))
    assert "SLA" not in capsys.readouterr().out
