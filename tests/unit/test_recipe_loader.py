"""Recipe loading: extends deep merge, and bad input → one clear error naming file, field, line, rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from appliance.recipe.recipe_loader import RecipeError, deep_merge, load_recipes, parse_recipes
from appliance.recipe.recipe_model import GraphMode, Recipe
from tests.unit.recipe_helpers import SHIPPED, shipped

BASE = """\
name: base
abstract: true
description: the base
platform: gfx906
runtime: {kind: docker, image: img}
model: {path: /m, served_name: q}
devices: [0, 1, 2, 3]
engine:
  dtype: float16
  tensor_parallel_size: 4
  cudagraph_mode: PIECEWISE
expect: {ready_budget_s: 900}
cache: {root: /c}
env:
  vars:
    A: {value: "1", why: base sets A}
    B: "2"
"""


def parse(**files: str) -> dict[str, Recipe]:
    return dict(parse_recipes({f"{name.replace('_', '-')}.yaml": text for name, text in files.items()}))


def error_of(**files: str) -> RecipeError:
    with pytest.raises(RecipeError) as info:
        parse(**files)
    return info.value


def test_shipped_recipes_load_exactly_the_production_set() -> None:
    recipes = shipped()
    assert sorted(n for n, r in recipes.items() if not r.abstract) == sorted(SHIPPED)
    assert sorted(n for n, r in recipes.items() if r.abstract) == [
        "cuda-smollm2-base", "cuda-tp-base", "cuda-tp2-base", "cuda-tp4-base", "gfx906-base"]
    gfx906 = [r for n, r in recipes.items() if n.startswith("gfx906-") and not r.abstract]

    def root(r: Recipe) -> str:  # a variant of a production recipe (the -k8s one) extends it in turn
        return root(recipes[r.extends]) if r.extends and not recipes[r.extends].abstract else str(r.extends)

    assert all(root(r) == "gfx906-base" for r in gfx906)


def test_extends_merges_mappings_replaces_scalars_and_lists_and_null_deletes() -> None:
    child = """\
name: child
extends: base
devices: [0, 1]
engine:
  tensor_parallel_size: 2
  cudagraph_mode: null
env:
  vars:
    B: "3"
    C: "4"
"""
    recipes = parse(base=BASE, child=child)
    r = recipes["child"]
    assert r.devices == (0, 1)  # list replaced, not appended
    assert r.engine.tensor_parallel_size == 2
    assert r.engine.dtype == "float16"  # inherited
    assert r.engine.cudagraph_mode is None  # null deleted the inherited value → model default
    assert {k: v.value for k, v in r.env.vars.items()} == {"A": "1", "B": "3", "C": "4"}
    assert r.env.vars["A"].why == "base sets A"
    # name, abstract and description are the child's own.
    assert (r.abstract, r.description, r.extends) == (False, "", "base")


def test_a_runtime_of_another_kind_starts_its_section_afresh() -> None:
    # BASE's docker section (image, and here network/group_add) means nothing to a process runtime:
    # nothing of it is inherited, so the child does not have to null each field.
    base = BASE.replace("runtime: {kind: docker, image: img}",
                        "runtime: {kind: docker, image: img, network: host, group_add: [video]}")
    child = "name: child\nextends: base\nruntime: {kind: process, python: /venv/bin/python}\n"
    runtime = parse(base=base, child=child)["child"].runtime
    assert runtime.kind == "process"
    assert runtime.model_dump(exclude_defaults=True) == {"python": "/venv/bin/python"}
    # The same kind still merges field by field (only the image changes).
    same = parse(base=base, child="name: child\nextends: base\nruntime: {kind: docker, image: other}\n")
    assert same["child"].runtime.model_dump(include={"image", "network", "group_add"}) == {
        "image": "other", "network": "host", "group_add": ("video",)}
    # A section without `kind` is the inherited kind's.
    bare = parse(base=base, child="name: child\nextends: base\nruntime: {image: other}\n")
    assert bare["child"].runtime.model_dump(include={"kind", "network"}) == {
        "kind": "docker", "network": "host"}


def test_deep_merge_is_pure() -> None:
    base = {"a": {"b": 1, "c": 2}}
    merged = deep_merge(base, {"a": {"b": 5}})
    assert merged == {"a": {"b": 5, "c": 2}}
    assert base == {"a": {"b": 1, "c": 2}}
    # `null` deletes at every depth, also inside a mapping the base does not have.
    assert deep_merge(base, {"d": {"e": None, "f": 1}}) == {"a": {"b": 1, "c": 2}, "d": {"f": 1}}


def test_yaml_syntax_error_names_file_and_line() -> None:
    err = error_of(base=BASE, child="name: child\nextends: base\nengine:\n  dtype: [float16\n")
    assert err.file == "child.yaml"
    assert err.line == 5  # the stream ends inside the flow sequence opened on line 4
    assert err.rule == "yaml-syntax"
    assert "child.yaml, line 5: YAML syntax error" in str(err)


def test_unknown_key_names_file_field_line_and_suggests() -> None:
    err = error_of(base=BASE, child="name: child\nextends: base\nengine:\n  tensor_paralel_size: 2\n")
    assert (err.file, err.field, err.line, err.rule) == ("child.yaml", "engine.tensor_paralel_size", 4,
                                                         "extra_forbidden")
    assert "did you mean 'tensor_parallel_size'" in str(err)


def test_wrong_type_names_field_value_and_rule() -> None:
    err = error_of(base=BASE, child="name: child\nextends: base\nengine:\n  tensor_parallel_size: four\n")
    assert (err.file, err.field, err.line, err.rule) == ("child.yaml", "engine.tensor_parallel_size", 4,
                                                         "int_parsing")
    assert "'four'" in str(err)


def test_error_in_inherited_value_blames_the_base_file() -> None:
    bad_base = BASE.replace("dtype: float16", "dtype: float8")
    err = error_of(base=bad_base, child="name: child\nextends: base\n")
    assert (err.file, err.field, err.line) == ("base.yaml", "engine.dtype", 9)


def test_circular_extends_names_the_chain() -> None:
    err = error_of(a="name: a\nextends: b\n", b="name: b\nextends: a\n")
    assert err.rule == "extends-cycle"
    assert err.field == "extends"
    assert "a -> b -> a" in str(err)


def test_missing_base_names_the_chain_and_suggests() -> None:
    err = error_of(base=BASE, child="name: child\nextends: bsae\n")
    assert (err.file, err.field, err.line, err.rule) == ("child.yaml", "extends", 2, "extends-missing")
    assert "child -> bsae" in str(err)
    assert "did you mean 'base'" in str(err)


def test_name_must_match_file_and_be_unique() -> None:
    err = error_of(child="name: other\n")
    assert (err.field, err.rule) == ("name", "name-matches-file")
    with pytest.raises(RecipeError) as info:
        parse_recipes({"x/base.yaml": BASE, "y/base.yaml": BASE})
    assert info.value.rule == "duplicate-name"


def test_graph_options_in_eager_mode_are_rejected_with_the_reason() -> None:
    err = error_of(base=BASE, child="name: child\nextends: base\nengine:\n  mode: eager\n")
    assert err.field == "engine"
    assert "--enforce-eager disables graphs" in str(err)


def test_load_recipes_reads_a_directory(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text(BASE)
    (tmp_path / "child.yaml").write_text("name: child\nextends: base\nengine: {mode: graph}\n")
    (tmp_path / "notes.txt").write_text("not a recipe")
    recipes = load_recipes(tmp_path)
    assert sorted(recipes) == ["base", "child"]
    assert recipes["child"].engine.mode is GraphMode.GRAPH
    with pytest.raises(RecipeError) as info:
        load_recipes(tmp_path / "missing")
    assert info.value.rule == "missing-directory"


def test_error_file_is_the_path_read(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text(BASE.replace("image: img", "image: img, imgae: x"))
    with pytest.raises(RecipeError) as info:
        load_recipes(tmp_path)
    assert info.value.file == str(tmp_path / "base.yaml")
    assert info.value.field == "runtime.imgae"


# --- env var names, YAML limits --------------------------------------------------------------


@pytest.mark.parametrize("name", ["X=1; touch p; Y", "Z$(touch q)", "1ABC", "A-B", "", "A B"])
def test_env_var_names_must_be_posix(name: str) -> None:
    child = f"name: child\nextends: base\nenv:\n  vars:\n    {name!r}: \"1\"\n"
    err = error_of(base=BASE, child=child)
    assert (err.file, err.field, err.rule) == ("child.yaml", "env.vars", "env-name-posix")
    assert "[A-Za-z_][A-Za-z0-9_]*" in str(err) and repr(name) in str(err)


def test_posix_env_var_names_load() -> None:
    child = "name: child\nextends: base\nenv:\n  vars:\n    _lower_9: \"1\"\n    UPPER_2: \"x\"\n"
    assert set(parse(base=BASE, child=child)["child"].env.vars) >= {"_lower_9", "UPPER_2"}


BILLION_LAUGHS = """\
name: child
extends: base
a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]
description: *h
"""


def test_billion_laughs_is_refused_before_it_expands() -> None:
    err = error_of(base=BASE, child=BILLION_LAUGHS)
    assert (err.file, err.rule) == ("child.yaml", "yaml-alias")
    assert err.line is not None and 3 <= err.line <= 10  # an anchored value that is reused


def test_an_alias_inside_a_free_form_mapping_is_refused() -> None:
    # override_generation_config is a dict[str, Any]: validation alone would accept any expansion.
    child = ("name: child\nextends: base\nx: &x {temperature: 0.7}\n"
             "engine:\n  override_generation_config: *x\n")
    assert error_of(base=BASE, child=child).rule == "yaml-alias"


def test_deep_nesting_is_refused() -> None:
    deep = "[" * 200 + "]" * 200
    err = error_of(base=BASE, child=f"name: child\nextends: base\ndescription: {deep}\n")
    assert err.rule == "yaml-too-deep"


def test_oversized_files_are_refused_without_reading_them_whole(tmp_path: Path) -> None:
    from appliance.recipe import recipe_loader

    (tmp_path / "base.yaml").write_text(BASE + "#" + "x" * recipe_loader.MAX_RECIPE_BYTES + "\n")
    with pytest.raises(RecipeError) as info:
        load_recipes(tmp_path)
    assert (info.value.file, info.value.rule) == (str(tmp_path / "base.yaml"), "file-too-large")
    with pytest.raises(RecipeError) as info:
        parse(base=BASE + "#" + "x" * recipe_loader.MAX_RECIPE_BYTES + "\n")
    assert info.value.rule == "file-too-large"


def test_each_file_is_parsed_once_with_the_c_loader(monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    from appliance.recipe import recipe_loader

    if yaml.__with_libyaml__:
        assert recipe_loader._LOADER.__name__ == "CSafeLoader"
    made: list[object] = []
    real = recipe_loader._LOADER

    def counting(text: str) -> object:
        made.append(text)
        return real(text)

    def second_parse(*_a: object, **_k: object) -> None:
        raise AssertionError("a second parse of the same text")

    monkeypatch.setattr(recipe_loader, "_LOADER", counting)
    for name in ("compose", "safe_load", "load"):
        monkeypatch.setattr(yaml, name, second_parse)
    parse(base=BASE, child="name: child\nextends: base\n")
    assert len(made) == 2  # one loader per file


SECRET = "eng_0123456789abcdef"


@pytest.mark.parametrize("bad", ["\r\nX-Injected: 1", "\n", "\x00", "\t", " ", "\x7f", "é", "\u2028"])
@pytest.mark.parametrize("written", [["--api-key={k}"], ["--api-key", "{k}"], ["--api-key", "other", "{k}"]])
def test_a_recipe_api_key_that_cannot_go_in_a_header_is_refused_naming_field_and_rule(
        bad: str, written: list[str]) -> None:
    # The recipe's own key is sent raw as `Authorization: Bearer KEY`: CR/LF would inject headers.
    key = SECRET + bad + "tail"
    items = "".join(f"    - {json.dumps(w.format(k=key))}\n" for w in written)
    err = error_of(base=BASE, child=f"name: child\nextends: base\nengine:\n  extra_args:\n{items}")
    assert (err.field, err.rule) == ("engine.extra_args", "engine-key-chars")
    assert "--api-key" in str(err) and "only visible ASCII" in str(err) and repr(bad[0]) in str(err)
    assert SECRET not in str(err)  # the error never quotes the key back


def test_a_recipe_env_api_key_that_cannot_go_in_a_header_is_refused() -> None:
    child = f'name: child\nextends: base\nenv:\n  vars:\n    VLLM_API_KEY: "{SECRET}\\r\\nX: 1"\n'
    err = error_of(base=BASE, child=child)
    assert (err.field, err.rule) == ("env.vars", "engine-key-chars")
    assert "VLLM_API_KEY" in str(err) and SECRET not in str(err)


def test_a_visible_ascii_recipe_api_key_loads() -> None:
    keys = f"    - --api-key\n    - {SECRET}~!#\n    - --api-key=k2\n    - --port-x\n    - 'a b'\n"
    got = parse(base=BASE, child=f"name: child\nextends: base\nengine:\n  extra_args:\n{keys}")
    assert got["child"].engine.extra_args[1] == SECRET + "~!#"
