"""Each arm's token-stream evidence in the gate (appliance/evaluation/protocol.py): an arm whose text
varies across restarts reads its eager twin's, baseline and candidate alike, and two arms standing
on one and the same twin are never compared silently (the twin against itself).

Cases: neither arm graph, one arm graph (either side), both graph with different twins, both graph
sharing one twin (the second gate of eager → piecewise → graph)."""

from __future__ import annotations

from appliance.evaluation.accuracy import Kind
from appliance.evaluation.bench_result import BenchResult
from appliance.evaluation.gate import Flag, StepStatus, Verdict
from appliance.evaluation.protocol import OWN, Tokens, gate, shared_twin
from tests.unit.test_protocol import GOOD_ACC, _acc, _run, _smoke, _step

WORSE = {**GOOD_ACC, Kind.RETRIEVAL: [0.0] * 5}  # a drop of 70 points in one kind: the veto bites


def _graph_arms() -> tuple[list[BenchResult], list[BenchResult]]:
    """piecewise (baseline) and graph (candidate), both graph-mode: their own token streams are
    unusable — lengths 12 % apart, the candidate's own accuracy worse — and the candidate is faster."""
    base = [_run("piecewise", smoke=_smoke(tokens=80), lens=90, accuracy=_acc(WORSE))]
    cand = [_run("graph", seconds=(9, 9, 9), smoke=_smoke(tokens=100), lens=101, accuracy=_acc(WORSE))]
    return base, cand


def _twin(name: str, *, acc: dict[Kind, list[float]] | None = None, lens: int = 100) -> Tokens:
    run = _run(name, lens=lens, smoke=_smoke(tokens=lens), accuracy=_acc(acc or GOOD_ACC))
    why = "derived: same model, dtype, platform and sampling, mode eager"
    return Tokens(source=name, why=why, runs=[run])


# ---- shared_twin: the boundaries


def test_shared_twin_is_only_one_recipe_standing_for_both_arms() -> None:
    eager, other = _twin("eager"), _twin("eager2")
    assert shared_twin(eager, _twin("eager")) == "eager"
    assert shared_twin(eager, other) is None  # two different twins: a real comparison
    assert shared_twin(None, eager) is None and shared_twin(eager, None) is None  # one arm its own
    assert shared_twin(None, None) is None  # neither arm graph
    own = Tokens(source=OWN)
    assert shared_twin(own, own) is None  # "own" on both sides is two different recipes' own streams


# ---- neither arm graph: the ordinary gate, no twin said anywhere


def test_neither_arm_graph_reads_own_evidence_and_says_nothing_of_twins() -> None:
    base = [_run("base", smoke=_smoke(), accuracy=_acc(GOOD_ACC))]
    cand = [_run("cand", seconds=(9, 9, 9), smoke=_smoke(), accuracy=_acc(GOOD_ACC))]
    g = gate(base, cand)
    assert g.verdict is Verdict.ACCEPT, g.reasons
    assert Flag.EAGER_TWIN_EVIDENCE not in g.flags and Flag.SHARED_EAGER_TWIN not in g.flags
    acc = _step(g, "accuracy")
    assert acc.evidence["sources"] == {"baseline": OWN, "candidate": OWN}
    # Two arms' own evidence is not "the same": no claim that the veto cannot tell them apart.
    assert not any("same" in r or "cannot tell" in r for r in acc.reasons), acc.reasons


# ---- one arm graph


def test_a_graph_baseline_reads_its_own_twin_and_an_eager_candidate_its_own_stream() -> None:
    base, _ = _graph_arms()
    cand = [_run("eager", seconds=(9, 9, 9), smoke=_smoke(tokens=100), lens=100, accuracy=_acc(GOOD_ACC))]
    g = gate(base, cand, base_tokens=_twin("eager-twin"))
    # The baseline's own lengths (80 / 90) and accuracy would fail the smoke, hold the score and
    # make the veto vacuous-or-inverted: its twin's (100, GOOD_ACC) are read instead.
    assert g.verdict is Verdict.ACCEPT, g.reasons
    assert _step(g, "smoke").evidence["length_sources"] == {"baseline": "eager-twin", "candidate": OWN}
    assert _step(g, "smoke").evidence["own_output_tokens"]["baseline"] == 80  # shown, not gated
    assert _step(g, "score").evidence["length_sources"]["baseline"] == "eager-twin"
    assert _step(g, "accuracy").evidence["sources"] == {"baseline": "eager-twin", "candidate": OWN}
    assert any(r.startswith("baseline: smoke length, length hold and accuracy from its eager twin eager-twin")
               for r in g.reasons)
    assert Flag.SHARED_EAGER_TWIN not in g.flags


def test_a_graph_baselines_twin_is_the_accuracy_reference() -> None:
    base, _ = _graph_arms()
    cand = [_run("eager", seconds=(9, 9, 9), smoke=_smoke(tokens=100), lens=100, accuracy=_acc(WORSE))]
    g = gate(base, cand, base_tokens=_twin("eager-twin"))
    assert _step(g, "accuracy").status is StepStatus.FAIL  # measured against the twin's GOOD_ACC
    assert g.verdict is Verdict.REJECT


# ---- both arms graph, different twins: each arm's evidence from its own twin


def test_both_graph_arms_with_different_twins_compare_the_twins() -> None:
    base, cand = _graph_arms()
    g = gate(base, cand, base_tokens=_twin("eager-a"), cand_tokens=_twin("eager-b"))
    assert g.verdict is Verdict.ACCEPT, g.reasons
    assert _step(g, "accuracy").evidence["sources"] == {"baseline": "eager-a", "candidate": "eager-b"}
    assert _step(g, "smoke").evidence["output_tokens"] == {"baseline": 100, "candidate": 100}
    assert Flag.SHARED_EAGER_TWIN not in g.flags
    worse = gate(base, cand, base_tokens=_twin("eager-a"), cand_tokens=_twin("eager-b", acc=WORSE))
    assert _step(worse, "accuracy").status is StepStatus.FAIL  # the candidate's twin dropped: vetoed


# ---- both arms graph, one shared twin: not discriminating, said and flagged; the throughput decides


def test_a_shared_twin_is_said_in_every_token_step_and_the_throughput_decides() -> None:
    base, cand = _graph_arms()
    twin = _twin("eager")
    g = gate(base, cand, base_tokens=twin, cand_tokens=twin)
    assert Flag.SHARED_EAGER_TWIN in g.flags and Flag.EAGER_TWIN_EVIDENCE in g.flags
    smoke, score, acc = _step(g, "smoke"), _step(g, "score"), _step(g, "accuracy")
    assert smoke.evidence["shared_twin"] == "eager" and score.evidence["shared_twin"] == "eager"
    assert any("both arms' smoke length is the same eager twin's (eager): not discriminating" in r
               for r in smoke.reasons)
    assert any("length hold is the same eager twin's (eager): not discriminating" in r for r in score.reasons)
    # The throughput steps passed on the graph arms' own figures. Both arms' quality is the one
    # twin's by the seed's rule (as for a graph candidate against its own eager twin), so the accuracy
    # step passes on it, says it could not tell the arms apart, and the throughput decides.
    assert all(_step(g, s).status is StepStatus.PASS for s in ("proof", "smoke", "first-five", "score"))
    assert acc.status is StepStatus.PASS
    assert any("both arms' evidence is the same eager twin's (eager): not discriminating" in r
               for r in acc.reasons)
    assert g.verdict is Verdict.ACCEPT


def test_a_shared_twin_with_identical_figures_is_flagged_not_hidden() -> None:
    # The same twin's runs on both sides: every length delta is 0 and no accuracy item flips. The
    # pass must say where it came from: the flag and the step's note, never a silent clean PASS.
    base, cand = _graph_arms()
    twin = _twin("eager")
    g = gate(base, cand, base_tokens=twin, cand_tokens=Tokens(source="eager", why="declared", runs=twin.runs))
    assert _step(g, "accuracy").evidence["flipped"] == []
    acc = _step(g, "accuracy")
    assert acc.status is StepStatus.PASS and Flag.SHARED_EAGER_TWIN in g.flags
    assert any("not discriminating" in r for r in acc.reasons)


def test_a_shared_twin_when_accuracy_did_not_run_still_says_the_lengths_are_vacuous() -> None:
    base, cand = _graph_arms()
    runs = [r.model_copy(update={"accuracy": None}) for r in _twin("eager").runs]
    twin = Tokens(source="eager", why="derived", runs=runs)
    g = gate(base, cand, base_tokens=twin, cand_tokens=twin, accuracy_why_not="not run: --no-accuracy")
    assert _step(g, "accuracy").status is StepStatus.SKIPPED
    assert Flag.SHARED_EAGER_TWIN in g.flags and Flag.ACCURACY_NOT_RUN in g.flags
