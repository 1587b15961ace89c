"""The pure half of a runtime plug-in (issue 13): what a runtime kind means before anything runs.

A runtime kind is two files: this pure half in `appliance/runtimes/<kind>.py` and an effectful half in
`controller/runtime/<kind>.py`, joined by one line in each registry (`appliance/runtimes/registry.py`,
`controller/runtime/registry.py`). Nothing outside a runtime's own files compares `kind` strings or
checks a runtime's class: callers ask the plug-in.

The pure half owns, for its kind:
- `section`: the recipe's `runtime:` model (a pydantic model with `kind: Literal["<kind>"]`);
- `launch`: the LaunchSpec's `runtime:` sub-model (same discriminator), i.e. the fields it renders;
- `render_launch(...)`: recipe section → launch sub-model (mounts, devices, image, interpreter...);
- `listen` / `reach`: where the engine binds inside its runtime, and where the controller reaches it;
- `cache_key_inputs(section)`: what of the section a compile depends on (appliance/cache_key.py);
- `traits`: the host facts admission and the host planner need (does the runtime set its own memlock
  limit at creation, does the engine inherit the controller's cgroup, what must the host provide);
- `lint(recipe)`: findings that only make sense for this kind;
- `formats`: the `appliance recipes render --format NAME` outputs this kind adds;
- `host_cache_dirs(spec)`: host paths of the compile caches (created before start).

Pure: no I/O, sockets, processes or clients here (import-linter's "appliance is pure" contract).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, ClassVar, Literal, Protocol

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from appliance.host_facts import HostFacts
    from appliance.launch_spec import LaunchSpec
    from appliance.lint import Finding
    from appliance.recipe_model import Recipe


class RuntimeSection(BaseModel):
    """Base of every recipe `runtime:` section: frozen, unknown keys rejected. Subclasses add
    `kind: Literal["<kind>"]` and their fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: str


class LaunchRuntime(BaseModel):
    """Base of every LaunchSpec `runtime:` sub-model. Subclasses add `kind: Literal["<kind>"]`."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: str


class RuntimeTraits(BaseModel):
    """What admission and the host planner must know about a kind, as data rather than `if kind ==`."""

    model_config = ConfigDict(frozen=True)

    # The engine's RLIMIT_MEMLOCK is set by the runtime at creation (docker `--ulimit`, a pod's
    # container runtime) rather than inherited from the controller (process).
    sets_own_memlock: bool
    # The engine runs in a cgroup of its own rather than inheriting the controller's (DOMAIN §3).
    own_cgroup: bool
    # Which host-plan family applies to this host: the local Docker daemon, this process, or none
    # (the engine runs on another node; the plan names what that node must have instead).
    host_plan: Literal["docker", "process", "remote"]


# A render format: the spec (and the recipe it came from) → text an operator can run or read.
Format = Callable[["LaunchSpec", "Recipe"], str]


class RuntimePlugin(Protocol):
    kind: ClassVar[str]
    section: ClassVar[type[RuntimeSection]]
    launch: ClassVar[type[LaunchRuntime]]
    traits: ClassVar[RuntimeTraits]
    formats: ClassVar[Mapping[str, Format]]

    def render_launch(self, recipe: Recipe, facts: HostFacts, cache_root: str,
                      env: Mapping[str, str]) -> LaunchRuntime:
        """The launch sub-model of `recipe` (its section is `recipe.runtime`)."""
        ...

    def listen(self, recipe: Recipe) -> str:
        """The address the engine binds inside its runtime (`--host`)."""
        ...

    def reach(self, recipe: Recipe) -> str:
        """The host the controller, probes and gateway use to reach the engine."""
        ...

    def interpreter(self, recipe: Recipe, facts: HostFacts) -> str:
        """The Python that runs the engine, as argv[0] sees it."""
        ...

    def cache_key_inputs(self, recipe: Recipe) -> dict[str, object]:
        """The section's values a compile depends on (image/digest, interpreter...)."""
        ...

    def lint(self, recipe: Recipe) -> list[Finding]:
        """Findings only this kind can make (e.g. a loopback bind inside a bridge container)."""
        ...

    def host_cache_dirs(self, spec: LaunchSpec) -> list[str]:
        """Host paths of the spec's compile-cache directories (they must exist before start)."""
        ...
