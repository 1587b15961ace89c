"""Tier fitting, fixed first-five lengths and the committed prompt set."""

from __future__ import annotations

import pytest

from appliance.evaluation.bench_tiers import (
    MIN_TIER_INPUT_TOKENS,
    SEED_TIERS,
    NoTierFits,
    input_lengths,
    plan_tiers,
)
from appliance.evaluation.prompts import PROMPT_SET_SHA256, bench_prompt, prompt_set_digest


def test_a_long_context_uses_the_seed_tiers_unscaled() -> None:
    plan = plan_tiers(262144, 256)  # DOMAIN §2: --max-model-len 262144
    assert plan.tiers == SEED_TIERS and plan.scale == 1.0 and not plan.scaled


def test_a_small_context_scales_every_tier_by_one_factor_into_it() -> None:
    plan = plan_tiers(2048, 64)  # the CPU recipe
    assert plan.scale == pytest.approx(1984 / 32768)
    assert [(t.name, t.lo, t.hi) for t in plan.tiers] == [
        ("4-8K", 248, 496),
        ("8-16K", 496, 992),
        ("16-32K", 992, 1984),
    ]
    assert [t.weight for t in plan.tiers] == [0.20, 0.50, 0.30]
    assert plan.tiers[-1].hi + plan.output_tokens <= 2048
    assert "scaled" in plan.describe() and "x usable/32768" in plan.rule


def test_the_boundary_where_the_seed_tiers_just_fit() -> None:
    assert plan_tiers(32768 + 128, 128).scale == 1.0
    assert plan_tiers(32768 + 127, 128).scale < 1.0


def test_a_context_that_fits_no_tier_is_refused_with_the_reason() -> None:
    with pytest.raises(NoTierFits, match="no tier fits"):
        plan_tiers(256, 64)
    with pytest.raises(NoTierFits):
        plan_tiers(64, 128)  # output alone exceeds the context
    # the smallest context that still fits: the 4-8K tier starts exactly at the floor
    usable = MIN_TIER_INPUT_TOKENS * 8
    assert plan_tiers(usable + 16, 16).tiers[0].lo == MIN_TIER_INPUT_TOKENS


def test_first_five_lengths_are_fixed_and_inside_the_tier() -> None:
    tier = plan_tiers(2048, 64).tiers[1]
    lengths = input_lengths(tier)
    assert lengths == input_lengths(tier) and len(lengths) == 5
    assert all(tier.lo <= n <= tier.hi for n in lengths)
    assert list(lengths) == sorted(set(lengths))


def test_the_prompt_set_is_pinned_and_deterministic() -> None:
    assert prompt_set_digest() == PROMPT_SET_SHA256, (
        "the generator changed: bump PROMPT_SET_VERSION and the pin"
    )
    assert bench_prompt("8-16K", 3, 500) == bench_prompt("8-16K", 3, 500)
    assert bench_prompt("8-16K", 3, 500) != bench_prompt("8-16K", 4, 500)
    assert len(bench_prompt("16-32K", 0, 2000).split()) > 2000
