"""format_spec(): every format says the same launch."""

from __future__ import annotations

import json
import shlex

import pytest
import yaml

from appliance.recipe.formats import FORMATS, FormatError, format_spec, vllm_config
from appliance.recipe.launch_spec import LaunchSpec
from appliance.recipe.render import render
from appliance.runtimes.docker import HAND_RUN_LOG_NOTE
from tests.unit.recipe_helpers import C, fixed_facts, shipped


@pytest.fixture
def gfx() -> LaunchSpec:
    return render(shipped()[C], fixed_facts())


@pytest.fixture
def cpu() -> LaunchSpec:
    return render(shipped()["cpu-smollm2"], fixed_facts())


def test_docker_command_round_trips_through_a_shell(gfx: LaunchSpec) -> None:
    text = format_spec(gfx, "docker")
    assert HAND_RUN_LOG_NOTE in text.splitlines()  # what a hand run means for the daemon's log
    body = "\n".join(ln for ln in text.splitlines() if not ln.startswith("#"))
    words = shlex.split(body.replace("\\\n", " "))
    assert words[:3] == ["docker", "run", "-d"]
    image_at = words.index(gfx.runtime.engine_image() or "")
    assert words[image_at - 2:image_at] == ["--entrypoint", "bash"]
    assert tuple(words[image_at + 1:]) == gfx.command()[1:]
    assert "--memory" not in words
    assert words[words.index("--ulimit"):words.index("--ulimit") + 2] == ["--ulimit", "memlock=-1:-1"]
    assert "127.0.0.1:8000:8000" in words
    assert f"HIP_VISIBLE_DEVICES={gfx.env['HIP_VISIBLE_DEVICES']}" in words


def test_docker_py_kwargs(gfx: LaunchSpec) -> None:
    kwargs = json.loads(format_spec(gfx, "docker-py"))
    # The runtime's split (the render used to pass the whole command as the entrypoint).
    assert kwargs["entrypoint"] == [gfx.command()[0]]
    assert kwargs["command"] == list(gfx.command()[1:])
    assert kwargs["name"] == f"appliance-manual-{gfx.recipe}"
    assert kwargs["environment"] == gfx.env
    assert kwargs["ulimits"] == [{"Name": "memlock", "Soft": -1, "Hard": -1}]
    assert kwargs["ports"] == {"8000/tcp": ["127.0.0.1", 8000]}
    assert kwargs["restart_policy"] == {"Name": "no"}
    assert "mem_limit" not in kwargs


def test_compose_service(gfx: LaunchSpec) -> None:
    text = format_spec(gfx, "compose")
    assert HAND_RUN_LOG_NOTE in text.splitlines()  # what a hand run means for the daemon's log
    service = yaml.safe_load(text)["services"]["engine"]
    # `exec "$@"` of the sourcing wrapper is written `$$@`: compose reads it back as `$@`.
    assert service["entrypoint"] + service["command"] == [a.replace("$", "$$") for a in gfx.command()]
    assert any("$$@" in a for a in service["command"])
    assert service["restart"] == "no"
    assert service["ulimits"] == {"memlock": {"soft": -1, "hard": -1}}
    assert service["ports"] == ["127.0.0.1:8000:8000"]
    assert "mem_limit" not in service


def test_shell_script_exports_everything_then_execs(cpu: LaunchSpec) -> None:
    lines = format_spec(cpu, "shell").splitlines()
    exports = {line.split("=", 1)[0][len("export "):] for line in lines if line.startswith("export ")}
    assert exports == set(cpu.env)
    root = cpu.cache_root
    dirs = [f"{root}/{d}" for d in ("inductor", "tmp", "triton", "vllm")]
    assert shlex.split(lines[-2]) == ["mkdir", "-p", *dirs]
    assert shlex.split(lines[-1]) == ["exec", *cpu.argv]


def test_shell_script_sources_and_raises_memlock(gfx: LaunchSpec) -> None:
    text = format_spec(gfx, "shell")
    assert "if ! ulimit -l unlimited 2>/dev/null; then\n" in text
    assert text.index("ulimit -l unlimited") < text.index(". /opt/dtk/env.sh\n. /src/tools/dcu/env.sh\n")


def test_vllm_config(gfx: LaunchSpec) -> None:
    config = yaml.safe_load(format_spec(gfx, "vllm-config"))
    assert config == vllm_config(gfx)
    assert config["model"] == "/models/qwen3.8-27b-w8a8"
    assert config["compilation-config"] == {"cudagraph_mode": "PIECEWISE"}
    assert config["cudagraph-capture-sizes"] == [1, 2, 4, 8]
    assert config["max-num-batched-tokens"] == 2048
    assert config["override-generation-config"] == {"temperature": 0.7, "repetition_penalty": 1.05}
    assert config["disable-custom-all-reduce"] is True


def test_a_spec_refuses_env_names_that_are_not_posix(gfx: LaunchSpec) -> None:
    from pydantic import ValidationError

    for name in ("X=1; touch p; Y", "Z$(touch q)"):
        with pytest.raises(ValidationError, match="not POSIX names"):
            LaunchSpec.model_validate({**gfx.model_dump(), "env": {**gfx.env, name: "1"}})


def test_json_is_the_spec(gfx: LaunchSpec) -> None:
    assert LaunchSpec.model_validate_json(format_spec(gfx, "json")) == gfx


@pytest.mark.parametrize("fmt", ["docker", "docker-py", "compose"])
def test_container_formats_refuse_a_process_recipe(cpu: LaunchSpec, fmt: str) -> None:
    with pytest.raises(FormatError, match="runs as a process"):
        format_spec(cpu, fmt)


def test_unknown_format_lists_the_known_ones(gfx: LaunchSpec) -> None:
    with pytest.raises(FormatError) as info:
        format_spec(gfx, "podman")
    assert all(f in str(info.value) for f in FORMATS)
