"""The runtime seam: a runtime kind is its two files plus one line in each registry.

- nothing outside a runtime's own files compares kind strings or checks a runtime's class (AST scan);
- an old, flat launch record still loads, into exactly what render gives today;
- the Docker runtime creates its container with exactly what `render --format docker-py` prints;
- a plug-in's formats become `render --format` choices through the registry alone.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pydantic
import pytest

from appliance.recipe import formats
from appliance.recipe.launch_spec import LaunchSpec
from appliance.recipe.recipe_model import Recipe
from appliance.recipe.render import render
from appliance.runtimes import registry as pure_registry
from appliance.runtimes.base import FormatError
from appliance.runtimes.docker import DockerLaunch, manual_launch_id, wrapped_argv
from appliance.runtimes.process import ProcessLaunch
from controller.runtime import registry as effect_registry
from controller.runtime.docker import DockerRuntime
from tests.unit.recipe_helpers import REPO, SHIPPED, C, fixed_facts, shipped
from tests.unit.spec_helpers import launch_spec

V1 = REPO / "tests" / "fixtures" / "launch_spec_v1"  # LaunchSpec JSON with flat runtime fields
SCANNED = ("appliance", "host_setup", "controller")

# -- no kind comparisons outside a runtime's own files ---------------------------------------------


def _allowed() -> set[str]:
    """A runtime's own files: every pure plug-in module, the effectful modules the registry names,
    and the two registries."""
    own = {str(p.relative_to(REPO)) for p in (REPO / "appliance" / "runtimes").rglob("*.py")}
    own |= {entry.module.replace(".", "/") + ".py" for entry in effect_registry.RUNTIMES.values()}
    own |= {"controller/runtime/registry.py", "controller/runtime/process_shim.py"}
    return own


def _kind_names() -> set[str]:
    return set(pure_registry.KINDS) | set(effect_registry.KINDS) | {"docker", "process", "kubernetes"}


def _runtime_classes() -> set[str]:
    names = {"DockerRuntime", "ProcessRuntime", "KubernetesRuntime"}
    for plugin in pure_registry.PLUGINS.values():
        names |= {plugin.section.__name__, plugin.launch.__name__}
    return names


def _offences(tree: ast.AST, kinds: set[str], classes: set[str]) -> Iterator[tuple[int, str]]:
    def names_kind(node: ast.expr) -> bool:
        if isinstance(node, ast.Constant) and node.value in kinds:
            return True
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return any(names_kind(e) for e in node.elts)
        return False

    def names_class(node: ast.expr) -> bool:
        if isinstance(node, ast.Name | ast.Attribute):
            return (node.id if isinstance(node, ast.Name) else node.attr) in classes
        if isinstance(node, ast.Tuple):
            return any(names_class(e) for e in node.elts)
        if isinstance(node, ast.BinOp):  # isinstance(x, A | B)
            return names_class(node.left) or names_class(node.right)
        return False

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(names_kind(c) for c in (node.left, *node.comparators)):
            yield node.lineno, "compares a runtime kind string"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("isinstance", "issubclass") and len(node.args) == 2 \
                and names_class(node.args[1]):
            yield node.lineno, "checks a runtime's class"
        elif isinstance(node, ast.MatchValue) and names_kind(node.value):
            yield node.lineno, "matches a runtime kind string"


def _scan(root: Path) -> list[str]:
    allowed, kinds, classes = _allowed(), _kind_names(), _runtime_classes()
    found = []
    for package in SCANNED:
        for path in sorted((root / package).rglob("*.py")):
            rel = str(path.relative_to(root))
            if rel in allowed:
                continue
            for line, what in _offences(ast.parse(path.read_text(), rel), kinds, classes):
                found.append(f"{rel}:{line}: {what}")
    return found


def test_no_kind_comparisons_outside_a_runtimes_own_files() -> None:
    found = _scan(REPO)
    hint = "ask the runtime plug-in (appliance/runtimes/registry.py) instead:\n"
    assert found == [], hint + "\n".join(found)


@pytest.mark.parametrize("code", [
    'if spec.kind == "docker":\n    pass\n',
    'x = kind in ("process", "docker")\n',
    'ok = isinstance(recipe.runtime, DockerRuntime)\n',
    'ok = isinstance(spec.runtime, ProcessLaunch | DockerLaunch)\n',
    'match kind:\n    case "docker":\n        pass\n',
])
def test_the_scan_catches_each_shape(tmp_path: Path, code: str) -> None:
    (tmp_path / "controller").mkdir()
    (tmp_path / "controller" / "offender.py").write_text(code)
    for package in SCANNED[:2]:
        (tmp_path / package).mkdir()
    assert _scan(tmp_path) == [f"controller/offender.py:{1 if 'match' not in code else 2}: "
                               + next(iter(_offences(ast.parse(code), _kind_names(), _runtime_classes())))[1]]


# -- old launch records ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(V1.glob("*.json")), ids=lambda p: p.stem)
def test_an_old_flat_launch_record_loads_as_todays_render(path: Path) -> None:
    old = json.loads(path.read_text())
    assert isinstance(old["runtime"], str)  # the fixture really is the old shape
    spec = LaunchSpec.model_validate(old)
    assert spec.kind == old["runtime"]
    today = render(shipped()[path.stem], fixed_facts())
    exclude = {"spec_hash", "labels"}  # the hash is over the dump, whose shape changed
    assert spec.model_dump(exclude=exclude) == today.model_dump(exclude=exclude)
    assert spec.spec_hash == old["spec_hash"]  # what the record said is kept
    # and what it dumps now reads back unchanged
    assert LaunchSpec.model_validate_json(spec.model_dump_json()) == spec


def test_old_records_of_both_kinds_are_covered() -> None:
    kinds = {json.loads(p.read_text())["runtime"] for p in V1.glob("*.json")}
    assert kinds == {"docker", "process"}


def test_an_old_record_with_a_foreign_option_set_is_refused_not_dropped() -> None:
    old = json.loads((V1 / "cpu-smollm2.json").read_text())
    with pytest.raises(pydantic.ValidationError, match="image"):
        LaunchSpec.model_validate({**old, "image": "engine:1"})  # a process launch cannot carry an image


def test_store_reads_a_record_written_before_issue_13(tmp_path: Path) -> None:
    from controller.store import Store

    old = json.loads((V1 / "gfx906-c-tp4-graph-piecewise.json").read_text())
    store = Store(tmp_path / "launches.db")
    try:
        spec = LaunchSpec.model_validate(old)
        from controller.runtime.base import Provenance

        store.create_launch("L1", spec, "cold", Provenance(), 0.0)
        # rewrite the stored JSON as the old controller wrote it
        store._db.execute("UPDATE launches SET spec_json = ? WHERE id = 'L1'", (json.dumps(old),))
        rows = store._db.execute("SELECT image, runtime FROM launches").fetchall()
        assert tuple(rows[0]) == (old["image"], "docker")  # the columns the record always had
        read = store.get_spec("L1")  # what an adopting controller reads back
        assert read is not None and read.runtime == spec.runtime and read.kind == "docker"
    finally:
        store.close()


# -- one translation: the runtime creates what the render prints --------------------------------------


class _Image:
    id = "sha256:" + "0" * 64
    attrs: ClassVar[dict[str, Any]] = {"RepoDigests": []}


class _Container:
    name = "appliance-x"
    id = short_id = "c0ffee"
    attrs: ClassVar[dict[str, Any]] = {"State": {"StartedAt": "2026-11-29T07:21:40.5Z", "Running": True}}

    def put_archive(self, path: str, data: bytes) -> bool:
        return True  # the container wrapper's files (this test gives no key)

    def start(self) -> None: ...
    def reload(self) -> None: ...
    def remove(self, force: bool = False) -> None: ...


class _Client:
    """The docker SDK client at the seam: records what the runtime asks the daemon to create."""

    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []
        client = self

        class Images:
            def get(self, name: str) -> _Image:
                return _Image()

        class Containers:
            def create(self, **kwargs: Any) -> _Container:
                client.created.append(kwargs)
                return _Container()

        self.images, self.containers = Images(), Containers()


def _plain(kwargs: dict[str, Any]) -> Any:
    """SDK types (Ulimit, DeviceRequest are dicts) and tuples → the JSON the render prints."""
    return json.loads(json.dumps(kwargs))


DOCKER_RECIPES = [n for n in SHIPPED if pure_registry.for_recipe(shipped()[n]).kind == "docker"]


@pytest.mark.parametrize("name", DOCKER_RECIPES)
def test_the_docker_runtime_creates_exactly_what_render_docker_py_prints(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = shipped()[name]
    spec = render(recipe, fixed_facts())
    # Cache dirs and ports are the host's business, not the create call's: keep them out of the way.
    monkeypatch.setattr("controller.runtime.docker.ensure_cache_dirs", lambda spec: None)
    client = _Client()
    runtime = DockerRuntime(client, port_check=lambda host, port: None)  # type: ignore[arg-type]
    runtime.mountinfo = tmp_path / "no-mountinfo"  # on a host: paths pass through
    runtime.start(spec, manual_launch_id(spec))
    printed = json.loads(formats.format_spec(spec, "docker-py", recipe))
    assert printed["entrypoint"] == [spec.command()[0]] and printed["name"] == f"appliance-manual-{name}"
    # One difference, by design: the runtime runs the printed argv under its key-redacting container
    # wrapper (a hand-run container has no wrapper files; the render says so).
    wrapped = spec.sourced(wrapped_argv(spec.argv, key_file=False))
    assert [_plain(k) for k in client.created] == [
        {**printed, "entrypoint": [wrapped[0]], "command": list(wrapped[1:])}]


def test_the_key_file_flag_is_the_only_difference() -> None:
    """The launch's key reaches vLLM as `--config FILE` at one path for every launch,
    never in the environment (vLLM 0.26.0 hashes VLLM_API_KEY into its compile-cache key)."""
    from appliance.engine_secret import CONTAINER_KEY_PATH
    from appliance.runtimes.docker import container_kwargs

    spec = render(shipped()[C], fixed_facts())
    with_key = container_kwargs(spec, "L1", key_file=True)
    without = container_kwargs(spec, "L1")
    assert with_key["command"] == [*without["command"], "--config", CONTAINER_KEY_PATH]
    assert {k: v for k, v in with_key.items() if k != "command"} == \
        {k: v for k, v in without.items() if k != "command"}


# -- registries --------------------------------------------------------------------------------------


def test_formats_are_the_generic_ones_plus_every_plugins() -> None:
    expected = set(formats.GENERIC_FORMATS)
    for plugin in pure_registry.PLUGINS.values():
        expected |= set(plugin.formats)
    assert set(formats.FORMATS) == expected
    assert {"docker", "docker-py", "compose", "shell", "vllm-config", "json"} <= expected


def test_a_new_plugins_format_is_available_through_the_registry_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Extra:
        kind = "extra"
        formats: ClassVar[dict[str, Any]] = {
            "extra-fmt": lambda spec, recipe: f"{spec.recipe} {recipe.name if recipe else '-'}\n"}

    plugins = {**pure_registry.PLUGINS, "extra": Extra()}
    monkeypatch.setattr(pure_registry, "PLUGINS", plugins)
    recipe = shipped()[C]
    spec = render(recipe, fixed_facts())
    assert formats.format_spec(spec, "extra-fmt", recipe) == f"{C} {C}\n"
    with pytest.raises(FormatError, match="extra-fmt"):
        formats.format_spec(spec, "nope")


def test_both_registries_know_the_same_kinds() -> None:
    assert set(pure_registry.KINDS) == set(effect_registry.KINDS)


def test_the_unions_are_built_from_the_plugins() -> None:
    spec = launch_spec("docker", {"image": "engine:1"})
    assert isinstance(spec.runtime, DockerLaunch) and spec.kind == "docker"
    assert isinstance(launch_spec("process", {"python": "py"}).runtime, ProcessLaunch)
    with pytest.raises(pydantic.ValidationError):
        launch_spec("podman", {})
    section = Recipe.model_fields["runtime"]
    assert section.discriminator == "kind" or "kind" in repr(section)


def test_make_runtime_imports_lazily_and_rejects_unknown_kinds(tmp_path: Path) -> None:
    assert effect_registry.make_runtime("process", tmp_path).name == "process"
    with pytest.raises(ValueError, match="unknown runtime kind 'podman'"):
        effect_registry.make_runtime("podman", tmp_path)


# -- optional capabilities of the effectful halves -----------------------------------------------------


def test_capabilities_are_found_by_protocol_not_by_class(tmp_path: Path) -> None:
    from controller.runtime.base import ContainerScoped, EngineFiles, ProvenanceSource

    docker_rt = DockerRuntime(_Client())  # type: ignore[arg-type]
    process_rt = effect_registry.make_runtime("process", tmp_path)
    assert all(isinstance(docker_rt, c) for c in (ContainerScoped, ProvenanceSource, EngineFiles))
    assert isinstance(process_rt, ProvenanceSource)
    assert not isinstance(process_rt, ContainerScoped | EngineFiles)  # its engine sees this host


def test_proof_digests_a_file_inside_the_container_through_the_runtime() -> None:
    import hashlib
    import io
    import tarfile

    from controller.evaluation.proof import engine_file_digests
    from controller.runtime.base import EngineHandle

    payload = b"kernel library"
    blob = io.BytesIO()
    with tarfile.open(fileobj=blob, mode="w") as tar:
        info = tarfile.TarInfo("lib.so")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))

    client = _Client()

    class Stored:
        def get_archive(self, path: str) -> tuple[list[bytes], dict[str, Any]]:
            if path != "/opt/lib.so":
                raise FileNotFoundError(path)
            return [blob.getvalue()], {}

    client.containers.get = lambda ref: Stored()  # type: ignore[attr-defined]
    handle = EngineHandle(launch_id="L1", runtime="docker", ref="c0ffee", recipe="r", spec_hash="h",
                          started_at=0.0)
    digests = engine_file_digests(DockerRuntime(client), handle, ["/opt/lib.so", "/opt/missing"])  # type: ignore[arg-type]
    assert digests == {"/opt/lib.so": hashlib.sha256(payload).hexdigest(), "/opt/missing": None}
