"""The sweep stage of a choice (`appliance choose --sweep max_num_seqs=64,128,256`). Pure.

A sweep is a recipe plus a small declared grid of its batch settings. Seed 004 forbids any difference
between the arms of a gate that compares recipes except the one under test; the batch settings
(`max_num_seqs`, `max_num_batched_tokens`) are among the forbidden ones, so a sweep is its own stage:
the variants of one recipe are gated against each other under `--allow-diff` for exactly the swept
fields, one variant per recipe is picked, and only then does the tournament compare recipes.

Each grid point is a real recipe: a generated file that `extends` the swept one and sets the swept
fields (`variant_yaml`). It is therefore admitted (host RAM, GPU memory), rendered, keyed and
launched exactly like any other recipe: the swept fields are compile-cache inputs
(appliance/recipe/cache_key.py `COMPILE_ENGINE_FIELDS`), so each variant gets its own cache root and
spec hash by the ordinary rules — nothing here computes an identity. The text carries no choice id,
so a later choice over the same grid finds the same variant, with its launch history and warm cache.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

from appliance.evaluation.tournament import ChoiceInputError

# The only fields a sweep may vary: the batch settings seed 004 names (the rest of the arm settings —
# the model, sampling, output limits — are the measurement itself and never swept).
SWEEP_FIELDS = ("max_num_seqs", "max_num_batched_tokens")
SHORT = {"max_num_seqs": "mns", "max_num_batched_tokens": "mnbt"}
# Every variant costs a cold start and a whole gate: past this many per recipe the stage would eat
# the budget of the tournament it feeds (vLLM's auto_tune sweeps hundreds; this gate is not cheap).
MAX_VARIANTS = 8
MAX_VALUE = 1_048_576  # beyond any batch a single engine is configured with


class SweepInputError(ChoiceInputError):
    """A sweep that cannot be run as declared; the message names the field and the rule."""


def parse_sweep(specs: Sequence[str]) -> dict[str, list[int]]:
    """`["max_num_seqs=64,128,256", ...]` (the CLI's repeatable `--sweep`) → the grid, checked."""
    grid: dict[str, list[int]] = {}
    for spec in specs:
        field, sep, values = spec.partition("=")
        field = field.strip()
        if not sep or not field:
            raise SweepInputError(f"--sweep {spec!r}: say it as FIELD=V1,V2,... (rule: sweep-syntax)")
        if field not in SWEEP_FIELDS:  # the field first: its values mean nothing if it cannot be swept
            check_sweep({field: [1]})
        if field in grid:
            raise SweepInputError(
                f"--sweep {field}: given twice; list all its values once (rule: sweep-duplicate)")
        parts = [v.strip() for v in values.split(",") if v.strip()]
        try:
            grid[field] = [int(v) for v in parts]
        except ValueError:
            raise SweepInputError(
                f"--sweep {field}: values must be whole numbers, got {values!r} (rule: sweep-value)"
            ) from None
    return check_sweep(grid)


def check_sweep(grid: Mapping[str, Sequence[int]]) -> dict[str, list[int]]:
    """The grid as declared, or SweepInputError naming the field and the rule it breaks."""
    out: dict[str, list[int]] = {}
    for field, values in grid.items():
        if field not in SWEEP_FIELDS:
            raise SweepInputError(
                f"sweep field {field!r}: only {' and '.join(SWEEP_FIELDS)} may be swept (rule: sweep-field; "
                "seed 004 forbids every other difference between the arms of a gate)"
            )
        if not values:
            raise SweepInputError(f"sweep field {field}: no values (rule: sweep-empty)")
        dup = sorted({v for v in values if list(values).count(v) > 1})
        if dup:
            raise SweepInputError(f"sweep field {field}: {dup} listed twice (rule: sweep-duplicate)")
        bad = [v for v in values if isinstance(v, bool) or not 1 <= v <= MAX_VALUE]
        if bad:
            raise SweepInputError(
                f"sweep field {field}: {bad} out of range; each value is 1..{MAX_VALUE} (rule: sweep-value)"
            )
        out[field] = list(values)
    size = 1
    for values in out.values():
        size *= len(values)
    if size > MAX_VARIANTS:
        raise SweepInputError(
            f"sweep grid of {size} variants per recipe ({' × '.join(str(len(v)) for v in out.values())}): "
            f"the cap is {MAX_VARIANTS} (rule: sweep-too-large)"
        )
    return out


def points(grid: Mapping[str, Sequence[int]]) -> list[dict[str, int]]:
    """Every grid point, in the declared order (the first field varies slowest)."""
    fields = [f for f in SWEEP_FIELDS if f in grid]
    return [dict(zip(fields, combo, strict=True)) for combo in itertools.product(*(grid[f] for f in fields))]


def variant_name(recipe: str, point: Mapping[str, int]) -> str:
    """`cuda-smollm2-graph.sweep.mns128` (a valid recipe name, readable, one per grid point)."""
    return ".".join([recipe, "sweep", *(f"{SHORT[f]}{point[f]}" for f in SWEEP_FIELDS if f in point)])


def is_variant(name: str) -> bool:
    """Whether a recipe name is a sweep variant's (`variant_name`): a later choice surveys the recipes
    an operator wrote, not the grid points an earlier sweep generated."""
    return ".sweep." in name


def variant_yaml(recipe: str, point: Mapping[str, int]) -> str:
    """The generated recipe file of one grid point: `extends` the swept recipe, sets only the point."""
    name = variant_name(recipe, point)
    fields = [f for f in SWEEP_FIELDS if f in point]
    lines = [
        "# Generated by `appliance choose --sweep` (appliance/evaluation/sweep.py): one grid point of",
        f"# {recipe}'s batch settings. Edit {recipe}, not this file; it is rewritten at each sweep.",
        f"name: {name}",
        f"extends: {recipe}",
        f"description: {recipe} with {', '.join(f'{f}={point[f]}' for f in fields)} (a sweep variant)",
        "engine:",
        *(f"  {f}: {point[f]}" for f in fields),
        "  why:",
        *(f"    {f}: \"a sweep variant of {recipe}: this value is the one under test\"" for f in fields),
    ]
    return "\n".join(lines) + "\n"


def variant_sources(recipes: Sequence[str], grid: Mapping[str, Sequence[int]]) -> dict[str, dict[str, str]]:
    """For each swept recipe: variant name → its file text, in the grid's order."""
    return {r: {variant_name(r, p): variant_yaml(r, p) for p in points(grid)} for r in recipes}
