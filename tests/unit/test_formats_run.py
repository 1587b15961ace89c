"""The rendered launch, run for real where that is cheap and harmless:

- the shell script under a hard memlock limit lower than the recipe needs (DOMAIN §3: a container's
  64 MB default) must say which limit and the fix, and stop — never a silent `set -e` exit 1;
- the compose file, read back by the installed compose (`docker compose` or Debian's
  `docker-compose`), must give the same values as the spec (`$` escaped as `$$`).

The scripts' `exec` line is replaced by an `echo`, so no engine starts.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from appliance.host_facts import HostFacts
from appliance.recipe.formats import MEMLOCK_EXIT, format_spec
from appliance.recipe.launch_spec import LaunchSpec, Ulimit
from appliance.recipe.render import render
from tests.unit.recipe_helpers import B, shipped, with_changes

REACHED = "REACHED-EXEC"


def facts(home: Path) -> HostFacts:
    return HostFacts(mem_total_bytes=32 * 1024**3, mem_available_bytes=30 * 1024**3,
                     swap_total_bytes=4 * 1024**3, swap_free_bytes=4 * 1024**3, swappiness=60,
                     appliance_home=str(home))


def runnable_script(spec: LaunchSpec) -> str:
    """The shell render with its sourced platform files dropped and `exec …` made harmless."""
    text = format_spec(spec.model_copy(update={"source_files": ()}), "shell")
    head, last = text.rstrip("\n").rsplit("\n", 1)
    assert last.startswith("exec ")
    return f"{head}\necho {REACHED}\n"


def run_under_hard_memlock(script: Path, hard_kib: int) -> subprocess.CompletedProcess[str]:
    # Lowering a hard limit needs no privilege; the subshell keeps it away from the test process.
    return subprocess.run(["bash", "-c", f'ulimit -S -l {hard_kib} && ulimit -H -l {hard_kib} && bash "$0"',
                           str(script)], capture_output=True, text=True, timeout=60)


def current_hard_kib() -> int:
    import resource

    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    return 64 * 1024 if hard == resource.RLIM_INFINITY else hard // 1024


@pytest.fixture
def gfx_spec(tmp_path: Path) -> LaunchSpec:
    return render(shipped()[B], facts(tmp_path / "home"))  # memlock unlimited (S11f §10.1)


def test_memlock_below_what_the_recipe_needs_stops_with_the_limit_and_the_fix(
        tmp_path: Path, gfx_spec: LaunchSpec) -> None:
    assert [u for u in gfx_spec.ulimits if u.name == "memlock"]
    script = tmp_path / "launch.sh"
    script.write_text(runnable_script(gfx_spec))
    # The container default is 64 MB; this machine may already be lower (it cannot be raised here).
    hard = min(64 * 1024, current_hard_kib())
    done = run_under_hard_memlock(script, hard)
    assert done.returncode == MEMLOCK_EXIT, done
    assert REACHED not in done.stdout
    assert f"hard limit is {hard}" in done.stderr
    assert f"appliance host apply {gfx_spec.recipe} --yes" in done.stderr
    assert "limits.d" in done.stderr and "memlock=-1" in done.stderr


def test_memlock_within_the_hard_limit_goes_on(tmp_path: Path, gfx_spec: LaunchSpec) -> None:
    half_mib = Ulimit(name="memlock", soft=512 * 1024, hard=512 * 1024)
    spec = gfx_spec.model_copy(update={"ulimits": (half_mib,)})
    script = tmp_path / "launch.sh"
    script.write_text(runnable_script(spec))
    done = run_under_hard_memlock(script, min(1024, current_hard_kib()))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith(REACHED)


def unescape(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("$$", "$")
    if isinstance(value, dict):
        return {k: unescape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unescape(v) for v in value]
    return value


def _compose_cli() -> list[str] | None:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def test_compose_reads_back_the_same_values(tmp_path: Path) -> None:
    cli = _compose_cli()
    if cli is None:
        pytest.skip("neither `docker compose` nor `docker-compose` is installed (scripts/setup-system.sh)")
    recipe = with_changes(shipped()[B], env__vars__WEIRD={"value": "$HOME $(touch q) ${X:-y} $$ `id`"})
    spec = render(recipe, facts(tmp_path / "home"))
    compose = tmp_path / "compose.yaml"
    compose.write_text(format_spec(spec, "compose"))
    done = subprocess.run([*cli, "-f", str(compose), "config"], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"})
    assert done.returncode == 0, done.stderr
    # `config` prints a valid compose file, so it escapes `$` again: undo that one level to compare.
    service = unescape(yaml.safe_load(done.stdout)["services"]["engine"])
    assert service["environment"]["WEIRD"] == "$HOME $(touch q) ${X:-y} $$ `id`"
    assert service["environment"] == {k: v for k, v in spec.env.items()}
    assert service["entrypoint"] + service["command"] == list(spec.command())
    assert service["labels"].items() >= spec.labels.items()  # plus the launch id the runtime adds
    assert not (tmp_path / "q").exists()
    json.dumps(service)  # plain data
