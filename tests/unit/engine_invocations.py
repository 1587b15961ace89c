"""Each shipped recipe's engine environment and argv exactly as its runtime starts it (for the
compile-key guard): the same functions the runtimes call, nothing re-typed here.

- process: `engine_env(spec.env)` and `ProcessRuntime.engine_command` (the spec's argv plus `--config`
  at the variant's key file path);
- docker: `appliance.runtimes.docker.container_kwargs(…, key_file=True)` (what DockerRuntime.create
  hands the daemon: `environment`, `entrypoint` + `command`);
- kubernetes: the Deployment of `k8s/manifests.manifests` (its container's env values and command).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from appliance.recipe.launch_spec import LaunchSpec
from appliance.recipe.render import render
from appliance.runtimes import docker as docker_plugin
from appliance.runtimes.k8s.manifests import manifests
from controller.runtime.process import ProcessRuntime, engine_env
from controller.supervisor.launch_key import launch_key
from tests.unit.recipe_helpers import fixed_facts, shipped

K8S_IMAGE = "registry.example/engine:1"


@dataclass(frozen=True)
class Invocation:
    recipe: str
    kind: str
    launch_id: str
    key: str | None  # the key the runtime delivered (None: the recipe brings its own)
    env: dict[str, str]
    argv: tuple[str, ...]


def specs() -> dict[str, LaunchSpec]:
    return {name: render(recipe, fixed_facts()) for name, recipe in sorted(shipped().items())
            if not recipe.abstract}


def invocation(spec: LaunchSpec, launch_id: str, runs_dir: Path) -> Invocation:
    _, deliver = launch_key(spec)  # a fresh key per launch, as the driver makes it
    if spec.kind == "process":
        env = engine_env(spec.env, parent_env={"PATH": "/usr/bin:/bin", "HOME": "/root"})
        argv = ProcessRuntime(runs_dir).engine_command(spec, with_key=deliver is not None)
    elif spec.kind == "docker":
        kwargs = docker_plugin.container_kwargs(spec, launch_id, key_file=deliver is not None)
        env, argv = dict(kwargs["environment"]), (*kwargs["entrypoint"], *kwargs["command"])
    elif spec.kind == "kubernetes":
        docs = manifests(spec, launch_id=launch_id, image=None if spec.runtime.engine_image() else K8S_IMAGE)
        container = next(d for d in docs if d["kind"] in ("Deployment", "StatefulSet"))[
            "spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: str(e.get("value")) for e in container["env"] if "value" in e}
        argv = tuple(container["command"])
    else:
        raise AssertionError(f"no invocation for runtime kind {spec.kind!r}: add it here")
    return Invocation(spec.recipe, spec.kind, launch_id, deliver, env, argv)
