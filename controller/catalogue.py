"""The recipe catalogue: one way to load the recipe directory, look a recipe up and compare two,
shared by the admin API (controller/api/app.py), the console (controller/console/) and the CLI
(controller/cli/recipes_cmd.py, host_cmd.py), and by the preflight (controller/supervisor/preflight.py).

Loading and its checks are appliance/recipe/recipe_loader.py (every problem a `RecipeError`); the diff is
appliance/recipe/recipe_diff.py. What is decided here is what "not found" means for each caller: the CLI
names any recipe (abstract ones included) and says which exist; the API, the console and the
preflight only launch a concrete recipe (`UnknownRecipe` otherwise).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from appliance.recipe.recipe_diff import RecipeDiff, diff_recipes
from appliance.recipe.recipe_loader import RecipeError, parse_recipes, read_sources
from appliance.recipe.recipe_model import Recipe


class UnknownRecipe(LookupError):
    """No launchable (present, not abstract) recipe by that name."""


def did_you_mean(name: str, names: Iterable[str]) -> str:
    """`` (did you mean 'a' or 'b'?)`` for the names close to a mistyped `name` (difflib), else ``""``."""
    close = difflib.get_close_matches(name, sorted(set(names)), n=3, cutoff=0.6)
    if not close:
        return ""
    return " (did you mean " + " or ".join(f"'{c}'" for c in close) + "?)"


def load_failed(exc: RecipeError) -> str:
    """The one sentence the API gives (HTTP 500) when the recipe directory does not load."""
    return f"recipes do not load: {exc}"


@dataclass(frozen=True)
class Catalogue:
    directory: Path
    # Recipes the appliance wrote itself (a choice's sweep variants, appliance/evaluation/sweep.py),
    # kept apart from the operator's directory, which may be read-only; loaded with it, so they may
    # `extends` its recipes. None or absent: none.
    generated: Path | None = None

    def load(self) -> dict[str, Recipe]:
        """Every recipe in the directory (and the generated one), merged (raises RecipeError)."""
        return self.load_with({})

    def load_with(self, extra: Mapping[str, str]) -> dict[str, Recipe]:
        """As `load`, with `extra` files (path → text) read as if they were there (a plan of what
        would be written)."""
        sources = read_sources(self.directory)
        generated = dict(extra)
        if self.generated is not None and self.generated.is_dir():
            generated = read_sources(self.generated) | generated
        # A generated file never breaks the operator's catalogue: one that no longer loads (the recipe it
        # extends was renamed or broken) is left out, and the operator's own errors still surface.
        while True:
            try:
                return parse_recipes({**sources, **generated})
            except RecipeError as exc:
                if exc.file not in generated:
                    raise
                del generated[exc.file]

    def named(self, name: str) -> Recipe:
        """The recipe called `name`, abstract or not (RecipeError, rule unknown-recipe, when absent)."""
        return self._pick(self.load(), name)

    def _pick(self, recipes: dict[str, Recipe], name: str) -> Recipe:
        if name not in recipes:
            # The near names only: the whole directory (31 names and growing) buried the suggestion.
            raise RecipeError(f"no recipe named '{name}' in {self.directory}{did_you_mean(name, recipes)}; "
                              f"`appliance recipes list` lists all {len(recipes)}", rule="unknown-recipe")
        return recipes[name]

    def launchable(self, name: str) -> Recipe:
        """The launchable recipe called `name` (raises UnknownRecipe or RecipeError)."""
        found = self.load().get(name)
        if found is None or found.abstract:
            raise UnknownRecipe(name)
        return found

    def diff(self, a: str, b: str) -> RecipeDiff:
        """Field-by-field difference of recipes `a` and `b` (RecipeError when either is absent)."""
        recipes = self.load()
        return diff_recipes(self._pick(recipes, a), self._pick(recipes, b))
