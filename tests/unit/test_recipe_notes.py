"""The shipped gfx906 recipes' notes say what the seed says, and say so where the seed says nothing.

Each case is a note a reader acts on: a `why` that credited the capture sizes with preventing C's OOM
(the seed measured the OOM unchanged), container settings presented as if measured, and `bitwise`
without the seed's caveat that eager has start-up variants too (S15)."""

from __future__ import annotations

import re

from tests.unit.recipe_helpers import RECIPES_DIR, B, C, shipped


def _yaml_line(recipe_file: str, key: str) -> str:
    text = (RECIPES_DIR / f"{recipe_file}.yaml").read_text(encoding="utf-8")
    match = re.search(rf"^\s*{re.escape(key)}:.*$", text, re.MULTILINE)
    assert match, f"{recipe_file}: no '{key}:' line"
    return match.group(0)


def test_c_capture_sizes_are_not_credited_with_preventing_the_oom() -> None:
    why = shipped()[C].engine.why["cudagraph_capture_sizes"]
    assert "did not by themselves prevent the OOM" in why
    # What did make C fit (DOMAIN §3): the extra swap, swappiness 200 and the AOT warm restart.
    assert all(lever in why for lever in ("swap", "swappiness 200", "AOT warm restart"))


def test_container_settings_without_a_seed_source_say_so() -> None:
    for key in ("shm_size", "security_opt"):
        assert "no seed source" in _yaml_line("gfx906-base", key), key
    assert "S12" in _yaml_line("gfx906-base", "ipc")  # RCCL over SHM: that one has a source


def test_bitwise_recipes_carry_the_eager_start_up_variants_caveat() -> None:
    recipes = shipped()
    bitwise = [n for n in (B, "gfx906-fp8-tp4-eager") if recipes[n].expect.reproducibility == "bitwise"]
    assert bitwise == [B, "gfx906-fp8-tp4-eager"]
    for name in bitwise:
        notes = recipes[name].expect.notes
        assert "S15" in notes and "start-up variants" in notes and "fixed batch composition" in notes, name
