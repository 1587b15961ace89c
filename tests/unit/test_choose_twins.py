"""A choice over eager → piecewise → graph (controller/evaluation/choose.py) with the real gate:
`DriverSeam` runs controller/evaluation/compare.py against test_compare_protocol.py's faked engine.
Once piecewise wins it is the champion, the baseline of the second gate, and a graph-mode arm: its
token-stream evidence (smoke length, length hold, accuracy) comes from its own eager twin, as the
candidate's does from its own (appliance/evaluation/eager_twin.py; seed 000 §一.6 S14d)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from appliance.evaluation.gate import Flag, StepStatus, Verdict
from controller.evaluation.choice_seam import DriverSeam
from controller.evaluation.compare import Control
from controller.evaluation.store import EvalStore
from controller.supervisor.preflight import Preflight
from tests.unit.test_choose_runner import Clock, FakeSeam, begin, rig
from tests.unit.test_compare_protocol import OPTS, PARAMS, World, install

_ENGINE = {"max_num_seqs": 8}
EAGER: dict[str, Any] = {"platform": "cpu", "model": {"path": "/m"}, "engine": {**_ENGINE, "mode": "eager"},
                         "expect": {"reproducibility": "bitwise"}}
VARIES = {"reproducibility": "varies-across-restarts"}
PIECEWISE: dict[str, Any] = {"platform": "cpu", "model": {"path": "/m"},
                             "engine": {**_ENGINE, "mode": "piecewise"}, "expect": VARIES}
GRAPH: dict[str, Any] = {"platform": "cpu", "model": {"path": "/m"}, "engine": {**_ENGINE, "mode": "graph"},
                         "expect": VARIES}


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> World:
    w = install(World(), monkeypatch)
    w.recipes = {"eager": EAGER, "eager2": EAGER, "piecewise": PIECEWISE, "graph": GRAPH}
    w.delay = {"eager": 0.04, "eager2": 0.04, "piecewise": 0.02, "graph": 0.01}  # each mode twice as fast
    w.chats = dict.fromkeys(w.recipes, 0)
    return w


class GateSeam(FakeSeam):
    """The choice's seam with the real gate (DriverSeam.gate → compare); the rest stays faked."""

    driver: DriverSeam

    async def gate(self, champion: str, candidate: str, progress: Any,
                   allow_diff: frozenset[str] = frozenset()) -> Any:
        self.gates.append((champion, candidate))
        return await self.driver.gate(champion, candidate, progress, allow_diff)


def _control(world: World) -> Control:
    async def catalogue() -> dict[str, dict[str, Any]]:
        return dict(world.recipes)

    c = world.control()
    c.catalogue = catalogue
    return c


async def _choose(tmp_path: Path, world: World) -> tuple[Any, EvalStore]:
    clock = Clock()
    seam = GateSeam(clock, {})
    evals = EvalStore(tmp_path / "evals.sqlite3")
    # The gate does not read the preflight (spec hashes come from the fake seam).
    seam.driver = DriverSeam(control=_control(world), preflight=cast(Preflight, None), evals=evals,
                             params=PARAMS, options=OPTS)
    chooser, _, _ = rig(tmp_path, seam, clock)
    record = await chooser.run(begin(chooser))
    assert seam.gates == [("eager", "piecewise"), ("piecewise", "graph")]
    return record, evals


def _second_gate(record: Any, evals: EvalStore) -> Any:
    stored = evals.comparison(record.line("graph").comparison_id)
    assert stored is not None
    return stored[1]


def _step(g: Any, name: str) -> Any:
    return next(s for s in g.steps if s.name == name)


async def test_the_second_gate_reads_the_champions_evidence_from_piecewises_own_twin(
    tmp_path: Path, world: World
) -> None:
    # graph declares its own eager twin (eager2): two different twins, a real comparison.
    world.recipes["graph"] = {**GRAPH, "expect": {**VARIES, "eager_twin": "eager2"}}
    world.wrong_answers.update({"piecewise", "graph"})  # their own text would fail the veto: never read
    world.natural_len = {"piecewise": 12, "graph": 14}  # their own lengths would fail smoke and hold
    record, evals = await _choose(tmp_path, world)
    assert record.line("piecewise").status == "won"
    g = _second_gate(record, evals)
    assert _step(g, "accuracy").evidence["sources"] == {"baseline": "eager", "candidate": "eager2"}
    assert _step(g, "smoke").evidence["length_sources"] == {"baseline": "eager", "candidate": "eager2"}
    assert _step(g, "score").evidence["length_sources"] == {"baseline": "eager", "candidate": "eager2"}
    said = "baseline: smoke length, length hold and accuracy from its eager twin eager"
    assert any(r.startswith(said) for r in g.reasons), g.reasons
    assert any(r.startswith("candidate: smoke length, length hold and accuracy from its eager twin eager2")
               for r in g.reasons)
    assert world.chats["piecewise"] == 0 and world.chats["graph"] == 0  # no graph-mode text was scored
    assert Flag.SHARED_EAGER_TWIN not in g.flags
    assert g.verdict is Verdict.ACCEPT, g.reasons
    assert (record.champion, record.line("graph").status) == ("graph", "won")


async def test_a_second_gate_whose_arms_share_one_twin_says_so_and_graph_wins_on_throughput(
    tmp_path: Path, world: World
) -> None:
    # piecewise and graph both derive the one eager recipe: the twin would be compared with itself.
    del world.recipes["eager2"]
    record, evals = await _choose(tmp_path, world)
    g = _second_gate(record, evals)
    assert _step(g, "accuracy").evidence["sources"] == {"baseline": "eager", "candidate": "eager"}
    assert Flag.SHARED_EAGER_TWIN in g.flags
    acc = _step(g, "accuracy")
    assert acc.status is StepStatus.PASS
    said = "both arms' evidence is the same eager twin's (eager): not discriminating"
    assert any(said in r for r in acc.reasons), acc.reasons
    # The expected H200 outcome: graph wins on throughput, piecewise between.
    assert g.verdict is Verdict.ACCEPT
    assert record.champion == "graph" and record.line("graph").status == "won"
