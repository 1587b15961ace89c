"""controller/catalogue.py and appliance/recipe/recipe_diff.py: the one recipe catalogue."""

from __future__ import annotations

import pytest

from appliance.recipe.recipe_diff import flatten
from appliance.recipe.recipe_loader import RecipeError
from controller.catalogue import Catalogue, UnknownRecipe, load_failed
from tests.unit.recipe_helpers import RECIPES_DIR


def test_flatten_dots_nested_keys_and_keeps_leaves() -> None:
    assert flatten({"a": {"b": 1, "c": {}}, "d": [1, 2]}) == {"a.b": 1, "a.c": {}, "d": [1, 2]}


def test_named_unknown_recipe_suggests_near_names_without_listing_all() -> None:
    with pytest.raises(RecipeError, match=r"no recipe named 'nope' in .*`appliance recipes list`") as exc:
        Catalogue(RECIPES_DIR).named("nope")
    assert exc.value.rule == "unknown-recipe" and "cpu-smollm2" not in str(exc.value)
    with pytest.raises(RecipeError) as near:
        Catalogue(RECIPES_DIR).named("cpu-smolm2")
    # issue 36 item 8: the suggestion, not the directory's every name after it
    assert "(did you mean 'cpu-smollm2'" in str(near.value) and "cuda-generic" not in str(near.value)


def test_launchable_refuses_abstract_and_missing() -> None:
    cat = Catalogue(RECIPES_DIR)
    assert cat.named("gfx906-base").abstract
    for name in ("gfx906-base", "nope"):
        with pytest.raises(UnknownRecipe):
            cat.launchable(name)
    assert cat.launchable("cpu-smollm2").name == "cpu-smollm2"


def test_diff_of_two_variants() -> None:
    d = Catalogue(RECIPES_DIR).diff("cpu-smollm2", "cpu-smollm2-eager")
    assert d.changes and all(va != vb for _, va, vb in d.changes)
    assert [c[0] for c in d.changes] == sorted(c[0] for c in d.changes)
    assert Catalogue(RECIPES_DIR).diff("cpu-smollm2", "cpu-smollm2").changes == []


def test_load_failed_sentence() -> None:
    assert load_failed(RecipeError("boom")).startswith("recipes do not load: ")
