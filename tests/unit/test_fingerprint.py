"""Reproducibility fingerprint: hashing, divergence, classification, declared-vs-measured."""

from __future__ import annotations

from appliance.evaluation.fingerprint import (
    Comparison,
    Fingerprint,
    Measured,
    check_declared,
    classify,
    compare_runs,
    first_divergence,
    set_hash,
    stream_hash,
)

SAME = Comparison(identical=True)


def _fp(
    repeats: Comparison = SAME, batch: Comparison = SAME, restarts: Comparison | None = SAME
) -> Fingerprint:
    return Fingerprint(
        prompt_set="ps-v1",
        max_tokens=32,
        max_num_seqs=4,
        concurrency=4,
        serial_set_hash="a",
        concurrent_set_hash="b",
        stream_hashes=["x"],
        repeats=repeats,
        batch=batch,
        restarts=restarts,
        restart_reference="L0" if restarts else None,
    )


def test_hashes_are_stable_and_order_sensitive() -> None:
    assert stream_hash([1, 2, 3]) == stream_hash([1, 2, 3])
    assert stream_hash([1, 2, 3]) != stream_hash([3, 2, 1])
    assert stream_hash([12, 3]) != stream_hash([1, 23])
    assert set_hash(["a", "b"]) != set_hash(["b", "a"])
    assert len(stream_hash([])) == 64


def test_first_divergence_index() -> None:
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 5, 6, 9]) == 6  # S14d: diverged at token 6
    assert first_divergence([1, 2], [1, 2, 3]) == 2  # a shorter stream diverges where it ends


def test_compare_runs_reports_each_differing_prompt() -> None:
    c = compare_runs([[1, 2], [3, 4], [5, 6]], [[1, 2], [3, 9], [0, 6]])
    assert not c.identical and c.differing == {1: 1, 2: 0} and c.first_divergence == 0
    assert compare_runs([[1]], [[1]]).identical


def test_classification_takes_the_strongest_variation() -> None:
    differ = Comparison(identical=False, differing={0: 5})
    assert classify(SAME, SAME, SAME) is Measured.BITWISE
    assert classify(SAME, differ, SAME) is Measured.VARIES_ACROSS_BATCH  # eager B: conc=2 vs serial
    assert classify(SAME, differ, differ) is Measured.VARIES_ACROSS_RESTARTS  # graph C
    assert classify(SAME, SAME, differ) is Measured.VARIES_ACROSS_RESTARTS
    assert classify(differ, SAME, SAME) is Measured.NONDETERMINISTIC
    assert classify(SAME, SAME, None) is Measured.BITWISE  # restarts not measured (yet)


def test_declared_bitwise_but_varies_across_restarts_is_a_mismatch() -> None:
    check = check_declared("bitwise", _fp(restarts=Comparison(identical=False, differing={3: 11})))
    assert check.mismatch and check.measured is Measured.VARIES_ACROSS_RESTARTS
    assert "first divergent token 11" in check.finding and "L0" in check.finding


def test_declared_bitwise_with_batch_variation_only_is_not_a_mismatch() -> None:
    check = check_declared("bitwise", _fp(batch=Comparison(identical=False, differing={0: 6})))
    assert not check.mismatch and check.measured is Measured.VARIES_ACROSS_BATCH


def test_declared_bitwise_without_a_restart_comparison_is_unproven_not_contradicted() -> None:
    check = check_declared("bitwise", _fp(restarts=None))
    assert not check.mismatch and not check.restarts_measured and "not measured yet" in check.finding


def test_declared_bitwise_with_nondeterministic_repeats_is_a_mismatch() -> None:
    assert check_declared("bitwise", _fp(repeats=Comparison(identical=False, differing={0: 2}))).mismatch


def test_declared_varies_but_measured_bitwise_is_conservative_not_a_mismatch() -> None:
    check = check_declared("varies-across-restarts", _fp())
    assert not check.mismatch and "conservative" in check.finding
