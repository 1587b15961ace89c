"""When a small gain has been re-run enough: the stability bar of seed 003 §695. Pure.

Seed 003 §695 (DOMAIN §7): "每个 tier 跑 3 次，确认误差 < 5%" — each tier three runs, error under 5 %.
A gain in the small band `[noise, small_gain)` (seed 004: 1–3 %) is re-run in interleaved rounds until
**both** hold: at least `min_rounds` rounds, and every tier's output throughput (and the weighted
score) spreads less than `spread_limit` on each arm. Once any prefix of the rounds showed a small
gain the bar stays due: a later round that moves the median out of the band (+2 % then +6 %) does
not end the re-runs, it is exactly the instability the bar exists to catch.

Spread = (max − min) / median over the rounds (0 for one round).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from appliance.evaluation.bench_result import BenchResult


def spread_of(values: Sequence[float]) -> float:
    m = statistics.median(values) if values else 0.0
    return 0.0 if m == 0 or len(values) < 2 else (max(values) - min(values)) / m


def score_spread(runs: Sequence[BenchResult]) -> float:
    return spread_of([r.score for r in runs])


def tier_spreads(runs: Sequence[BenchResult]) -> dict[str, float]:
    """Each tier's output-throughput spread over the rounds (tiers in the first run's order)."""
    names = [t.tier.name for t in runs[0].tiers] if runs else []
    out: dict[str, float] = {}
    for name in names:
        values = [t.output_throughput for r in runs if (t := r.tier(name)) is not None]
        out[name] = spread_of(values)
    return out


def _median_delta(base: Sequence[BenchResult], cand: Sequence[BenchResult]) -> float | None:
    b = statistics.median(r.score for r in base)
    c = statistics.median(r.score for r in cand)
    return None if b == 0 else (c - b) / b


def small_gain_seen(
    base: Sequence[BenchResult], cand: Sequence[BenchResult], noise: float, small_gain: float
) -> bool:
    """Some prefix of the paired rounds (1, 1–2, …) had a median gain in `[noise, small_gain)`."""
    rounds = min(len(base), len(cand))
    for k in range(1, rounds + 1):
        d = _median_delta(base[:k], cand[:k])
        if d is not None and noise <= d < small_gain:
            return True
    return False


def worst_spread(base: Sequence[BenchResult], cand: Sequence[BenchResult]) -> tuple[float, str]:
    """The largest spread over both arms' scores and tiers, and where it is."""
    worst, where = 0.0, "-"
    for label, runs in (("baseline", base), ("candidate", cand)):
        for name, value in {"score": score_spread(runs), **tier_spreads(runs)}.items():
            if value > worst:
                worst, where = value, f"{label} {name}"
    return worst, where


def stable(
    base: Sequence[BenchResult], cand: Sequence[BenchResult], min_rounds: int, spread_limit: float
) -> bool:
    rounds = min(len(base), len(cand))
    return rounds >= min_rounds and worst_spread(base, cand)[0] < spread_limit
