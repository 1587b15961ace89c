"""Print a LaunchSpec in the forms operators use: `format_spec(spec, fmt, recipe) -> str`. Pure.

Generic formats (shell, vllm-config, json) live here; each runtime plug-in adds its own through the
registry (docker, docker-py, compose: appliance/runtimes/docker.py, written from the very kwargs the
Docker runtime creates the container with). Every format says the same launch (argv, env, mounts,
ulimits, ports, labels) so a hand-run `docker run` and the appliance's own launch cannot drift
apart. None of them sets a memory limit: DOMAIN §3 — a cgroup limit counts page cache (29 GB of
mmapped weights), and `docker update --memory=0` means "unchanged", so the container must be
*created* without one.
"""

from __future__ import annotations

import json
import shlex
from typing import TYPE_CHECKING, Any

import yaml

from appliance.recipe.launch_spec import LaunchSpec, Ulimit
from appliance.runtimes import registry as runtime_registry
from appliance.runtimes.base import Format
from appliance.runtimes.base import FormatError as FormatError  # re-exported: callers catch it here

if TYPE_CHECKING:
    from appliance.recipe.recipe_model import Recipe

# Formats of every kind; each runtime plug-in adds its own (docker, docker-py, compose, ...).
GENERIC_FORMATS = ("shell", "vllm-config", "json")


def writers() -> dict[str, Format]:
    """Generic formats first, then every runtime plug-in's (appliance/runtimes/registry.py)."""
    generic: dict[str, Format] = {
        "shell": lambda s, r: _shell(s), "vllm-config": lambda s, r: _vllm_config(s),
        "json": lambda s, r: s.model_dump_json(indent=2) + "\n",
    }
    plugged = runtime_registry.formats()
    clash = sorted(set(generic) & set(plugged))
    if clash:
        raise RuntimeError(f"runtime plug-ins redefine the generic formats {clash}")
    return {**generic, **plugged}


FORMATS: tuple[str, ...] = tuple(writers())


def format_spec(spec: LaunchSpec, fmt: str, recipe: Recipe | None = None) -> str:
    """`spec` in format `fmt`; `recipe` is the recipe it was rendered from (a format that needs more
    than the spec, e.g. Kubernetes' probes and volumes, raises FormatError without it)."""
    table = writers()
    if fmt not in table:
        raise FormatError(f"unknown format '{fmt}'; choose one of: {', '.join(table)}")
    return table[fmt](spec, recipe)


def _shell(spec: LaunchSpec) -> str:
    lines = ["#!/usr/bin/env bash",
             f"# recipe {spec.recipe}, spec {spec.spec_hash}: run the engine on this host, no container",
             "set -euo pipefail"]
    for u in spec.ulimits:
        if u.name == "memlock":
            lines += _shell_memlock(spec, u)
    lines += [f". {shlex.quote(f)}" for f in spec.source_files]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in spec.env.items()]
    # tempfile silently falls back to /tmp when TMPDIR does not exist: create every pinned dir.
    lines.append("mkdir -p " + " ".join(shlex.quote(d) for d in spec.cache_dirs()))
    if spec.workdir:
        lines.append(f"cd {shlex.quote(spec.workdir)}")
    lines.append("exec " + shlex.join(spec.argv))
    return "\n".join(lines) + "\n"


MEMLOCK_EXIT = 78  # EX_CONFIG (sysexits.h): the host is configured wrong, not the engine


def _shell_memlock(spec: LaunchSpec, u: Ulimit) -> list[str]:
    """Raise memlock, or stop with a message that names the limit and the fix.

    The spec carries a memlock ulimit only for a recipe that needs pinned memory
    (`host.memlock_unlimited`): each worker pins a StagedWriteTensor of max_num_seqs × max_model_len
    × 4 B (S11f §10.1, DOMAIN §3), GB-scale at 262144. Going on under a 64 MB hard limit would fail
    minutes later in load_model() with a hipErrorOutOfMemory that reads like a VRAM problem, so the
    script stops here. Under `set -e` a bare `ulimit -l unlimited` that fails exits 1 without a word.
    """
    want = "unlimited" if u.soft < 0 else str(u.soft // 1024)  # bash counts memlock in KiB
    fix = (f"fix: `appliance host apply {spec.recipe} --yes` (writes /etc/security/limits.d; log in "
           f"again), LimitMEMLOCK=infinity for a systemd service, or in a container --ulimit "
           f"memlock=-1 / dockerd default-ulimits")
    return [
        "# S11f §10.1 (DOMAIN §3): pinned StagedWriteTensor buffers need memlock; stop with the fix if the",
        "# hard limit does not allow it (64 MB is the container default) rather than fail in load_model().",
        f"if ! ulimit -l {want} 2>/dev/null; then",
        f'  echo "appliance: cannot raise the locked-memory limit (ulimit -l, KiB) to {want}: the hard limit '
        f'is $(ulimit -H -l), the soft limit $(ulimit -l)." >&2',
        f"  echo {shlex.quote(f'appliance: recipe {spec.recipe} pins host memory per worker; {fix}')} >&2",
        f"  exit {MEMLOCK_EXIT}",
        "fi",
    ]


def vllm_config(spec: LaunchSpec) -> dict[str, Any]:
    """The engine flags of the argv as a vLLM `--config` mapping (flag name without dashes → value)."""
    config: dict[str, Any] = {}
    if "serve" in spec.launcher and spec.model is not None:
        config["model"] = spec.model
    for flag, *values in spec.flag_groups:
        if flag.startswith("-cc."):
            key, _, value = flag[4:].partition("=")
            config.setdefault("compilation-config", {})[key] = value
            if values:  # words after `-cc.k=v` (render writes none): the first read as a key, as before
                config[values[0].lstrip("-")] = _config_value(values[1:])
            continue
        config[flag.lstrip("-")] = _config_value(values)
    return config


def _config_value(values: list[str]) -> Any:
    if not values:
        return True
    parsed = [_scalar(v) for v in values]
    return parsed[0] if len(parsed) == 1 else parsed


def _scalar(text: str) -> Any:
    if text.startswith(("{", "[")):
        return json.loads(text)
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def _vllm_config(spec: LaunchSpec) -> str:
    header = (f"# vLLM --config for recipe '{spec.recipe}' (spec {spec.spec_hash}).\n"
              f"# The environment is not part of it: see --format shell for the variables.\n")
    return header + yaml.safe_dump(vllm_config(spec), sort_keys=False, width=200)
