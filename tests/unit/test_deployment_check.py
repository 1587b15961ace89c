"""Seed 004 §7's deployment check: the probe script run for real against a fake installation, the
pure evaluator, the process runtime's exec seam, the recipe field, and the on-ready record."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from appliance.evaluation.deployment import (
    RESULT_PREFIX,
    DeploymentFacts,
    DeviceFacts,
    evaluate,
    parse_probe_output,
    probe_argv,
    probe_script,
    version_summary,
)
from appliance.recipe.recipe_loader import load_recipes
from appliance.recipe.recipe_model import DeploymentCheck, Expectations
from controller.evaluation.proof import proof_from_events, ready_hook
from controller.runtime.base import EngineHandle, EngineRuntimeError
from controller.runtime.process import ProcessRuntime
from tests.unit.spec_helpers import launch_spec

REPO = Path(__file__).resolve().parents[2]


def _tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _fake_install(
    tmp_path: Path, *, site_envs: str = "X = 1\n", src_envs: str = "X = 1\n"
) -> tuple[Path, Path]:
    """A fake fork (src/) and a fake installation (site/) of a `vllm` package."""
    src, site = tmp_path / "src", tmp_path / "site"
    _tree(src, {"vllm/__init__.py": "__version__ = '0.0.fake'\n", "vllm/envs.py": src_envs})
    _tree(site, {"vllm/__init__.py": "__version__ = '0.0.fake'\n", "vllm/envs.py": site_envs})
    return src, site


def _run_probe(check: DeploymentCheck, pythonpath: Path) -> DeploymentFacts:
    """The generated script, run by this machine's python the way the engine's interpreter runs it."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(pythonpath)}
    proc = subprocess.run([sys.executable, "-c", probe_script(check)], env=env, capture_output=True,
                          text=True, timeout=300, check=False, cwd=pythonpath)
    assert proc.returncode == 0, proc.stderr
    return parse_probe_output(proc.stdout)


# -- the probe script, run for real ----------------------------------------------------------------


def test_the_probe_compiles_compares_and_reads_the_import_root_of_the_installed_package(
    tmp_path: Path,
) -> None:
    src, site = _fake_install(tmp_path)
    check = DeploymentCheck(files=("vllm/envs.py",), source_root=str(src), site_root=str(site),
                            import_root=str(site / "vllm"))
    facts = _run_probe(check, site)
    assert facts.error is None and facts.vllm_error is None
    assert facts.vllm_dir == os.path.realpath(site / "vllm")
    assert facts.versions["vllm"] == "0.0.fake"
    assert facts.files["vllm/envs.py"] == {"source": "present", "compiles": True, "installed": "same",
                                           "installed_path": str(site / "vllm/envs.py")}
    assert evaluate(check, facts) == []
    assert not (src / "vllm" / "__pycache__").exists()  # py_compile wrote into a scratch directory


def test_the_probe_finds_an_installed_copy_that_differs_and_a_source_that_does_not_compile(
    tmp_path: Path,
) -> None:
    src, site = _fake_install(tmp_path, src_envs="def broken(:\n", site_envs="X = 1\n")
    check = DeploymentCheck(files=("vllm/envs.py", "vllm/platforms/rocm.py"), source_root=str(src),
                            site_root=str(site), import_root=str(site / "vllm"))
    facts = _run_probe(check, site)
    assert facts.files["vllm/envs.py"]["compiles"] is False
    assert "SyntaxError" in facts.files["vllm/envs.py"]["compile_error"]
    assert facts.files["vllm/envs.py"]["installed"] == "differs"
    assert facts.files["vllm/platforms/rocm.py"] == {"source": "missing", "installed": "missing",
                                                     "installed_path": str(site / "vllm/platforms/rocm.py")}
    problems = evaluate(check, facts)
    assert [p.split(":")[0] for p in problems] == [
        "patched file does not compile", "installed file differs from its source",
        "patched file missing from the source root " + str(src), "patched file not installed"]


def test_without_a_site_root_the_copy_compared_is_the_one_imported_and_the_import_root_is_judged(
    tmp_path: Path,
) -> None:
    src, site = _fake_install(tmp_path)
    # The seed's GDN incident: the engine imports a stale vLLM (site/) instead of the fork (src/).
    check = DeploymentCheck(files=("vllm/envs.py",), source_root=str(src), import_root=str(src / "vllm"))
    facts = _run_probe(check, site)
    assert facts.site_root == os.path.realpath(site)
    assert evaluate(check, facts) == [f"vllm imports from {site / 'vllm'}, expected {src / 'vllm'}"]
    # The same tree imported from the fork itself: as declared.
    assert evaluate(check, _run_probe(check, src)) == []


def test_a_vllm_that_does_not_import_is_a_problem_and_leaves_the_installed_copies_unknown(
    tmp_path: Path,
) -> None:
    src, _ = _fake_install(tmp_path)
    _tree(tmp_path / "broken", {"vllm/__init__.py": "raise ImportError('std::bad_alloc')\n"})
    check = DeploymentCheck(files=("vllm/envs.py",), source_root=str(src), import_root=str(src / "vllm"))
    facts = _run_probe(check, tmp_path / "broken")
    assert facts.vllm_error == "ImportError: std::bad_alloc"
    assert evaluate(check, facts) == [
        "vllm does not import in the engine's interpreter: ImportError: std::bad_alloc",
        "patched file's installed copy unknown (vllm did not import): vllm/envs.py"]


# -- the evaluator ---------------------------------------------------------------------------------

CHECK = DeploymentCheck(files=("vllm/envs.py",), source_root="/src", import_root="/src/vllm")
GOOD = DeploymentFacts(vllm_file="/src/vllm/__init__.py", vllm_dir="/src/vllm", site_root="/src",
                       files={"vllm/envs.py": {"source": "present", "compiles": True, "installed": "same"}})


def test_no_declared_check_judges_nothing_and_a_matching_deployment_has_no_problem() -> None:
    assert evaluate(None, DeploymentFacts(error="anything")) == []
    assert evaluate(CHECK, GOOD) == []
    # a symlinked site: the file path's directory is the declared root even if its real path is not
    assert evaluate(CHECK, GOOD.model_copy(update={"vllm_dir": "/real/vllm"})) == []


@pytest.mark.parametrize(
    ("update", "problem"),
    [
        ({"error": "the probe did not finish within 120 s"},
         "deployment check did not run: the probe did not finish within 120 s"),
        ({"vllm_file": "/usr/lib/python3/site-packages/vllm/__init__.py",
          "vllm_dir": "/usr/lib/python3/site-packages/vllm"},
         "vllm imports from /usr/lib/python3/site-packages/vllm, expected /src/vllm"),
        ({"vllm_error": "ImportError: x", "vllm_file": None, "vllm_dir": None},
         "vllm does not import in the engine's interpreter: ImportError: x"),
        ({"files": {}}, "patched file not checked: vllm/envs.py"),
        ({"files": {"vllm/envs.py": {"source": "missing", "installed": "present"}}},
         "patched file missing from the source root /src: vllm/envs.py"),
        ({"files": {"vllm/envs.py": {"source": "present", "compiles": False, "compile_error": "E",
                                     "installed": "same"}}},
         "patched file does not compile: vllm/envs.py (E)"),
        ({"files": {"vllm/envs.py": {"source": "present", "compiles": True, "installed": "missing"}}},
         "patched file not installed: vllm/envs.py"),
        ({"files": {"vllm/envs.py": {"source": "present", "compiles": True, "installed": "differs",
                                     "installed_path": "/site/vllm/envs.py"}}},
         "installed file differs from its source: /site/vllm/envs.py"),
    ],
)
def test_each_mismatch_kind_is_a_problem(update: dict[str, Any], problem: str) -> None:
    assert evaluate(CHECK, GOOD.model_copy(update=update)) == [problem]


def test_the_result_line_is_found_after_whatever_the_env_scripts_printed() -> None:
    text = f"DTK env loaded\n{RESULT_PREFIX}" + '{"vllm_dir": "/src/vllm", "versions": {"vllm": "0.21"}}\n'
    assert parse_probe_output(text).vllm_dir == "/src/vllm"
    assert parse_probe_output("Segmentation fault\n").error == (
        "the probe printed no result: Segmentation fault")
    assert parse_probe_output(RESULT_PREFIX + "{not json").error is not None


def test_the_versions_line_names_vllm_torch_cuda_and_each_card_with_its_arch_and_memory() -> None:
    facts = DeploymentFacts(
        versions={"vllm": "0.26.0", "torch": "2.9.0+cu128", "cuda": "12.8", "hip": None},
        devices=[DeviceFacts(index=0, name="NVIDIA H200", capability="9.0", total_memory_bytes=150 * 2**30)])
    assert version_summary(facts) == (
        "vllm 0.26.0; torch 2.9.0+cu128; cuda 12.8; GPU0 NVIDIA H200 (cc 9.0, 150 GiB)")
    z100 = DeploymentFacts(devices=[DeviceFacts(index=0, name="Z100", capability="9.0", gfx="gfx906")])
    assert version_summary(z100) == "GPU0 Z100 (gfx906)"


def test_the_probe_runs_the_engines_interpreter_behind_the_same_sourcing_wrapper() -> None:
    spec = launch_spec("process", {"python": "/e/bin/python"}, source_files=("/opt/dtk/env.sh",))
    argv = probe_argv(spec, "print(1)")
    assert argv == (
        "bash", "-c", '. /opt/dtk/env.sh && exec "$@"', "engine", "/e/bin/python", "-c", "print(1)")
    docker = launch_spec("docker", {"image": "i"}, argv=("python", "-c", "import torch", "serve"))
    assert probe_argv(docker, "x") == ("python", "-c", "x")
    console = launch_spec("docker", {"image": "i"}, argv=("vllm", "serve", "m"))
    assert probe_argv(console, "x") == ("python3", "-c", "x")


# -- the process runtime's exec seam, against a real process ---------------------------------------


def _handle() -> EngineHandle:
    return EngineHandle(launch_id="L1", runtime="process", ref="1", recipe="r", spec_hash="h",
                        log_path="/dev/null", started_at=0.0)


def test_the_process_runtime_runs_a_command_with_the_engines_environment_from_the_temp_dir(
    tmp_path: Path,
) -> None:
    spec = launch_spec("process", {"python": sys.executable}, env={"APPLIANCE_PROBE_X": "engine-env"})
    code, out = ProcessRuntime(tmp_path).engine_exec(
        spec, _handle(),
        [sys.executable, "-c", "import os; print(os.environ['APPLIANCE_PROBE_X'], os.getcwd())"], 60.0)
    assert code == 0
    assert out.split() == ["engine-env", os.path.realpath(tempfile.gettempdir())]


def test_the_process_runtime_reports_a_timeout_and_a_missing_interpreter(tmp_path: Path) -> None:
    spec = launch_spec("process", {"python": sys.executable})
    rt = ProcessRuntime(tmp_path)
    code, _ = rt.engine_exec(spec, _handle(), [sys.executable, "-c", "import time; time.sleep(60)"], 0.5)
    assert code is None
    with pytest.raises(EngineRuntimeError, match="cannot run"):
        rt.engine_exec(spec, _handle(), [str(tmp_path / "no-python")], 5.0)


# -- the recipe field ------------------------------------------------------------------------------


def test_an_unset_deployment_is_left_out_of_the_dump_and_a_set_one_is_kept() -> None:
    assert "deployment" not in Expectations(ready_budget_s=60).model_dump()
    set_ = Expectations(ready_budget_s=60, deployment=CHECK).model_dump()
    assert set_["deployment"] == {"files": ("vllm/envs.py",), "source_root": "/src", "site_root": None,
                                  "import_root": "/src/vllm"}


@pytest.mark.parametrize("files", [("/abs/envs.py",), ("../envs.py",), ("",)])
def test_deployment_files_are_relative_and_need_a_source_root(files: tuple[str, ...]) -> None:
    with pytest.raises(ValueError, match="relative"):
        DeploymentCheck(files=files, source_root="/src", import_root="/src/vllm")
    with pytest.raises(ValueError, match="source_root"):
        DeploymentCheck(files=("vllm/envs.py",), import_root="/src/vllm")


def test_the_gfx906_recipes_declare_the_patched_files_and_the_cuda_kit_only_its_import_root() -> None:
    recipes = load_recipes(REPO / "recipes")
    for name in ("gfx906-a-tp2-graph", "gfx906-b-tp4-eager", "gfx906-c-tp4-graph-piecewise",
                 "gfx906-c-prime-tp4-graph-default", "gfx906-fp8-tp4-eager"):
        check = recipes[name].expect.deployment
        assert check is not None and check.import_root == "/src/vllm" and check.source_root == "/src"
        assert "vllm/envs.py" in check.files
        assert "vllm/model_executor/kernels/linear/scaled_mm/gfx906_sdot4.py" in check.files
    for name in ("cuda-smollm2-eager", "cuda-smollm2-graph", "cuda-smollm2-piecewise"):
        check = recipes[name].expect.deployment
        assert check is not None and check.files == () and check.source_root is None
        assert check.expanded("/home/a/").import_root == "/home/a/engine/cuda/site/vllm"


# -- the on-ready record ---------------------------------------------------------------------------


class ExecRuntime:
    """A runtime fake with the exec seam: answers with a probe result line (or raises)."""

    def __init__(self, output: str) -> None:
        self.output = output
        self.ran: list[Sequence[str]] = []

    def read_logs(self, handle: EngineHandle, offset: int) -> tuple[str, int]:
        return ("Using FLASH_ATTN attention backend\n", 35) if offset == 0 else ("", offset)

    def engine_exec(self, spec: Any, handle: EngineHandle, argv: Sequence[str],
                    timeout_s: float) -> tuple[int | None, str]:
        self.ran.append(argv)
        return 0, self.output


def _on_ready(runtime: ExecRuntime, check: DeploymentCheck | None) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []

    def note(kind: str, message: str, launch_id: str | None, data: dict[str, Any] | None) -> None:
        events.append({"kind": kind, "message": message, "data": data})

    hook = ready_hook({"process": runtime},  # type: ignore[dict-item]
                      lambda _: (("Using FLASH_ATTN attention backend",), {}), note, lambda _: check)
    spec = launch_spec("process", {"python": "/e/bin/python"}, cache_root="/nonexistent-cache")
    asyncio.run(hook("L1", spec, _handle()))
    return events


def test_a_mismatch_the_probe_saw_lands_as_a_deployment_record_and_fails_the_proof() -> None:
    line = RESULT_PREFIX + '{"vllm_file": "/usr/site/vllm/__init__.py", "vllm_dir": "/usr/site/vllm", ' \
        '"files": {"vllm/envs.py": {"source": "present", "compiles": true, "installed": "same"}}, ' \
        '"versions": {"vllm": "0.21.0"}}'
    runtime = ExecRuntime(line)
    events = _on_ready(runtime, CHECK)
    assert [e["kind"] for e in events] == ["kernel-proof", "deployment-proof", "kernel-proof-warning"]
    assert runtime.ran[0][:2] == ("/e/bin/python", "-c")
    proof = proof_from_events(events)
    assert proof.deployment_declared
    assert proof.problems == ["deployment: vllm imports from /usr/site/vllm, expected /src/vllm"]


def test_a_declared_check_whose_result_has_not_landed_fails_the_proof_and_a_clean_one_passes() -> None:
    events = _on_ready(ExecRuntime(RESULT_PREFIX + GOOD.model_dump_json()), CHECK)
    assert proof_from_events(events).problems == []
    assert proof_from_events(events[:1]).problems == [
        "deployment: the declared deployment check has no result on the launch "
        "(the probe had not landed or could not be recorded)"]


def test_without_a_declaration_the_versions_are_still_recorded_and_judge_nothing() -> None:
    events = _on_ready(ExecRuntime(RESULT_PREFIX + '{"versions": {"vllm": "0.26.0"}}'), None)
    assert events[1]["kind"] == "deployment-proof"
    assert events[1]["data"]["versions"] == "vllm 0.26.0"
    proof = proof_from_events(events)
    assert proof.problems == [] and "deployment_declared" not in proof.model_dump()


def test_appliance_launches_shows_the_versions_and_the_deployment_verdict() -> None:
    from controller.cli.launch_view import launch_lines

    events = _on_ready(ExecRuntime(RESULT_PREFIX + GOOD.model_copy(update={
        "versions": {"vllm": "0.26.0"}}).model_dump_json()), CHECK)
    lines = launch_lines({"id": "L1", "events": [{**e, "at": 0.0} for e in events]})
    block = [line for line in lines if line.startswith("deployment") or line.startswith("  v")]
    assert block[0].startswith("deployment as declared")
    assert block[1:] == ["  versions: vllm 0.26.0", "  vllm:     /src/vllm/__init__.py"]
