"""Every shipped recipe's spec hash, pinned.

The spec hash labels each engine; a restarted controller adopts an engine only when the label equals
the hash of the spec it would launch now. A change in how specs are built (a new LaunchSpec field, a
render refactor) must therefore not move the hash of an unchanged recipe. The table holds the hashes
computed on commit f4b18f2 (before LaunchSpec carried its derived facts), with `fixed_facts()`.

To refresh it *intentionally* — a recipe or the launch it renders to really changed, and every running
engine of that recipe will be restarted rather than adopted — print the new values with
`python -c "from appliance.recipe.render import render; from tests.unit.recipe_helpers import *;
print({n: render(shipped()[n], fixed_facts()).spec_hash for n in SHIPPED})"`, paste them here and say
in the commit message which recipes moved and why.
"""

from __future__ import annotations

import pytest

from appliance.recipe.render import render
from tests.unit.recipe_helpers import SHIPPED, fixed_facts, shipped

PINNED = {
    "cpu-smollm2": "52c96b4c78ff946a",
    "cpu-smollm2-docker": "8ceaf0a886d42e54",
    "cpu-smollm2-eager": "6a05c10eaf408516",
    "cuda-generic": "d0a965a312de2702",
    "cuda-smollm2-eager": "e959f893aa386304",
    "cuda-smollm2-graph": "a3f3a8fe606ae769",
    "cuda-smollm2-piecewise": "400cff9c6ed2d212",
    "cpu-tp2": "490b7528529c0d31",
    "cuda-tp2-eager": "e9eee3cfb6d271db",
    "cuda-tp2-eager-nocar": "5a0f85c2975b9d25",
    "cuda-tp2-graph": "b66a8b37715e642a",
    "cuda-tp2-graph-nocar": "65c950bf41283d1d",
    "cuda-tp2-piecewise": "25168de38a64b9c8",
    "cuda-tp2-piecewise-nocar": "bbdd421187a4091c",
    "cuda-tp4-eager": "dd13c66b77e3a086",
    "cuda-tp4-eager-nocar": "177e823e1d3f402e",
    "cuda-tp4-graph": "ce8d6581c60e7bf1",
    "cuda-tp4-graph-nocar": "e39c40550f3fc871",
    "cuda-tp4-piecewise": "24e23c1f7a470936",
    "cuda-tp4-piecewise-nocar": "f499e8722581751c",
    "gfx906-a-tp2-graph": "6b6cb6f78f43a0e6",
    "gfx906-b-tp4-eager": "d2888808c15e8c5e",
    "gfx906-b-tp4-eager-k8s": "7dc31e1e60995dbe",
    "gfx906-c-prime-tp4-graph-default": "696f5d0efa4f91ab",
    "gfx906-c-tp4-graph-piecewise": "852b33ea45cb2287",
    "gfx906-fp8-tp4-eager": "4470946ef886ec1f",
}


def test_the_table_covers_exactly_the_shipped_recipes() -> None:
    assert sorted(PINNED) == sorted(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_spec_hash_is_pinned(name: str) -> None:
    spec = render(shipped()[name], fixed_facts())
    assert spec.spec_hash == PINNED[name]
    assert spec.labels["appliance.spec_hash"] == PINNED[name]
