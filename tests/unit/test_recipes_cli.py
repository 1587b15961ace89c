"""`appliance recipes …` and `appliance plan` through Typer's CliRunner."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from controller.cli import recipes_cmd
from controller.runtime.registry import Unavailable
from tests.unit.recipe_helpers import C_PRIME, HOSTS, RECIPES_DIR, SHIPPED, B, C

REFERENCE = str(HOSTS / "reference")
SWAP8 = str(HOSTS / "reference-swap8-swappiness200")


@pytest.fixture
def app() -> typer.Typer:
    app = typer.Typer()
    recipes_cmd.register(app)
    return app


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("APPLIANCE_RECIPES", str(RECIPES_DIR))
    monkeypatch.setenv("APPLIANCE_HOME", "/var/lib/appliance")
    return CliRunner()


def run(runner: CliRunner, app: typer.Typer, *args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    assert "Traceback" not in result.stdout + result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


def test_list_json(runner: CliRunner, app: typer.Typer) -> None:
    code, out, _ = run(runner, app, "recipes", "list", "--json")
    rows = json.loads(out)
    assert code == 0
    assert sorted(r["name"] for r in rows if not r["abstract"]) == sorted(SHIPPED)


def test_show_json_has_merged_values_and_cache_key(runner: CliRunner, app: typer.Typer) -> None:
    code, out, _ = run(runner, app, "recipes", "show", C, "--json")
    data = json.loads(out)
    assert code == 0
    assert data["env"]["torch_first_wrapper"] is True  # inherited from gfx906-base
    assert data["engine"]["cudagraph_capture_sizes"] == [1, 2, 4, 8]
    assert len(data["cache_key"]) == 12


def test_render_formats(runner: CliRunner, app: typer.Typer) -> None:
    code, out, _ = run(runner, app, "recipes", "render", C, "--format", "docker", "--host-root", REFERENCE)
    assert code == 0 and "docker run -d" in out
    code, out, _ = run(runner, app, "recipes", "render", "cpu-smollm2", "--json")
    assert code == 0 and json.loads(out)["host"] == "127.0.0.1"
    # No --format: the runtime plug-in's own (a shell script for a process recipe, not a refusal).
    code, out, _ = run(runner, app, "recipes", "render", "cpu-smollm2", "--host-root", REFERENCE)
    assert code == 0 and out.startswith("#!/usr/bin/env bash")
    code, out, _ = run(runner, app, "recipes", "render", C, "--host-root", REFERENCE)
    assert code == 0 and "docker run -d" in out


def test_render_refusals_are_one_line_errors(runner: CliRunner, app: typer.Typer) -> None:
    code, _, err = run(runner, app, "recipes", "render", "gfx906-base")
    assert code == 2 and "abstract" in err
    code, _, err = run(runner, app, "recipes", "render", "cpu-smollm2", "--format", "compose")
    assert code == 2 and "runs as a process" in err
    code, _, err = run(runner, app, "recipes", "render", "nope")
    assert code == 2 and "no recipe named 'nope'" in err


def test_lint_shipped_exits_zero_and_shows_warnings(runner: CliRunner, app: typer.Typer) -> None:
    code, out, _ = run(runner, app, "recipes", "lint")
    assert code == 0
    assert "default-full-graph-gfx906" in out
    code, out, _ = run(runner, app, "recipes", "lint", B, "--json")
    assert code == 0 and [f["rule"] for f in json.loads(out)[B]] == [
        "eval-batch-not-fixed", "rccl-rows-need-nccl-debug"]


def copy_recipes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "recipes"
    shutil.copytree(RECIPES_DIR, d)
    monkeypatch.setenv("APPLIANCE_RECIPES", str(d))
    return d


def test_lint_error_exits_one(runner: CliRunner, app: typer.Typer, tmp_path: Path,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    d = copy_recipes(tmp_path, monkeypatch)
    path = d / f"{B}.yaml"
    path.write_text(path.read_text().replace("  mode: eager\n", "  mode: eager\n  dtype: auto\n"))
    code, out, _ = run(runner, app, "recipes", "lint", B)
    assert code == 1
    assert "error   dtype-auto [engine.dtype]" in out


def test_bad_yaml_is_a_paragraph_naming_file_and_line(runner: CliRunner, app: typer.Typer, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    d = copy_recipes(tmp_path, monkeypatch)
    (d / "broken.yaml").write_text("name: broken\nextends: gfx906-base\nengine: {dtype: float16\n")
    code, out, err = run(runner, app, "recipes", "lint")
    assert code == 2 and out == ""
    assert err.startswith(f"error: {d / 'broken.yaml'}, line 4: YAML syntax error")
    assert err.count("\n") == 1


def test_unknown_key_names_file_field_and_rule(runner: CliRunner, app: typer.Typer, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    d = copy_recipes(tmp_path, monkeypatch)
    (d / "typo.yaml").write_text("name: typo\nextends: gfx906-base\nhost:\n  swapiness: 200\n")
    code, _, err = run(runner, app, "plan", "typo", "--host-root", REFERENCE)
    assert code == 2
    assert f"{d / 'typo.yaml'} line 4, field 'host.swapiness': unknown key 'swapiness'" in err
    assert "did you mean 'swappiness'" in err and "(rule: extra_forbidden)" in err


def test_plan_reference_host_refuses_c(runner: CliRunner, app: typer.Typer) -> None:
    code, out, _ = run(runner, app, "plan", C, "--host-root", REFERENCE)
    assert code == 1
    assert "admission: REFUSE" in out
    assert "refuse swap-total" in out and "docker run -d" in out


def test_plan_json_after_host_changes_admits_c(runner: CliRunner, app: typer.Typer) -> None:
    code, out, _ = run(runner, app, "plan", C, "--host-root", SWAP8, "--json")
    data = json.loads(out)
    assert code == 0 and data["ok"] is True
    assert data["admission"]["verdict"] == "admit"
    assert data["facts"]["swappiness"] == 200
    assert data["launch"]["recipe"] == C
    margins = {c["name"]: c["numbers"]["margin_gib"] for c in data["admission"]["checks"]
               if c["name"].startswith("memory")}
    assert margins == {"memory-peak-cold": 4.93, "memory-peak-warm": 4.93}


def test_plan_b_and_c_prime_on_reference(runner: CliRunner, app: typer.Typer) -> None:
    assert run(runner, app, "plan", B, "--host-root", REFERENCE)[0] == 0
    code, out, _ = run(runner, app, "plan", C_PRIME, "--host-root", REFERENCE, "--json")
    assert code == 1 and json.loads(out)["admission"]["verdict"] == "refuse"


def test_plan_of_a_cluster_recipe_does_not_judge_this_host(runner: CliRunner, app: typer.Typer,
                                                           tmp_path: Path) -> None:
    """A host tree with 2 GiB RAM and no GPU driver refuses recipe B; B on a cluster node is admitted
    with one line naming what the node needs (placement REMOTE: this host is not where it runs)."""
    tiny = tmp_path / "tiny"
    shutil.copytree(REFERENCE, tiny, symlinks=True)
    meminfo = (tiny / "proc/meminfo").read_text()
    meminfo = meminfo.replace("MemTotal:       32778732 kB", "MemTotal:        2097152 kB")
    (tiny / "proc/meminfo").write_text(meminfo)
    (tiny / "proc/modules").write_text("")
    code, out, _ = run(runner, app, "plan", B, "--host-root", str(tiny))
    assert code == 1 and "admission: REFUSE" in out and "refuse kernel-module" in out
    code, out, _ = run(runner, app, "plan", "gfx906-b-tp4-eager-k8s", "--host-root", str(tiny))
    assert code == 0, out
    assert f"host ({tiny}, not where the engine runs): MemTotal 2.00 GiB" in out
    admission = out.split("admission: ", 1)[1].split("\n\n", 1)[0].splitlines()
    assert admission[0] == "ADMIT"
    assert [line.split(":", 1)[0].split() for line in admission[1:]] == [
        ["admit", "memory-peak-node"], ["admit", "placement"]]
    assert admission[2].startswith("  admit  placement: runs on a cluster node: this host is not checked; "
                                   "the node needs: RAM + usable swap ≥ 25.16 GiB at the predicted peak; ")
    assert "amd.com/gpu" in admission[2] and "memlock from" not in out
    assert "kind: Deployment" in out  # the launch, in the plug-in's default format


def test_plan_bad_host_root(runner: CliRunner, app: typer.Typer, tmp_path: Path) -> None:
    code, _, err = run(runner, app, "plan", B, "--host-root", str(tmp_path))
    assert code == 2 and "proc/meminfo" in err


def test_plan_default_recipe_on_this_machine(runner: CliRunner, app: typer.Typer) -> None:
    code, out, _ = run(runner, app, "plan", "cpu-smollm2", "--json")
    data = json.loads(out)
    assert data["launch"]["argv"][1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert code == (0 if data["ok"] else 1)


def test_diff(runner: CliRunner, app: typer.Typer) -> None:
    code, out, _ = run(runner, app, "recipes", "diff", B, "gfx906-fp8-tp4-eager", "--json")
    data = json.loads(out)
    fields = {c["field"] for c in data["changes"]}
    assert code == 0
    assert {"model.path", "env.vars.VLLM_DCU_USE_FP8_EMU.value"} <= fields
    assert data["same_compile_inputs"] is False


def test_plan_shows_the_cards_health_warns_and_refuses_on_it(runner: CliRunner, app: typer.Typer,
                                                              tmp_path: Path) -> None:
    # The swap-8 host that admits C, with its four DCUs' health files (fake amdgpu sysfs): one card
    # with uncorrectable RAS errors warns; one at its emergency temperature refuses.
    from tests.unit.test_gpu_health import _card

    host = tmp_path / "host"
    shutil.copytree(SWAP8, host, symlinks=True)
    for n in range(4):
        _card(host, n, slot=f"0000:{0x03 + 0x20 * n:02x}:00.0", ue=2 if n == 1 else 0)
    code, out, _ = run(runner, app, "plan", C, "--host-root", str(host))
    assert code == 0, out
    assert ("GPU 1 (hygon): 45 °C (slowdown 100), 35/300 W, PCIe gen4 x16 of gen4 x16, "
            "ECC uncorrectable 2") in out
    assert "warn   gpu-health ecc-uncorrectable: GPU 1: 2 uncorrectable ECC error(s)" in out
    (host / "sys/class/drm/card3/device/hwmon/hwmon3/temp1_input").write_text("106000\n")
    code, out, _ = run(runner, app, "plan", C, "--host-root", str(host), "--json")
    data = json.loads(out)
    assert code == 1 and data["admission"]["verdict"] == "refuse"
    refused = [c["name"] for c in data["admission"]["checks"] if c["verdict"] == "refuse"]
    assert refused == ["gpu-health overheat"]
    assert len(data["gpu_health"]) == 4 and data["gpu_health_blind"] is None


K8S = "gfx906-b-tp4-eager-k8s"


def test_list_says_a_kubernetes_recipe_needs_a_cluster(runner: CliRunner, app: typer.Typer,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """No cluster here: the listing says so (as the controller's preflight refuses it), not `admit`."""
    monkeypatch.setattr(recipes_cmd, "available_runtimes", lambda runs: (
        {"process": object(), "docker": object()},
        {"kubernetes": Unavailable("kubernetes", "kubernetes runtime unavailable: no cluster", fault=False)}))
    code, out, _ = run(runner, app, "recipes", "list", "--json", "--host-root", REFERENCE)
    verdicts = {r["name"]: r["verdict"] for r in json.loads(out)}
    assert code == 0
    assert verdicts[K8S] == "needs a cluster"
    assert verdicts[C] in ("admit", "warn", "refuse")  # a docker recipe is still judged by admission
    code, out, _ = run(runner, app, "recipes", "list", "--host-root", REFERENCE)
    line = next(ln for ln in out.splitlines() if f" {K8S} " in ln)
    assert line.rstrip().endswith("needs a cluster")


def test_list_probes_the_host_for_a_cluster(runner: CliRunner, app: typer.Typer,
                                            monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The real registry probe, on a host with no kubeconfig and not in a pod."""
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    code, out, _ = run(runner, app, "recipes", "list", "--json", "--host-root", REFERENCE)
    assert code == 0
    assert {r["name"]: r["verdict"] for r in json.loads(out)}[K8S] == "needs a cluster"
