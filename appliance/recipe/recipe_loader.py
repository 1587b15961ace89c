"""Load recipes from YAML: `extends` deep merge, and errors an operator can act on. Pure.

`parse_recipes` takes file texts (no file system), so every error path is testable with strings;
`load_recipes` only reads a directory and hands the texts over. Every error is a `RecipeError` that
names the file, the dotted field, the line when known, and the rule that was broken — a typo in a
recipe must cost a minute, not an afternoon (DOMAIN §2: "missing one causes trouble").

Merge rules: mappings merge key by key (a child overrides one env var without restating the rest);
lists and scalars replace; `null` in a child deletes the key, so the field falls back to the model's
default. `name`, `extends`, `abstract` and `description` are never inherited. One exception: a child
whose `runtime.kind` differs from what it extends starts its `runtime:` section afresh — the other
kind's fields mean nothing to this one (a docker `network`/`group_add` on a pod), so they are not
carried over to be deleted one by one.

Limits (the controller's unauthenticated `GET /recipes` loads the same directory, so a recipe file
is untrusted input): a file is at most `MAX_RECIPE_BYTES`, a directory at most `MAX_RECIPE_FILES`
files, nesting at most `MAX_DEPTH` levels, and anchors/aliases are refused outright — a 608-byte
"billion laughs" alias chain expands to gigabytes once constructed. Each file is parsed once
(compose → check → construct from the same node tree), with libyaml's C parser when PyYAML has it.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePath
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from appliance.recipe.key_chars import ERROR_TYPE as KEY_CHARS_ERROR
from appliance.recipe.recipe_model import Recipe
from appliance.runtimes import registry as runtime_registry

_NOT_INHERITED = ("name", "extends", "abstract", "description")
# The largest shipped recipe is ~8 KB; 256 KiB leaves room for comments and long `why`s.
MAX_RECIPE_BYTES = 256 * 1024
MAX_RECIPE_FILES = 512
MAX_DEPTH = 32
# libyaml's C loader when PyYAML was built with it (≈10× faster); the pure-Python one otherwise.
_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class RecipeError(Exception):
    """A recipe cannot be loaded. `str()` is one paragraph naming file, field, line and rule."""

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None,
                 line: int | None = None, rule: str | None = None, located: bool = False) -> None:
        self.file = file
        self.field = field
        self.line = line
        self.rule = rule
        self.message = message
        where = ", ".join(
            part for part in (
                file, f"line {line}" if line is not None else None,
                f"field '{field}'" if field else None,
            ) if part
        )
        # `located`: the message already says where (several errors, each with its own place).
        super().__init__(f"{where}: {message}" if where and not located else message)


def load_recipes(directory: Path) -> dict[str, Recipe]:
    """Every `*.yaml` recipe in `directory` (abstract bases included), keyed by recipe name."""
    return parse_recipes(read_sources(directory))


def read_sources(directory: Path) -> dict[str, str]:
    """Every `*.yaml` file of `directory`: path → text (bounded, UTF-8; RecipeError otherwise)."""
    if not directory.is_dir():
        raise RecipeError(f"recipe directory {directory} does not exist (set APPLIANCE_RECIPES?)",
                          file=str(directory), rule="missing-directory")
    files = sorted(directory.glob("*.yaml"))
    if len(files) > MAX_RECIPE_FILES:
        raise RecipeError(f"{len(files)} recipe files, more than the limit of {MAX_RECIPE_FILES} "
                          f"(rule: too-many-files)", file=str(directory), rule="too-many-files")
    return {str(p): _read_bounded(p) for p in files}


def _read_bounded(path: Path) -> str:
    with path.open("rb") as fh:
        data = fh.read(MAX_RECIPE_BYTES + 1)  # never more than the limit into memory
    if len(data) > MAX_RECIPE_BYTES:
        raise RecipeError(f"file is larger than the {MAX_RECIPE_BYTES // 1024} KiB limit for a recipe "
                          f"(rule: file-too-large)", file=str(path), rule="file-too-large")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecipeError(f"not UTF-8 text: {exc.reason} at byte {exc.start} (rule: not-utf8)",
                          file=str(path), rule="not-utf8") from None


def parse_recipes(sources: Mapping[str, str]) -> dict[str, Recipe]:
    """Parse, merge and validate recipe files (file name → YAML text). Pure."""
    raw: dict[str, _RawRecipe] = {}
    for filename, text in sources.items():
        doc = _RawRecipe.parse(filename, text)
        if doc.name in raw:
            raise RecipeError(f"recipe name '{doc.name}' is also defined in {raw[doc.name].file}",
                              file=filename, field="name", line=doc.line_of(("name",)),
                              rule="duplicate-name")
        raw[doc.name] = doc
    return {name: _validate(name, raw) for name in sorted(raw)}


class _RawRecipe:
    """One file's YAML: its mapping plus the node tree, to find the line of any dotted field."""

    def __init__(self, file: str, data: dict[str, Any], node: yaml.Node) -> None:
        self.file = file
        self.data = data
        self.node = node
        self.name = str(data.get("name") or PurePath(file).stem)

    @classmethod
    def parse(cls, file: str, text: str) -> _RawRecipe:
        if len(text.encode("utf-8")) > MAX_RECIPE_BYTES:
            raise RecipeError(f"file is larger than the {MAX_RECIPE_BYTES // 1024} KiB limit for a recipe "
                              f"(rule: file-too-large)", file=file, rule="file-too-large")
        loader = _LOADER(text)
        try:
            node = loader.get_single_node()
            if node is not None:
                _check_tree(file, node)
                data = loader.construct_document(node)
            else:
                data = None
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            line = mark.line + 1 if mark is not None else None
            raise RecipeError(f"YAML syntax error: {exc.problem or exc.context} (rule: yaml-syntax)",
                              file=file, line=line, rule="yaml-syntax") from None
        finally:
            loader.dispose()
        if not isinstance(data, dict) or node is None:
            raise RecipeError("a recipe file must be a YAML mapping (name: …, platform: …)",
                              file=file, line=1, rule="not-a-mapping")
        doc = cls(file, data, node)
        stem = PurePath(file).stem
        if "name" in data and data["name"] != stem:
            raise RecipeError(
                f"name '{data['name']}' differs from the file name '{stem}'; recipes are found by name, "
                f"so rename the file or the recipe (rule: name-matches-file)",
                file=file, field="name", line=doc.line_of(("name",)), rule="name-matches-file")
        return doc

    def line_of(self, loc: tuple[str | int, ...]) -> int | None:
        """1-based line of the deepest node on `loc` that exists in this file, or None."""
        node: yaml.Node | None = self.node
        line: int | None = None
        for key in loc:
            if isinstance(node, yaml.MappingNode):
                found = next((v for k, v in node.value if getattr(k, "value", None) == str(key)), None)
                key_node = next((k for k, _ in node.value if getattr(k, "value", None) == str(key)), None)
                if key_node is None:
                    return line
                line = key_node.start_mark.line + 1
                node = found
            elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
                node = node.value[key]
                line = node.start_mark.line + 1
            else:
                return line
        return line

    def has(self, loc: tuple[str | int, ...]) -> bool:
        value: Any = self.data
        for key in loc:
            in_dict = isinstance(value, dict) and key in value
            in_list = isinstance(value, list) and isinstance(key, int) and key < len(value)
            if not (in_dict or in_list):
                return False
            value = value[key]
        return True


def _check_tree(file: str, root: yaml.Node) -> None:
    """Refuse aliases (a node reached twice: how the composer represents `*ref`) and deep nesting.

    Iterative, and it stops at the first repeated node, so it costs one visit per distinct node —
    the node tree of a billion-laughs file is small; only constructing it would explode.
    """
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, int]] = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        line = node.start_mark.line + 1
        if id(node) in seen:
            raise RecipeError("YAML aliases (*name) are not allowed in recipes: the value anchored here "
                              "is reused; write it out, or use `extends` to share settings "
                              "(rule: yaml-alias)",
                              file=file, line=line, rule="yaml-alias")
        seen.add(id(node))
        if depth > MAX_DEPTH:
            raise RecipeError(f"nested deeper than {MAX_DEPTH} levels (rule: yaml-too-deep)",
                              file=file, line=line, rule="yaml-too-deep")
        if isinstance(node, yaml.MappingNode):
            stack.extend((part, depth + 1) for pair in node.value for part in pair)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((child, depth + 1) for child in node.value)


def _chain(name: str, raw: Mapping[str, _RawRecipe]) -> list[_RawRecipe]:
    """The recipe and its bases, child first. Cycles and missing bases name the whole chain."""
    chain: list[_RawRecipe] = [raw[name]]
    while (parent := chain[-1].data.get("extends")) is not None:
        names = [doc.name for doc in chain]
        child = chain[-1]
        if not isinstance(parent, str):
            raise RecipeError("'extends' must be the name of another recipe (rule: extends-type)",
                              file=child.file, field="extends", line=child.line_of(("extends",)),
                              rule="extends-type")
        if parent in names:
            loop = " -> ".join([*names, parent])
            raise RecipeError(f"circular extends: {loop} (rule: extends-cycle)", file=child.file,
                              field="extends", line=child.line_of(("extends",)), rule="extends-cycle")
        if parent not in raw:
            close = difflib.get_close_matches(parent, list(raw), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else f"; known recipes: {', '.join(sorted(raw))}"
            raise RecipeError(
                f"extends '{parent}', which does not exist (chain: {' -> '.join([*names, parent])}){hint} "
                f"(rule: extends-missing)",
                file=child.file, field="extends", line=child.line_of(("extends",)), rule="extends-missing")
        chain.append(raw[parent])
    return chain


def deep_merge(base: Mapping[str, Any], child: Mapping[str, Any]) -> dict[str, Any]:
    """Child over base: mappings merge recursively, anything else replaces, `None` deletes (at every
    depth: a `null` inside a mapping the base does not have is dropped too, i.e. the default)."""
    merged = dict(base)
    for key, value in child.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, Mapping):
            below = merged.get(key)
            merged[key] = deep_merge(below if isinstance(below, Mapping) else {}, value)
        else:
            merged[key] = value
    return merged


def merge_recipe(base: Mapping[str, Any], child: Mapping[str, Any]) -> dict[str, Any]:
    """`deep_merge`, except that a `runtime:` of another kind replaces the inherited one."""
    inherited, own = base.get("runtime"), child.get("runtime")
    if (isinstance(inherited, Mapping) and isinstance(own, Mapping) and "kind" in own
            and inherited.get("kind") != own["kind"]):
        base = {k: v for k, v in base.items() if k != "runtime"}
    return deep_merge(base, child)


def _validate(name: str, raw: Mapping[str, _RawRecipe]) -> Recipe:
    chain = _chain(name, raw)
    merged: dict[str, Any] = {}
    for doc in reversed(chain[1:]):
        merged = merge_recipe(merged, {k: v for k, v in doc.data.items() if k not in _NOT_INHERITED})
    merged = merge_recipe(merged, chain[0].data)
    merged.setdefault("name", name)
    try:
        return Recipe.model_validate(merged)
    except ValidationError as exc:
        raise _explain(exc, chain) from None


def _explain(exc: ValidationError, chain: list[_RawRecipe]) -> RecipeError:
    """Turn pydantic's errors into one paragraph; the first error's file/field/line are the attributes."""
    sentences: list[str] = []
    first: tuple[str, str, int | None, str] | None = None
    for err in exc.errors():
        loc = _clean_loc(err["loc"])
        field = ".".join(str(part) for part in loc) or "(top level)"
        # The value may have been inherited: blame the file that actually wrote it.
        origin = next((doc for doc in chain if doc.has(loc)), chain[0])
        line = origin.line_of(loc)
        rule = err["type"]
        text = err["msg"]
        if rule == "extra_forbidden":
            allowed = _allowed_keys(loc[:-1])
            close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
            text = f"unknown key '{loc[-1]}'" + (f" (did you mean '{close[0]}'?)" if close else "")
            if allowed:
                text += f"; allowed here: {', '.join(allowed)}"
        elif ("input" in err and rule not in ("missing", KEY_CHARS_ERROR)  # never quote a key back
              and not isinstance(err["input"], dict)):
            text += f" (got {err['input']!r})"
        where = f"{origin.file}" + (f" line {line}" if line else "")
        blame = "" if origin is chain[0] else f" [inherited by '{chain[0].name}']"
        sentences.append(f"{where}, field '{field}': {text} (rule: {rule}){blame}.")
        if first is None:
            first = (origin.file, field, line, rule)
    assert first is not None  # a ValidationError always carries at least one error
    file, field, line, rule = first
    recipe = chain[0].name
    message = f"recipe '{recipe}' is invalid: " + " ".join(sentences)
    return RecipeError(message, file=file, field=field, line=line, rule=rule, located=True)


def _clean_loc(loc: tuple[int | str, ...]) -> tuple[str | int, ...]:
    """Drop pydantic's union-tag part (runtime.docker.image → runtime.image), as written in YAML."""
    if len(loc) >= 2 and loc[0] == "runtime" and loc[1] in runtime_registry.KINDS:
        return (loc[0], *loc[2:])
    return tuple(loc)


def _allowed_keys(loc: tuple[str | int, ...]) -> list[str]:
    """Field names of the model(s) at `loc` inside Recipe, for 'did you mean' hints."""
    models: list[type[BaseModel]] = [Recipe]
    for part in loc:
        nxt: list[type[BaseModel]] = []
        for model in models:
            field = model.model_fields.get(str(part))
            if field is not None:
                nxt.extend(_models_in(field.annotation))
            elif isinstance(part, str):
                # A dict value (e.g. env.vars.NAME): the dict's value models are already in `models`.
                nxt.append(model)
        models = nxt
    return sorted({name for model in models for name in model.model_fields})


def _models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is not None:
        for arg in typing.get_args(annotation):
            yield from _models_in(arg)
