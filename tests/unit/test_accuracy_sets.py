"""The offline accuracy sets (DOMAIN §7: seed 004's four kinds, seed 003's 3-point veto): generated
deterministically with exact answers, scored per item, sized by the tiers' scaling rule."""

from __future__ import annotations

import pytest

from appliance.evaluation.accuracy import (
    AccuracyResult,
    ItemResult,
    Kind,
    build_set,
    compare_accuracy,
    context_words,
    normalize,
    score_item,
    set_digest,
    token_f1,
)
from appliance.evaluation.arm_settings import ArmsDiffer, card_mismatch, cards_of, check, settings_of
from appliance.evaluation.bench_tiers import plan_tiers
from controller.evaluation.accuracy_run import set_sizes


def test_the_set_is_the_same_on_every_call_and_differs_by_seed() -> None:
    one, two = build_set(300, 600), build_set(300, 600)
    assert [i.model_dump() for i in one] == [i.model_dump() for i in two]
    assert set_digest(one) == set_digest(two) != set_digest(build_set(300, 600, seed="seed-1"))
    assert [i.kind for i in one].count(Kind.RETRIEVAL) == 5 and len(one) == 20


def test_every_exact_answer_is_in_its_prompt() -> None:
    for item in build_set(300, 600):
        if item.kind is Kind.SUMMARIZATION:
            for sentence in item.answers[0].split(". "):
                assert sentence.rstrip(".") in item.prompt
        else:
            assert all(a in item.prompt for a in item.answers), item.kind


def test_the_aggregation_top_three_are_really_the_most_frequent() -> None:
    for item in build_set(300, 2000):
        if item.kind is Kind.AGGREGATION:
            entries = [line for line in item.prompt.splitlines() if line.startswith("Entry")]
            keywords = {line.rsplit("keyword ", 1)[1].rstrip(".") for line in entries}
            counts = {kw: item.prompt.count(f"keyword {kw}.") for kw in keywords}
            ranked = sorted(counts, key=lambda k: -counts[k])
            assert ranked[:3] == item.answers
            assert counts[ranked[2]] > counts[ranked[3]]


def test_sizes_follow_the_tier_scaling_rule() -> None:
    cpu = plan_tiers(2048, 64)  # the CPU recipe's context
    short, long = set_sizes(cpu)
    t0, t1 = cpu.tiers[0], cpu.tiers[1]
    assert (short, long) == ((t0.lo + t0.hi) // 2, (t1.lo + t1.hi) // 2)
    assert long < 2048 - 96
    full = plan_tiers(40000, 64)
    assert set_sizes(full) == (6144, 12288)  # the seed's tiers as they are
    longest = max(len(i.prompt.split()) for i in build_set(*set_sizes(cpu)) if i.kind is Kind.RETRIEVAL)
    assert longest <= context_words(long) + 80  # words ≤ tokens: the prompt fits the context


@pytest.mark.parametrize(
    ("kind_index", "output", "score"),
    [
        (0, "The answer is {a0}.", 1.0),
        (0, "Nowhere", 0.0),
        (2, "{a0}, {a1}", 2 / 3),
        (3, "{a0} {a1} {a2}", 1.0),
    ],
)
def test_scoring_by_kind(kind_index: int, output: str, score: float) -> None:
    items = build_set(300, 600, n=1)
    item = items[kind_index]
    text = output.format(**{f"a{i}": a for i, a in enumerate(item.answers)})
    assert score_item(item, text) == pytest.approx(score)


def test_summaries_are_scored_with_rouge_l_from_the_package() -> None:
    item = build_set(300, 600, n=1)[1]
    assert item.kind is Kind.SUMMARIZATION
    assert score_item(item, item.answers[0]) == pytest.approx(1.0)
    assert 0 < score_item(item, item.answers[0].split(". ")[0]) < 1
    assert score_item(item, "zebra") == 0.0


def test_answer_normalisation_and_f1_are_hotpotqa_style() -> None:
    assert normalize("The  Oslo!") == "oslo"
    assert token_f1("in the city of Oslo", "Oslo") == pytest.approx(2 * (1 / 4) / (1 / 4 + 1))


def test_flipped_items_and_per_kind_drops() -> None:
    base = AccuracyResult(context_tokens=10, items=[
        ItemResult(kind=Kind.MULTIHOP_QA, index=0, score=1.0, output="Oslo"),
        ItemResult(kind=Kind.MULTIHOP_QA, index=1, score=0.0, output="?"),
    ])
    cand = AccuracyResult(context_tokens=10, items=[
        ItemResult(kind=Kind.MULTIHOP_QA, index=0, score=0.0, output="Bergen"),
        ItemResult(kind=Kind.MULTIHOP_QA, index=1, score=0.0, output="?"),
    ])
    d = compare_accuracy(base, cand)
    assert d.drops == {"multihop_qa": 50.0}
    assert d.flipped == [{"kind": "multihop_qa", "index": 0, "baseline_score": 1.0, "candidate_score": 0.0,
                          "baseline_output": "Oslo", "candidate_output": "Bergen"}]


# ---- forbidden differences and cards (DOMAIN §7, seed 004 §1)


def _recipe(**engine: object) -> dict[str, object]:
    return {"platform": "gfx906", "devices": [0, 1], "engine": engine}


def test_arms_differing_in_a_forbidden_field_are_refused_naming_the_field() -> None:
    b = settings_of(_recipe(max_num_seqs=8), output_tokens=64, ignore_eos=False)
    c = settings_of(_recipe(max_num_seqs=16), output_tokens=64, ignore_eos=False)
    with pytest.raises(ArmsDiffer, match=r"max_num_seqs: 8 vs 16.*--allow-diff max_num_seqs"):
        check(b, c)
    assert check(b, c, {"max_num_seqs"}) == {"max_num_seqs": [8, 16]}
    with pytest.raises(ArmsDiffer, match="not a field"):
        check(b, c, {"max_num_seq"})
    hot = _recipe(override_generation_config={"temperature": 0.7})
    s1 = settings_of(hot, output_tokens=64, ignore_eos=False)
    with pytest.raises(ArmsDiffer, match="sampling"):
        check(settings_of(_recipe(), output_tokens=64, ignore_eos=False), s1)


def test_other_cards_are_a_mismatch() -> None:
    a = cards_of({"platform": "gfx906", "devices": [0, 1]}, {"power_caps_w": [280.0, 280.0]})
    b = cards_of({"platform": "gfx906", "devices": [2, 3]}, {"power_caps_w": [250.0, 250.0]})
    assert card_mismatch(a, a) is None
    why = card_mismatch(a, b)
    assert why is not None and "devices: [0, 1] vs [2, 3]" in why and "power_caps_w" in why
