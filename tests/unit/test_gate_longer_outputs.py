"""The gate's length check works both ways: longer outputs are flagged and noted as "not like for like"
too (a mutation check deleted the LONGER_OUTPUTS flag and no test noticed). What the verdict is for
a gain with longer outputs is the gate rewrite's to decide; this pins only the flag and the note.
Kept apart from test_gate.py, which that rewrite is changing; it uses that file's result builder."""

from __future__ import annotations

from appliance.evaluation.gate import Flag, decide
from tests.unit.test_gate import _result


def test_a_throughput_gain_with_longer_outputs_is_flagged_and_noted() -> None:
    base = _result("base", lens=[100] * 5)
    cand = _result("cand", lens=[150] * 5, duration_s=(9, 9, 9))  # 750/9 > 500/10: a "gain"
    g = decide(base, cand)
    assert g.score_delta is not None and g.score_delta > 0.01
    assert Flag.LONGER_OUTPUTS in g.flags and Flag.SHORTER_OUTPUTS not in g.flags
    assert any("output length changed: 2250 vs 1500 tokens" in r for r in g.reasons)


def test_the_same_lengths_raise_no_length_flag() -> None:
    g = decide(_result("base"), _result("cand"))
    assert Flag.LONGER_OUTPUTS not in g.flags and Flag.SHORTER_OUTPUTS not in g.flags
