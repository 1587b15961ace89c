"""How to start the embedded CPU engine outside the supervisor: the default recipe, rendered.

One source of truth: the argv and the environment are what `render()` makes of
recipes/cpu-smollm2.yaml — exactly what the supervisor launches — with only the cache root (and the
port) overridable, so the measuring harness (`bench.engine_trial`) and the tests that start a
real engine cannot drift from the recipe. Why each variable is there: the recipe's `why` fields and
docs/engine-cpu.md. `prepare_cache_dirs` is the one effectful helper.
"""

from __future__ import annotations

from pathlib import Path

from appliance.host_facts import HostFacts
from appliance.recipe.launch_spec import LaunchSpec
from appliance.recipe.recipe_model import Recipe
from appliance.recipe.render import render
from controller.catalogue import Catalogue
from controller.settings import DEFAULT_RECIPE, paths, recipes_dir
from host_setup.facts import gather_facts

# torch loggers whose INFO lines say whether the compiled graph came from the cache
# (`fx graph cache hit|miss for key …`, `AOTAutograd cache hit|miss for key …`). The recipe sets
# TORCH_LOGS to this; a unit test keeps the two equal.
CACHE_PROOF_TORCH_LOGS = "torch._inductor.codecache,torch._functorch._aot_autograd.autograd_cache"


def default_recipe(directory: Path | None = None) -> Recipe:
    """The embedded default recipe (`cpu-smollm2`) as shipped in `directory` (default: `recipes_dir()`)."""
    return Catalogue(directory if directory is not None else recipes_dir()).load()[DEFAULT_RECIPE]


def launch_spec(
    cache_root: Path | None = None,
    *,
    port: int | None = None,
    facts: HostFacts | None = None,
    recipe: Recipe | None = None,
) -> LaunchSpec:
    """The rendered default recipe; `cache_root` replaces the variant root, `port` the engine port.

    `facts` default to this host's (`gather_facts` with the appliance home of `settings.paths()`, so
    `${APPLIANCE_HOME}` means the engine venv and model that `appliance engine setup` installed).
    """
    base = recipe if recipe is not None else default_recipe()
    if port is not None:  # where it listens is not a compile input: same cache key
        base = base.model_copy(update={"engine": base.engine.model_copy(update={"port": port})})
    host = facts if facts is not None else gather_facts(Path("/"), appliance_home=paths().home)
    return render(base, host, cache_root=str(cache_root) if cache_root is not None else None)


def engine_env(cache_root: Path, *, facts: HostFacts | None = None) -> dict[str, str]:
    """The environment the default recipe gives the engine, with its caches under `cache_root`."""
    return dict(launch_spec(cache_root, facts=facts).env)


def prepare_cache_dirs(spec: LaunchSpec) -> None:
    """Create the directories the spec's env pins (`LaunchSpec.cache_dirs`) before the start:
    `tempfile` silently falls back to /tmp when TMPDIR is missing (docs/engine-cpu.md)."""
    for directory in spec.cache_dirs():
        Path(directory).mkdir(parents=True, exist_ok=True)
