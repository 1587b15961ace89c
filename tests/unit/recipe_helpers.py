"""Shared fixtures for the recipe tests: the shipped recipes, host fixture trees, fixed facts."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from appliance.host_facts import HostFacts
from appliance.recipe.recipe_loader import load_recipes
from appliance.recipe.recipe_model import Recipe
from host_setup.facts import gather_facts

REPO = Path(__file__).resolve().parents[2]
RECIPES_DIR = REPO / "recipes"
HOSTS = REPO / "tests" / "fixtures" / "hosts"
HOME = "/var/lib/appliance"

SHIPPED = (
    "cpu-smollm2",
    "cpu-smollm2-docker",
    "cpu-smollm2-eager",
    "cpu-tp2",
    "cuda-generic",
    "cuda-smollm2-eager",
    "cuda-smollm2-graph",
    "cuda-smollm2-piecewise",
    "cuda-tp2-eager",
    "cuda-tp2-eager-nocar",
    "cuda-tp2-graph",
    "cuda-tp2-graph-nocar",
    "cuda-tp2-piecewise",
    "cuda-tp2-piecewise-nocar",
    "cuda-tp4-eager",
    "cuda-tp4-eager-nocar",
    "cuda-tp4-graph",
    "cuda-tp4-graph-nocar",
    "cuda-tp4-piecewise",
    "cuda-tp4-piecewise-nocar",
    "gfx906-a-tp2-graph",
    "gfx906-b-tp4-eager",
    "gfx906-b-tp4-eager-k8s",
    "gfx906-c-prime-tp4-graph-default",
    "gfx906-c-tp4-graph-piecewise",
    "gfx906-fp8-tp4-eager",
)
B, C, C_PRIME = "gfx906-b-tp4-eager", "gfx906-c-tp4-graph-piecewise", "gfx906-c-prime-tp4-graph-default"


@lru_cache(maxsize=1)
def _shipped() -> dict[str, Recipe]:
    return load_recipes(RECIPES_DIR)


def shipped() -> dict[str, Recipe]:
    """The shipped recipes (parsed once; recipes are frozen, so sharing them is safe)."""
    return dict(_shipped())


def host(name: str) -> HostFacts:
    return gather_facts(HOSTS / name, appliance_home=Path(HOME))


def fixed_facts() -> HostFacts:
    """Facts that do not depend on the machine the tests run on (for golden renders)."""
    return HostFacts(
        mem_total_bytes=32 * 1024**3, mem_available_bytes=30 * 1024**3,
        swap_total_bytes=4 * 1024**3, swap_free_bytes=4 * 1024**3, swappiness=60,
        appliance_home=HOME,
    )


def with_changes(recipe: Recipe, **changes: object) -> Recipe:
    """A copy of `recipe` with dotted-path changes, validated again (e.g. engine__dtype="auto")."""
    data = recipe.model_dump()
    for dotted, value in changes.items():
        node = data
        *parents, last = dotted.split("__")
        for part in parents:
            node = node[part]
        node[last] = value
    return Recipe.model_validate(data)
