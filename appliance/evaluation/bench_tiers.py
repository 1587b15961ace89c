"""The seed's benchmark tiers and how they are fitted into a recipe's context. Pure.

DOMAIN §7 (seeds 003/004): inputs of 4–8K, 8–16K and 16–32K tokens, scored
`0.20·thr(4–8K) + 0.50·thr(8–16K) + 0.30·thr(16–32K)` in output tokens/s. A recipe whose context
cannot hold the 16–32K tier (the CPU recipe's model has 2048 tokens) gets every tier scaled by one
factor into its usable context — never a tier silently dropped — and the result states the rule.

The scaling rule (`SCALE_RULE`): usable = max_model_len − output_tokens; when usable < 32768 every
tier bound is multiplied by usable / 32768 (rounded down), so the three tiers keep their relative
positions and weights and the long tier ends at the last input length that still fits. When even
the scaled 4–8K tier would start below `MIN_TIER_INPUT_TOKENS`, no tier fits: the bench refuses
with that reason instead of measuring prompts too short to mean anything.

Output lengths: every tier declares the task's maximum output (`Tier.max_output`),
and the measured requests carry it and stop at EOS, so the output-length parity of seed 004 §6
(775 vs 887 tokens over a tier's first five) can show. The seeds do not record the number the
official `run_throughput.sh` passed (003 §639 runs it without showing its arguments); what they do
record is natural stops averaging 155–177 tokens a request (004 §6: 775 and 887 over five), so the
declared 1024 per tier lets EOS decide and not the cap. It is never scaled with the context: a
context that cannot hold it next to the scaled inputs fits no tier. A fixed small cap instead
(`--output-tokens N`, `--fast`) is the FAST MODE for tests, and results say so (`BenchResult.mode`).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

SEED_MAX_INPUT = 32768
MIN_TIER_INPUT_TOKENS = 32  # a scaled 4–8K tier starting below this measures nothing like a long prompt
FIRST_N = 5  # DOMAIN §7: "fixed first five requests" of each tier, never a random sample
FULL_REQUESTS = 100  # seed 003 §1120: the full run, 100 prompts per tier (3 runs, steady state)
OFFICIAL_MAX_OUTPUT = 1024  # per tier, declared below; why this figure: the module doc
SCALE_RULE = (
    "usable = max_model_len - output_tokens; if usable < 32768, every seed tier bound x usable/32768 "
    "(floor), weights unchanged"
)


class Tier(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str  # the seed's name, kept when scaled: the weight belongs to it
    lo: int = Field(ge=1, description="Smallest input length (tokens), inclusive.")
    hi: int = Field(ge=1, description="Largest input length (tokens), inclusive.")
    weight: float = Field(ge=0, le=1)
    # The task's maximum output per request in this tier (tokens); requests stop at EOS before it.
    max_output: int = Field(default=OFFICIAL_MAX_OUTPUT, ge=1)


SEED_TIERS: tuple[Tier, ...] = (
    Tier(name="4-8K", lo=4096, hi=8192, weight=0.20, max_output=OFFICIAL_MAX_OUTPUT),
    Tier(name="8-16K", lo=8192, hi=16384, weight=0.50, max_output=OFFICIAL_MAX_OUTPUT),
    Tier(name="16-32K", lo=16384, hi=32768, weight=0.30, max_output=OFFICIAL_MAX_OUTPUT),
)


def official_output_tokens() -> int:
    """The largest declared max output over the tiers: what a plan must leave room for."""
    return max(t.max_output for t in SEED_TIERS)


def output_limit(tier: Tier, cap: int | None) -> int:
    """A request's max_tokens in `tier`: the tier's declared max output, or the fast mode's cap."""
    return tier.max_output if cap is None else cap


class TierPlan(BaseModel):
    model_config = ConfigDict(frozen=True)

    tiers: tuple[Tier, ...]
    scale: float  # 1.0 = the seed's tiers as they are
    max_model_len: int
    output_tokens: int
    rule: str = SCALE_RULE

    @property
    def scaled(self) -> bool:
        return self.scale < 1.0

    def describe(self) -> str:
        bounds = ", ".join(f"{t.name}→{t.lo}-{t.hi}" for t in self.tiers)
        if not self.scaled:
            return f"seed tiers as they are ({bounds})"
        return (
            f"scaled ×{self.scale:.4f} into max_model_len {self.max_model_len} "
            f"(output {self.output_tokens}): {bounds}"
        )


class NoTierFits(ValueError):
    """The recipe's context cannot hold even a scaled 4–8K tier: a verdict, not a crash."""


def plan_tiers(max_model_len: int, output_tokens: int) -> TierPlan:
    if output_tokens < 1:
        raise ValueError("output_tokens must be at least 1")
    usable = max_model_len - output_tokens
    if usable >= SEED_MAX_INPUT:
        return TierPlan(tiers=SEED_TIERS, scale=1.0, max_model_len=max_model_len, output_tokens=output_tokens)
    scale = max(usable, 0) / SEED_MAX_INPUT
    # Inputs scale; the declared max output stays the task's (see the module doc).
    tiers = tuple(t.model_copy(update={"lo": int(t.lo * scale), "hi": int(t.hi * scale)}) for t in SEED_TIERS)
    if tiers[0].lo < MIN_TIER_INPUT_TOKENS:
        raise NoTierFits(
            f"max_model_len {max_model_len} with {output_tokens} output tokens leaves {usable} input "
            f"tokens: the 4-8K tier would scale to {tiers[0].lo}-{tiers[0].hi}, under the "
            f"{MIN_TIER_INPUT_TOKENS}-token floor; no tier fits (rule: {SCALE_RULE})"
        )
    return TierPlan(tiers=tiers, scale=scale, max_model_len=max_model_len, output_tokens=output_tokens)


def input_lengths(tier: Tier, n: int = FIRST_N) -> tuple[int, ...]:
    """The input lengths of a tier's first `n` requests: fixed, spread evenly inside the tier.

    Request i sits at (i + 0.5)/n of the tier's range, so the first five cover the tier the same
    way on every run and every host (DOMAIN §7: always the same first five).
    """
    if n < 1:
        raise ValueError("n must be at least 1")
    span = tier.hi - tier.lo
    return tuple(tier.lo + int(span * (i + 0.5) / n) for i in range(n))


def weighted_score(throughput_by_tier: dict[str, float]) -> float:
    """`0.20·thr(4–8K) + 0.50·thr(8–16K) + 0.30·thr(16–32K)` (DOMAIN §7); a missing tier is an error."""
    missing = [t.name for t in SEED_TIERS if t.name not in throughput_by_tier]
    if missing:
        raise ValueError(f"no throughput for tier(s) {missing}: a tier is never silently dropped")
    return sum(t.weight * throughput_by_tier[t.name] for t in SEED_TIERS)
