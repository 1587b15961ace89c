"""LaunchSpecs for the runtime tests, in one place: rendered by the real `render()` from a recipe.

The runtime contract (test_runtime_contract.py) runs a stand-in engine
(tests/fixtures/engines/standin: a fake `vllm` package on PYTHONPATH), so the recipe renders the
real vLLM command line — `python -m vllm.entrypoints.openai.api_server --model … --port …` — and the
runtime runs exactly that, in a process under the test interpreter or in a container of the
appliance image (which has Python). Only this module knows how a LaunchSpec is shaped: when the
spec changes (as with the `runtime:` sub-model), this is the one place the tests adapt.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from appliance.host_facts import HostFacts
from appliance.recipe.launch_spec import LaunchSpec
from appliance.recipe.recipe_loader import parse_recipes
from appliance.recipe.render import render
from appliance.runtimes.docker import DockerLaunch
from tests.unit.spec_helpers import launch_spec

REPO = Path(__file__).resolve().parents[2]
STANDIN_DIR = REPO / "tests" / "fixtures" / "engines" / "standin"
# Where the stand-in's directory is mounted in a container (as the recipe's "model" folder).
STANDIN_MOUNT = "/opt/standin"
RECIPE_NAME = "contract-standin"
SERVED_NAME = "standin"
# Runtime kinds with a stand-in launch here → the pytest markers their tests carry.
STANDIN_KINDS: dict[str, tuple[str, ...]] = {"process": (), "docker": ("docker",)}


def standin_recipe(kind: str, port: int, *, image: str | None = None,
                   env: Mapping[str, str] | None = None) -> dict[str, object]:
    """The stand-in's recipe, as an operator would write it. Docker: host network like the shipped
    cpu-smollm2-docker (the engine binds the host's loopback port itself, so the port check and the
    port's holder are the same for both runtimes); the stand-in's directory is the "model" mount."""
    if kind == "process":
        runtime: dict[str, object] = {"kind": "process", "python": sys.executable}
        model: dict[str, object] = {"path": str(STANDIN_DIR), "served_name": SERVED_NAME}
        pythonpath = str(STANDIN_DIR)
    elif kind == "docker":
        if image is None:
            raise ValueError("the docker stand-in needs an image with Python")
        runtime = {"kind": "docker", "image": image, "network": "host", "ipc": "private"}
        model = {"path": STANDIN_MOUNT, "host_path": str(STANDIN_DIR), "served_name": SERVED_NAME}
        pythonpath = STANDIN_MOUNT
    else:
        raise ValueError(f"no stand-in recipe for runtime {kind!r}")
    variables: dict[str, object] = {
        "PYTHONPATH": {"value": pythonpath, "why": "finds the stand-in `vllm` package first"},
        "PYTHONUNBUFFERED": "1",
        "VLLM_LOGGING_LEVEL": "INFO",
    }
    variables.update(env or {})
    return {
        "name": RECIPE_NAME,
        "platform": "cpu",
        "runtime": runtime,
        "model": model,
        "engine": {"tensor_parallel_size": 1, "dtype": "bfloat16", "max_model_len": 512, "mode": "eager",
                   "host": "127.0.0.1", "port": port},
        "env": {"vars": variables},
        "expect": {"ready_budget_s": 60, "stall_window_s": 60},
        "cache": {"root": "${APPLIANCE_HOME}/cache"},
    }


def facts(home: Path) -> HostFacts:
    """Fixed facts (the render must not depend on the machine), APPLIANCE_HOME in a temp dir."""
    gib = 1024**3
    return HostFacts(mem_total_bytes=32 * gib, mem_available_bytes=30 * gib, swap_total_bytes=4 * gib,
                     swap_free_bytes=4 * gib, swappiness=60, appliance_home=str(home))


def standin_spec(kind: str, home: Path, port: int, *, image: str | None = None,
                 env: Mapping[str, str] | None = None) -> LaunchSpec:
    """Load the recipe through the recipe loader (YAML, as shipped recipes are) and render it."""
    text = yaml.safe_dump(standin_recipe(kind, port, image=image, env=env), sort_keys=False)
    recipe = parse_recipes({f"{RECIPE_NAME}.yaml": text})[RECIPE_NAME]
    return render(recipe, facts(home))


def process_spec(argv: Sequence[str], *, env: Mapping[str, str], **common: Any) -> LaunchSpec:
    """A hand-built process launch; argv[0] is the engine's interpreter."""
    fields: dict[str, Any] = {"recipe": "fake-engine", "spec_hash": "0123456789abcdef", "port": 1,
                              "served_model_name": "fake", "cache_root": "/tmp", **common}
    return launch_spec("process", {"python": argv[0]}, argv=tuple(argv), env=dict(env), **fields)


def docker_spec(image: str, argv: Sequence[str], *, env: Mapping[str, str],
                docker: Mapping[str, Any] | None = None, **common: Any) -> LaunchSpec:
    """A hand-built docker launch; `docker`: the container's options (mounts, devices, ipc_mode,
    published_ports...), the LaunchSpec's docker `runtime:` sub-model."""
    fields: dict[str, Any] = {"recipe": "busybox-engine", "spec_hash": "00112233aabbccdd", "port": 8000,
                              "served_model_name": "fake", "cache_root": "/cache", **common}
    return launch_spec("docker", {"image": image, **(docker or {})}, argv=tuple(argv), env=dict(env),
                       **fields)


def with_argv(spec: LaunchSpec, argv: Sequence[str]) -> LaunchSpec:
    """The same launch running another command (a start error the recipe cannot express)."""
    return spec.model_copy(update={"argv": tuple(argv)})


def docker_options(spec: LaunchSpec) -> DockerLaunch:
    """The container options of a docker spec (its `runtime:` sub-model)."""
    options = spec.runtime
    if not isinstance(options, DockerLaunch):
        raise TypeError(f"{spec.recipe} is not a docker launch ({options.kind})")
    return options
