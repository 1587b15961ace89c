"""Print a LaunchSpec in the forms operators use: `format_spec(spec, fmt) -> str`. Pure.

Every format says the same launch (argv, env, mounts, ulimits, ports, labels) so a hand-run
`docker run` and the appliance's own launch cannot drift apart. None of them sets a memory limit:
DOMAIN §3 — a cgroup limit counts page cache (29 GB of mmapped weights), and `docker update
--memory=0` means "unchanged", so the container must be *created* without one.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from typing import Any

import yaml

from appliance.launch_spec import LaunchSpec, Ulimit

FORMATS = ("docker", "docker-py", "compose", "shell", "vllm-config", "json")


class FormatError(ValueError):
    """A format that does not apply to this spec, or an unknown format name."""


def format_spec(spec: LaunchSpec, fmt: str) -> str:
    writers: dict[str, Callable[[LaunchSpec], str]] = {
        "docker": _docker, "docker-py": _docker_py, "compose": _compose, "shell": _shell,
        "vllm-config": _vllm_config, "json": lambda s: s.model_dump_json(indent=2) + "\n",
    }
    if fmt not in writers:
        raise FormatError(f"unknown format '{fmt}'; choose one of: {', '.join(FORMATS)}")
    return writers[fmt](spec)


def _need_image(spec: LaunchSpec, fmt: str) -> str:
    if spec.image is None:
        raise FormatError(f"format '{fmt}' needs a docker recipe; '{spec.recipe}' runs as a process "
                          f"(use --format shell or json)")
    return spec.image


def _ulimit_text(u: Ulimit) -> str:
    return f"{u.name}={u.soft}:{u.hard}"


def container_name(spec: LaunchSpec) -> str:
    return f"appliance-{spec.recipe}"


def _docker(spec: LaunchSpec) -> str:
    image = _need_image(spec, "docker")
    cmd = spec.command()
    opts: list[list[str]] = [["--name", container_name(spec)], ["--restart", "no"]]
    opts += [["--label", f"{k}={v}"] for k, v in sorted(spec.labels.items())]
    if spec.network_mode:
        opts.append([f"--network={spec.network_mode}"])
    if spec.ipc_mode:
        opts.append([f"--ipc={spec.ipc_mode}"])
    if spec.shm_size:
        opts.append([f"--shm-size={spec.shm_size}"])
    opts += [[f"--device={d}"] for d in spec.devices]
    if spec.gpus:
        opts.append(["--gpus", spec.gpus])
    opts += [["--group-add", g] for g in spec.group_add]
    opts += [["--security-opt", s] for s in spec.security_opt]
    opts += [["--ulimit", _ulimit_text(u)] for u in spec.ulimits]
    opts += [["-p", f"{spec.host}:{hp}:{port}"] for port, hp in sorted(spec.published_ports.items())]
    opts += [["-v", f"{m.source}:{m.target}" + (":ro" if m.read_only else "")] for m in spec.mounts]
    opts += [["-e", f"{k}={v}"] for k, v in spec.env.items()]
    opts += [["--entrypoint", cmd[0]]]
    lines = ["# no --memory: the container must be created without a memory limit (DOMAIN §3)",
             "docker run -d \\"]
    lines += [f"  {shlex.join(o)} \\" for o in opts]
    lines.append(f"  {shlex.quote(image)} \\")
    lines.append("  " + shlex.join(cmd[1:]))
    return "\n".join(lines) + "\n"


def docker_py_kwargs(spec: LaunchSpec) -> dict[str, Any]:
    """Keyword arguments for docker SDK `containers.run(**kwargs)` (ulimits/device_requests as dicts)."""
    image = _need_image(spec, "docker-py")
    kwargs: dict[str, Any] = {
        "image": image,
        "name": container_name(spec),
        "entrypoint": list(spec.command()),
        "command": [],
        "environment": dict(spec.env),
        "volumes": {m.source: {"bind": m.target, "mode": "ro" if m.read_only else "rw"} for m in spec.mounts},
        "devices": [f"{d}:{d}:rwm" for d in spec.devices],
        "group_add": list(spec.group_add),
        "ipc_mode": spec.ipc_mode,
        "shm_size": spec.shm_size,
        "network_mode": spec.network_mode,
        "security_opt": list(spec.security_opt),
        "ulimits": [{"Name": u.name, "Soft": u.soft, "Hard": u.hard} for u in spec.ulimits],
        "ports": {f"{p}/tcp": [spec.host, hp] for p, hp in sorted(spec.published_ports.items())},
        "labels": dict(spec.labels),
        "restart_policy": {"Name": spec.restart_policy},
        "detach": True,
    }
    if spec.gpus:
        kwargs["device_requests"] = [{"Driver": "nvidia", "Count": -1, "Capabilities": [["gpu"]]}]
    return kwargs


def _docker_py(spec: LaunchSpec) -> str:
    return json.dumps(docker_py_kwargs(spec), indent=2) + "\n"


def _compose(spec: LaunchSpec) -> str:
    image = _need_image(spec, "compose")
    service: dict[str, Any] = {
        "image": image,
        "container_name": container_name(spec),
        "entrypoint": list(spec.command()),
        "environment": dict(spec.env),
        "volumes": [f"{m.source}:{m.target}" + (":ro" if m.read_only else "") for m in spec.mounts],
        "restart": "no",
        "labels": dict(spec.labels),
    }
    optional: dict[str, Any] = {
        "devices": list(spec.devices), "group_add": list(spec.group_add), "ipc": spec.ipc_mode,
        "shm_size": spec.shm_size, "network_mode": spec.network_mode,
        "security_opt": list(spec.security_opt),
        "ulimits": {u.name: {"soft": u.soft, "hard": u.hard} for u in spec.ulimits},
        "ports": [f"{spec.host}:{hp}:{p}" for p, hp in sorted(spec.published_ports.items())],
    }
    service.update({k: v for k, v in optional.items() if v})
    if spec.gpus:
        service["deploy"] = {"resources": {"reservations": {"devices": [
            {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]}}}
    doc = {"services": {"engine": compose_escape(service)}}
    header = ("# compose service for recipe '{}' (spec {}); no mem_limit by design (DOMAIN §3)\n"
              "# every '$' is written '$$': compose interpolates values, this file states them literally\n")
    return header.format(spec.recipe, spec.spec_hash) + yaml.safe_dump(doc, sort_keys=False, width=200)


def compose_escape(value: Any) -> Any:
    """Every string value with `$` doubled: compose would read `$HOME` as the caller's variable and
    `$(` or `$@` (the sourcing wrapper's `exec "$@"`) as an interpolation error, so the file would
    not describe the launch the other formats describe. Keys are names (POSIX env names, label keys)."""
    if isinstance(value, str):
        return value.replace("$", "$$")
    if isinstance(value, dict):
        return {k: compose_escape(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [compose_escape(v) for v in value]
    return value


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
    args = list(spec.argv)
    # The launcher part ends at the first long flag (`-c`/`-m` and the code/module are not flags).
    start = next((i for i, a in enumerate(args) if a.startswith(("--", "-cc."))), len(args))
    config: dict[str, Any] = {}
    if "serve" in args[:start]:
        config["model"] = args[args.index("serve") + 1]
    i = start
    while i < len(args):
        flag = args[i]
        if flag.startswith("-cc."):
            key, _, value = flag[4:].partition("=")
            config.setdefault("compilation-config", {})[key] = value
            i += 1
            continue
        values: list[str] = []
        i += 1
        while i < len(args) and not args[i].startswith(("--", "-cc.")):
            values.append(args[i])
            i += 1
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
