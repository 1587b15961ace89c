"""diagnose() and scan_text() over one saved text per DOMAIN §5 signature, and over the facts the
supervisor has (exit code, signal, OOMKilled, kernel OOM events, stall, budget)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from appliance.diagnosis.diagnose import FailureFacts, diagnose
from appliance.diagnosis.scan import gpu_events_in_kernel_text, kernel_message, oom_events_in_text, scan_text
from appliance.diagnosis.signatures import EXPECTED_ON_Z100, DiagnosisCode, Severity
from appliance.observe.kmsg import OomEvent, OomEventKind, OomScope
from appliance.observe.log_phases import Phase, track_text

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
DOCTOR = FIXTURES / "doctor"
C = DiagnosisCode


def read(name: str) -> str:
    return (DOCTOR / name).read_bytes().decode()


def facts_from_text(text: str, **extra: object) -> FailureFacts:
    lines = text.split("\n")
    tracker = track_text(text)
    fields: dict[str, object] = {
        "log_tail": tuple(lines),
        "oom_events": tuple(oom_events_in_text(lines)),
        "gpu_events": tuple(gpu_events_in_kernel_text(lines)),
        "phase_reached": tracker.furthest,
    }
    fields.update(extra)
    return FailureFacts(**fields)  # type: ignore[arg-type]


# file → (THE diagnosis, every code scan_text must report, retryable)
SIGNATURE_FIXTURES: dict[str, tuple[DiagnosisCode, set[DiagnosisCode], bool]] = {
    "global_oom_tp4_graph.dmesg": (C.GLOBAL_OOM, {C.GLOBAL_OOM}, False),
    "cgroup_oom_docker_memory_limit.dmesg": (C.CGROUP_OOM, {C.CGROUP_OOM}, False),
    "worker_died_during_capture_round2.log": (C.WORKER_DIED, {C.WORKER_DIED, C.ENGINE_START_FAILED}, True),
    "pinned_memory_oom_uva_buffer.log": (
        C.PINNED_MEMORY_OOM, {C.PINNED_MEMORY_OOM, C.ENGINE_START_FAILED}, True,
    ),
    "custom_allreduce_hipextmalloc.log": (
        C.CUSTOM_ALLREDUCE_UNSUPPORTED, {C.CUSTOM_ALLREDUCE_UNSUPPORTED, C.ENGINE_START_FAILED}, False,
    ),
    "graph_pad_for_cudagraph_full_capture.log": (
        C.GRAPH_PAD_FOR_CUDAGRAPH_BUG, {C.GRAPH_PAD_FOR_CUDAGRAPH_BUG, C.ENGINE_START_FAILED}, False,
    ),
    "compile_constraint_violation_sdot4.log": (
        C.COMPILE_CONSTRAINT_VIOLATION, {C.COMPILE_CONSTRAINT_VIOLATION, C.ENGINE_START_FAILED}, False,
    ),
    "import_order_bad_alloc.log": (C.IMPORT_ORDER_BAD_ALLOC, {C.IMPORT_ORDER_BAD_ALLOC}, False),
    "cuda_reinit_forked_subprocess.log": (
        C.CUDA_REINIT_FORKED, {C.CUDA_REINIT_FORKED, C.ENGINE_START_FAILED}, False,
    ),
    "aot_cache_miss_source_changed.log": (C.AOT_CACHE_MISS, {C.AOT_CACHE_MISS}, True),
    "aot_cache_miss_load_failure_cpu.log": (C.AOT_CACHE_MISS, {C.AOT_CACHE_MISS}, True),
    "packed_silu_nan_lock_output.log": (C.PACKED_SILU_NAN, {C.PACKED_SILU_NAN}, False),
    "bind_localhost_in_bridge.txt": (
        C.BIND_LOCALHOST_IN_BRIDGE, {C.BIND_LOCALHOST_IN_BRIDGE, C.LOOPBACK_BIND}, False,
    ),
    "hydcu_module_missing.txt": (C.HYDCU_MODULE_MISSING, {C.HYDCU_MODULE_MISSING}, False),
    # The seed record's further signatures, and PyTorch's wordings of the same failures.
    "custom_allreduce_hip_error_oom.log": (
        C.CUSTOM_ALLREDUCE_UNSUPPORTED, {C.CUSTOM_ALLREDUCE_UNSUPPORTED, C.ENGINE_START_FAILED}, False,
    ),
    "custom_allreduce_cudacheck_failed.log": (
        C.CUSTOM_ALLREDUCE_UNSUPPORTED,
        {C.CUSTOM_ALLREDUCE_UNSUPPORTED, C.WORKER_DIED, C.ENGINE_START_FAILED}, False,
    ),
    "device_oom_bare_hip_error.log": (C.DEVICE_OOM, {C.DEVICE_OOM, C.ENGINE_START_FAILED}, False),
    "device_oom_bare_cuda_error.log": (C.DEVICE_OOM, {C.DEVICE_OOM, C.ENGINE_START_FAILED}, False),
    "mfma_stub_paged_attention_assert.log": (
        C.MFMA_ONLY_KERNEL, {C.MFMA_ONLY_KERNEL, C.ENGINE_START_FAILED}, False,
    ),
    "triton_unsupported_target_gfx906.log": (
        C.TRITON_UNSUPPORTED_TARGET, {C.TRITON_UNSUPPORTED_TARGET, C.ENGINE_START_FAILED}, False,
    ),
    "triton_api_buffer_ops_mismatch.log": (
        C.TRITON_API_MISMATCH, {C.TRITON_API_MISMATCH, C.ENGINE_START_FAILED}, False,
    ),
    "torchvision_nms_missing.log": (C.TORCHVISION_ABI_MISMATCH, {C.TORCHVISION_ABI_MISMATCH}, False),
    "extension_undefined_symbol.log": (
        C.EXTENSION_ABI_MISMATCH, {C.EXTENSION_ABI_MISMATCH, C.ENGINE_START_FAILED}, False,
    ),
    "rccl_net_socket_shm_disabled.log": (C.RCCL_NET_SOCKET, {C.RCCL_NET_SOCKET}, True),
    "model_path_invalid_repo_id.log": (C.MODEL_PATH_INVALID, {C.MODEL_PATH_INVALID}, False),
    "kv_cache_too_large_cpu.log": (
        C.KV_CACHE_TOO_LARGE, {C.KV_CACHE_TOO_LARGE, C.WORKER_DIED, C.ENGINE_START_FAILED}, False,
    ),
    "gpu_memory_short_h200.log": (C.GPU_MEMORY_SHORT, {C.GPU_MEMORY_SHORT, C.ENGINE_START_FAILED}, False),
    "gpu_memory_short_h200_real.log": (
        C.GPU_MEMORY_SHORT, {C.GPU_MEMORY_SHORT, C.ENGINE_START_FAILED}, False,
    ),
    "skinny_gemm_wvsplitkq_missing.log": (
        C.SKINNY_GEMM_NOT_BUILT, {C.SKINNY_GEMM_NOT_BUILT, C.ENGINE_START_FAILED}, False,
    ),
    "compile_constraint_violation_dummy_run.log": (
        C.COMPILE_CONSTRAINT_VIOLATION, {C.COMPILE_CONSTRAINT_VIOLATION, C.ENGINE_START_FAILED}, False,
    ),
    "gpu_xid79_fallen_off_bus.dmesg": (C.GPU_FAULT, {C.GPU_FAULT}, False),
    "gpu_xid31_mmu_fault.dmesg": (C.GPU_ENGINE_FAULT, {C.GPU_ENGINE_FAULT}, True),
    "amdgpu_ring_timeout_reset.dmesg": (C.GPU_FAULT, {C.GPU_FAULT}, False),
}

BENIGN_FIXTURES = {
    "benign_rocblaslt_no_paths.log": C.ROCBLASLT_NO_PATHS,
    "uncached_memory_probe.txt": C.UNCACHED_MEMORY_UNSUPPORTED,
}
# Informational, but not "expected on Z100": each says what it is and that the engine is fine.
INFO_FIXTURES = {
    "rccl_iommu_pt_missing.log": {C.RCCL_IOMMU_PT_MISSING},
    "client_disconnect_healthy_cpu.log": {C.LOOPBACK_BIND, C.CLIENT_DISCONNECT},
}


def test_every_fixture_is_covered() -> None:
    on_disk = {p.name for p in DOCTOR.iterdir() if p.suffix != ".md"}
    phases_only = {"gpu_default_graph_tp4_aot_hit.log", "graph_capture_killed_round2_full_and_piecewise.log"}
    checks = {"w8a8_block_fp8_default_config_check.log"}  # a warning to check, not a failure
    known = set(SIGNATURE_FIXTURES) | set(BENIGN_FIXTURES) | set(INFO_FIXTURES)
    assert on_disk == known | phases_only | checks


@pytest.mark.parametrize("name", sorted(SIGNATURE_FIXTURES))
def test_signature_fixture_diagnosed(name: str) -> None:
    want, codes, retryable = SIGNATURE_FIXTURES[name]
    text = read(name)
    assert {f.code for f in scan_text(text)} == codes
    diagnosis = diagnose(facts_from_text(text))
    assert diagnosis.code is want
    assert diagnosis.retryable is retryable
    assert diagnosis.evidence, "a diagnosis must show the lines it rests on"
    assert diagnosis.hint and diagnosis.fact


@pytest.mark.parametrize("name", sorted(BENIGN_FIXTURES))
def test_benign_lines_are_flagged_expected_and_ignored(name: str) -> None:
    findings = scan_text(read(name))
    assert [(f.code, f.benign, f.severity, f.hint) for f in findings] == [
        (BENIGN_FIXTURES[name], True, Severity.INFO, EXPECTED_ON_Z100),
    ]
    diagnosis = diagnose(facts_from_text(read(name)))
    assert diagnosis.code is C.UNKNOWN
    assert diagnosis.severity is Severity.INFO


def test_the_default_block_fp8_config_line_is_a_check_of_the_fp8_emulation_not_noise() -> None:
    """It was once called benign ("expected on Z100, ignore"); the seed ties it to
    the Triton block-FP8 fallback (1984.8 ms/token) unless VLLM_DCU_USE_FP8_EMU=1 took effect."""
    findings = scan_text(read("w8a8_block_fp8_default_config_check.log"))
    assert [(f.code, f.benign, f.severity) for f in findings] == [
        (C.W8A8_BLOCK_FP8_DEFAULT_CONFIG, False, Severity.WARNING)]
    assert "VLLM_DCU_USE_FP8_EMU=1" in findings[0].hint and "123" in findings[0].hint


@pytest.mark.parametrize("name", sorted(INFO_FIXTURES))
def test_informational_fixture_is_no_failure(name: str) -> None:
    findings = scan_text(read(name))
    assert {f.code for f in findings} == INFO_FIXTURES[name]
    assert all(f.severity is Severity.INFO for f in findings)
    assert diagnose(facts_from_text(read(name))).code is C.UNKNOWN


def test_client_disconnect_in_a_healthy_engine_log_is_not_an_engine_failure() -> None:
    """A client that hung up mid-stream (ConnectionResetError in the engine's stream
    generator) was diagnosed as the bridge-network bind failure of DOMAIN §2."""
    text = read("client_disconnect_healthy_cpu.log")
    codes = {f.code for f in scan_text(text)}
    assert C.BIND_LOCALHOST_IN_BRIDGE not in codes
    assert C.CLIENT_DISCONNECT in codes
    assert diagnose(facts_from_text(text)).severity is Severity.INFO
    # The host-side reset of DOMAIN §2 (bind_localhost_in_bridge.txt) is still the bind failure: above.


def test_constraint_violation_names_the_seed_rollback() -> None:
    """Seed 000 rollback path: VLLM_DCU_USE_INT8_SDOT4=0 returns to the Triton kernel."""
    diagnosis = diagnose(facts_from_text(read("compile_constraint_violation_sdot4.log")))
    assert diagnosis.code is C.COMPILE_CONSTRAINT_VIOLATION
    assert "VLLM_DCU_USE_INT8_SDOT4=0" in diagnosis.hint


@pytest.mark.parametrize("line", [
    "RuntimeError: HIP error: out of memory",
    "RuntimeError: CUDA error: out of memory",
    "(EngineCore_DP0 pid=7) ERROR 01-01 00:00:00 [core.py:1] RuntimeError: HIP error: out of memory",
])
def test_bare_device_oom_matches_a_rule(line: str) -> None:
    diagnosis = diagnose(facts_from_text(line))
    assert diagnosis.code is C.DEVICE_OOM
    assert "--gpu-memory-utilization" in diagnosis.hint


def test_torch_dsa_advice_is_not_a_device_assert() -> None:
    """Torch prints 'Compile with `TORCH_USE_HIP_DSA` to enable device-side assertions.' under every
    HIP error; that advice is not the MFMA stub's assertion."""
    codes = {f.code for f in scan_text(read("device_oom_bare_hip_error.log"))}
    assert C.MFMA_ONLY_KERNEL not in codes


def test_a_vram_oom_near_the_custom_allreduce_info_line_stays_a_vram_oom() -> None:
    """vLLM logs `[custom_all_reduce.py:35] Custom allreduce is disabled …` at start: only traceback
    frames of the allocation make an OOM the custom all-reduce's."""
    text = read("device_oom_bare_hip_error.log")
    assert "[custom_all_reduce.py:35]" in text
    assert C.CUSTOM_ALLREDUCE_UNSUPPORTED not in {f.code for f in scan_text(text)}


def test_every_row_is_a_known_code_once() -> None:
    from appliance.diagnosis.signatures import SIGNATURES

    codes = [s.code for s in SIGNATURES]
    assert len(codes) == len(set(codes))
    assert all(isinstance(c, C) for c in codes)


def test_every_row_has_a_rank_and_ranks_are_unique() -> None:
    """One table: a row cannot be added without its rank (a required field), and no two rows tie."""
    from appliance.diagnosis.signatures import SIGNATURES, Decides

    ranks = [s.rank for s in SIGNATURES]
    assert all(isinstance(r, int) and not isinstance(r, bool) for r in ranks)
    assert len(ranks) == len(set(ranks)), sorted(r for r in ranks if ranks.count(r) > 1)
    assert all(isinstance(s.decides, Decides) for s in SIGNATURES)
    # Only the engine's own "failed to start" is the fallback `diagnose` reaches after stall/budget.
    assert [s.code for s in SIGNATURES if s.decides is Decides.FALLBACK] == [C.ENGINE_START_FAILED]


def test_the_ranks_keep_the_order_co_occurring_failures_are_decided_in() -> None:
    """The order the separate failure list had before the rows carried their rank (diagnoses unchanged)."""
    from appliance.diagnosis.diagnose import _DEGRADED_ORDER, _FAILURE_ORDER

    assert _FAILURE_ORDER == (
        C.GLOBAL_OOM, C.CGROUP_OOM, C.GPU_FAULT, C.GPU_ENGINE_FAULT, C.PINNED_MEMORY_OOM,
        C.CUSTOM_ALLREDUCE_UNSUPPORTED,
        C.GRAPH_PAD_FOR_CUDAGRAPH_BUG, C.COMPILE_CONSTRAINT_VIOLATION, C.IMPORT_ORDER_BAD_ALLOC,
        C.CUDA_REINIT_FORKED, C.PACKED_SILU_NAN, C.HYDCU_MODULE_MISSING, C.MFMA_ONLY_KERNEL,
        C.TRITON_UNSUPPORTED_TARGET, C.SKINNY_GEMM_NOT_BUILT, C.TRITON_API_MISMATCH,
        C.TORCHVISION_ABI_MISMATCH, C.EXTENSION_ABI_MISMATCH, C.MODULE_NOT_FOUND, C.ENGINE_CONFIG_INVALID,
        C.KV_CACHE_TOO_LARGE, C.GPU_MEMORY_SHORT, C.MODEL_PATH_INVALID, C.DEVICE_OOM,
        C.BIND_LOCALHOST_IN_BRIDGE, C.WORKER_DIED, C.PORT_IN_USE,
    )
    assert _DEGRADED_ORDER == (C.AOT_CACHE_MISS, C.RCCL_NET_SOCKET)


def test_healthy_gpu_start_has_no_failure() -> None:
    text = read("gpu_default_graph_tp4_aot_hit.log")
    assert [f.code for f in scan_text(text)] == [C.ROCBLASLT_NO_PATHS]
    assert diagnose(facts_from_text(text)).code is C.UNKNOWN


# --- regressions named after what operators got wrong ---------------------------------------------


def test_pinned_memory_oom_is_not_a_vram_problem() -> None:
    """S11f §10.1: hipErrorOutOfMemory from UvaBuffer/pin_memory is the memlock ulimit, retry often works."""
    text = read("pinned_memory_oom_uva_buffer.log")
    codes = {f.code for f in scan_text(text)}
    assert C.DEVICE_OOM not in codes
    # The same error without the pinned-memory frames is a VRAM problem.
    pinned_frames = ("buffer_utils", "UvaBuffer", "pin_memory", "StagedWrite")
    bare = "\n".join(line for line in text.split("\n") if not any(k in line for k in pinned_frames))
    assert diagnose(facts_from_text(bare)).code is C.DEVICE_OOM


def test_global_oom_is_not_called_a_cgroup_oom() -> None:
    """DOMAIN §3: the TP=4 graph OOMs were global; the first 'cgroup OOM' diagnosis was wrong."""
    text = read("global_oom_tp4_graph.dmesg")
    diagnosis = diagnose(facts_from_text(text, phase_reached=Phase.GRAPH_CAPTURE))
    assert diagnosis.code is C.GLOBAL_OOM
    assert diagnosis.summary.startswith("global OOM during graph capture: ")
    assert "VLLM::Worker_TP (pid 412879), anon-rss 6.76 GiB" in diagnosis.summary
    assert "swappiness=200" in diagnosis.hint


def test_docker_oomkilled_without_kernel_record_is_not_attributed() -> None:
    """memory.events oom_kill / OOMKilled alone once misled operators into 'cgroup OOM' (DOMAIN §3)."""
    diagnosis = diagnose(FailureFacts(exit_code=137, oom_killed=True))
    assert diagnosis.code is C.OOM_KILLED_UNATTRIBUTED
    assert diagnosis.retryable is False
    assert "dmesg" in diagnosis.hint


def test_engine_log_worker_died_plus_dmesg_is_a_global_oom() -> None:
    text = read("worker_died_during_capture_round2.log") + "\n" + read("global_oom_tp4_graph.dmesg")
    assert diagnose(facts_from_text(text)).code is C.GLOBAL_OOM


# --- facts from the supervisor ---------------------------------------------------------------------


def oom(scope: OomScope, pid: int = 412879, anon_kib: int = 7088373) -> OomEvent:
    return OomEvent(kind=OomEventKind.KILL, scope=scope, pid=pid, task="VLLM::Worker_TP",
                    anon_rss_bytes=anon_kib * 1024, lines=(f"Killed process {pid} (VLLM::Worker_TP)",))


def test_kernel_oom_events_decide_over_log_text() -> None:
    facts = FailureFacts(exit_code=1, log_tail=("RuntimeError: Engine core initialization failed.",),
                         oom_events=(oom(OomScope.CGROUP, 1), oom(OomScope.GLOBAL, 2)))
    diagnosis = diagnose(facts)
    assert diagnosis.code is C.GLOBAL_OOM  # the host ran out; that the cgroup did too is secondary
    assert "(+1 more kill)" in diagnosis.summary
    assert diagnose(FailureFacts(oom_events=(oom(OomScope.CGROUP),))).code is C.CGROUP_OOM
    assert diagnose(FailureFacts(oom_events=(oom(OomScope.CPUSET),))).code is C.NODE_CONSTRAINED_OOM
    reaped = OomEvent(kind=OomEventKind.REAPED, scope=OomScope.GLOBAL, pid=2)
    assert diagnose(FailureFacts(exit_code=0, oom_events=(reaped,))).code is C.UNKNOWN


@pytest.mark.parametrize(
    ("exit_code", "signal", "expected_signal"),
    [(137, None, 9), (-9, None, 9), (None, 15, 15), (143, None, 15)],
)
def test_killed_by_signal(exit_code: int | None, signal: int | None, expected_signal: int) -> None:
    diagnosis = diagnose(FailureFacts(exit_code=exit_code, signal=signal))
    assert diagnosis.code is C.KILLED_BY_SIGNAL
    assert f"signal {expected_signal}" in diagnosis.evidence[0]
    assert diagnosis.retryable is True


def test_exit_nonzero_shows_the_last_exception() -> None:
    diagnosis = diagnose(FailureFacts(exit_code=1, log_tail=(
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in <module>',
        "ValueError: max_model_len 262144 is larger than the model's 32768",
        "",
    )))
    assert diagnosis.code is C.EXIT_NONZERO
    assert diagnosis.evidence == (
        "exit code 1", "ValueError: max_model_len 262144 is larger than the model's 32768",
    )


def test_stalled_and_over_budget() -> None:
    stalled = diagnose(FailureFacts(stalled=True, phase_reached=Phase.COMPILE_STARTED, exit_code=137))
    assert (stalled.code, stalled.retryable) == (C.STALLED, True)
    assert "(furthest phase: torch.compile)" in stalled.summary
    over = diagnose(FailureFacts(
        over_budget=True, elapsed_s=1500.0, budget_s=1500.0,
        progress="capturing graphs round 2: 38/51 · compile cache miss",
        log_tail=("WARNING Source code has changed since the last compilation. Recompiling the model.",),
    ))
    assert (over.code, over.retryable) == (C.READY_BUDGET_EXCEEDED, False)
    assert over.summary == (
        "the engine was still starting when its ready budget ran out (1500 s of a 1500 s budget) "
        "(at: capturing graphs round 2: 38/51 · compile cache miss); the compile cache missed, so this "
        "start was cold"
    )
    assert "2700 s" in over.hint


def test_probe_reset_with_loopback_bind_is_the_bridge_problem() -> None:
    tail = ("INFO [api_server.py:1885] Starting vLLM API server 0 on http://127.0.0.1:8000",)
    assert diagnose(FailureFacts(over_budget=True, log_tail=tail,
                                 probe_error="ConnectionResetError: [Errno 104] Connection reset by peer"),
                    ).code is C.BIND_LOCALHOST_IN_BRIDGE
    # The process runtime listens on loopback on purpose: that alone is not a failure.
    assert diagnose(FailureFacts(log_tail=tail)).code is C.UNKNOWN


def test_engine_start_failed_names_a_killed_core() -> None:
    diagnosis = diagnose(FailureFacts(exit_code=1, log_tail=(
        "(EngineCore_DP0 pid=3) ERROR [core.py:708] EngineCore failed to start.",
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): "
        "{'EngineCore_DP0': -9}",
    )))
    assert diagnosis.code is C.ENGINE_START_FAILED
    assert "SIGKILL" in diagnosis.summary and "dmesg" in diagnosis.summary


def test_bad_alloc_exit_134_from_the_runtime() -> None:
    diagnosis = diagnose(FailureFacts(exit_code=134, log_tail=("terminate called after throwing an instance "
                                                               "of 'std::bad_alloc'",)))
    assert diagnosis.code is C.IMPORT_ORDER_BAD_ALLOC
    assert diagnose(FailureFacts(exit_code=134)).code is C.KILLED_BY_SIGNAL  # SIGABRT, no signature


# --- kernel text ---------------------------------------------------------------------------------


def test_kernel_message_prefixes() -> None:
    msg = "Out of memory: Killed process 1 (x)"
    assert kernel_message(f"3,48231,1878391322,-;{msg}") == msg
    assert kernel_message(f"[ 1878.391322] {msg}") == msg
    assert kernel_message(f"[Sun Nov 29 06:52:41 2026] {msg}") == msg
    assert kernel_message(f"Nov 29 06:52:41 z100 kernel: {msg}") == msg
    assert kernel_message(msg) == msg


def test_oom_events_from_the_real_kmsg_capture() -> None:
    """MEASURED.md: a real memcg OOM of a 32 MiB docker container, as read from /dev/kmsg."""
    lines = (FIXTURES / "kmsg" / "memcg_v1_kernel_6.18_docker.txt").read_text().split("\n")
    events = oom_events_in_text(lines)
    assert [(e.scope, e.task, e.pid, e.anon_rss_bytes) for e in events] == [
        (OomScope.CGROUP, "tail", 5582, 32384 * 1024),
    ]
    assert diagnose(FailureFacts(log_tail=tuple(lines), oom_events=tuple(events))).code is C.CGROUP_OOM


def test_garbage_never_raises() -> None:
    rng = random.Random(7)
    alphabet = "oom-kil:constraint=CONSTRAINT_NONE,Killed process ()hipErrorOutOfMemory\n\r\x00█[]"
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 400)))
        scan_text(text)
        diagnose(facts_from_text(text, exit_code=rng.choice([None, 0, 1, 137, -11])))


# Every log wording the seed record quotes verbatim (seeds/000, 001; DOMAIN §5), as quoted, each
# recognised on its own line (plus the context line its rule needs, where the record names one).
SEED_WORDINGS: list[tuple[str, DiagnosisCode]] = [
    ("AttributeError: 'VllmConfig' object has no attribute 'pad_for_cudagraph'",
     C.GRAPH_PAD_FOR_CUDAGRAPH_BUG),
    ("RuntimeError: operator torchvision::nms does not exist", C.TORCHVISION_ABI_MISMATCH),
    ("Cannot re-initialize CUDA in forked subprocess", C.CUDA_REINIT_FORKED),
    ("Using default W8A8 Block FP8 kernel config. Performance might be sub-optimal!",
     C.W8A8_BLOCK_FP8_DEFAULT_CONFIG),
    ("rocblaslt warning: No paths matched ...*gfx906*co", C.ROCBLASLT_NO_PATHS),
    ("torch.fx.experimental.symbolic_shapes.ConstraintViolationError", C.COMPILE_CONSTRAINT_VIOLATION),
    ("std::bad_alloc", C.IMPORT_ORDER_BAD_ALLOC),
    ("hipExtMallocWithFlags(..., hipDeviceMallocUncached)\nhipErrorOutOfMemory",
     C.CUSTOM_ALLREDUCE_UNSUPPORTED),
    ("UvaBuffer.__init__\nhipErrorOutOfMemory", C.PINNED_MEMORY_OOM),
    ("oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),global_oom,task=VLLM::Worker_TP", C.GLOBAL_OOM),
    ("Memory cgroup out of memory: Killed process 4242 (VLLM::Worker_TP)", C.CGROUP_OOM),
    ("curl: (56) Recv failure: Connection reset by peer", C.BIND_LOCALHOST_IN_BRIDGE),
    ("Source code has changed since the last compilation. Recompiling the model.", C.AOT_CACHE_MISS),
    ("Compiling model again due to a load failure from /c, reason: x", C.AOT_CACHE_MISS),
    ("z100:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via NET/Socket/0", C.RCCL_NET_SOCKET),
    ("loc(\"/x/triton_flash_attention.py\":309:0): error: unsupported target: 'gfx906'",
     C.TRITON_UNSUPPORTED_TARGET),
    ("triton/backends/amd/compiler.py\n"
     "TypeError: add_convert_to_buffer_ops(): incompatible function arguments.",
     C.TRITON_API_MISMATCH),
    ("wvSplitK: Device-side assertion `false' failed.\nMemory access fault by GPU node-2",
     C.MFMA_ONLY_KERNEL),
    ("ImportError: /x/_C.abi3.so: undefined symbol: _ZN5torch6stable6Tensor6layoutEv",
     C.EXTENSION_ABI_MISMATCH),
    ("modprobe: FATAL: Module hydcu not found in directory /lib/modules/5.15.0-194-generic",
     C.HYDCU_MODULE_MISSING),
    ("lock lock lock lock lock lock lock lock lock lock lock lock lock lock lock lock", C.PACKED_SILU_NAN),
]


@pytest.mark.parametrize(("text", "code"), SEED_WORDINGS, ids=[c.value + f"-{i}" for i, (_, c) in
                                                               enumerate(SEED_WORDINGS)])
def test_every_seed_wording_is_recognised(text: str, code: DiagnosisCode) -> None:
    assert code in {f.code for f in scan_text(text)}


def test_a_device_assert_alone_is_not_an_mfma_stub() -> None:
    """On a CUDA host (the generic recipe) `device-side assert triggered` is an ordinary kernel bug;
    the MFMA stub shows as the assertion followed by the HSA exception / memory access fault."""
    for alone in ("RuntimeError: CUDA error: device-side assert triggered",
                  "Memory access fault by GPU node-2 on address 0x0"):
        assert C.MFMA_ONLY_KERNEL not in {f.code for f in scan_text(alone)}
    text = read("mfma_stub_paged_attention_assert.log")
    finding = next(f for f in scan_text(text) if f.code is C.MFMA_ONLY_KERNEL)
    assert "HSA_STATUS_ERROR_EXCEPTION" in finding.evidence[0]


def test_a_pybind_error_near_the_word_triton_is_not_a_triton_mismatch() -> None:
    text = ("INFO [rocm.py:298] Using Triton Attention backend on V1 engine.\n"
            "TypeError: some_op(): incompatible function arguments. The following argument types are "
            "supported:")
    assert C.TRITON_API_MISMATCH not in {f.code for f in scan_text(text)}


def test_a_killed_shim_is_diagnosed_from_the_runtimes_note() -> None:
    """Issue 23: the process runtime wrote why the engine ended (its shim was SIGKILLed); the record
    said "unknown ... nothing to act on". The engine's shutdown noise in the tail does not outrank it."""
    reason = "the engine's shim (pid 4242) was killed (killed by signal 9 (SIGKILL))"
    d = diagnose(FailureFacts(runtime_reason=reason, log_tail=(
        "INFO [launcher.py:100] [shutdown] API server: shutdown triggered",
        "EngineCore: trigger received signal=SIGTERM")))
    assert d.code is DiagnosisCode.SHIM_KILLED and d.retryable
    assert reason in d.summary and d.evidence == (f"runtime: {reason}",)
    assert "nothing to act on" not in d.hint
    # A kernel OOM record attributed to the launch still comes first (the OOM killer may be the killer).
    oom = OomEvent(kind=OomEventKind.KILL, scope=OomScope.GLOBAL, pid=4242, task="python")
    first = diagnose(FailureFacts(runtime_reason=reason, oom_events=(oom,)))
    assert first.code is not DiagnosisCode.SHIM_KILLED


def test_the_runtimes_reason_explains_an_engine_that_never_ran() -> None:
    """An unschedulable pod has no exit code and no log; the runtime's words are the diagnosis."""
    reason = "Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    d = diagnose(FailureFacts(runtime_reason=reason))
    assert d.code is DiagnosisCode.RUNTIME_CANNOT_RUN and d.retryable
    assert reason in d.summary and d.evidence == (f"runtime: {reason}",)
    pull = diagnose(FailureFacts(runtime_reason="ImagePullBackOff: Back-off pulling image \"x\""))
    assert pull.code is DiagnosisCode.RUNTIME_CANNOT_RUN and not pull.retryable
    # With an exit code the engine did run: the exit decides, as before.
    assert diagnose(FailureFacts(exit_code=1, runtime_reason="CrashLoopBackOff: back-off")).code is \
        DiagnosisCode.EXIT_NONZERO


# --- hardening: wrong model path, KV refusal, bad_alloc phase, seed signatures ---------------------


def test_a_wrong_model_path_is_named_and_not_retried() -> None:
    diagnosis = diagnose(facts_from_text(read("model_path_invalid_repo_id.log")))
    assert diagnosis.code is C.MODEL_PATH_INVALID and not diagnosis.retryable
    assert "'/models/nope'" in diagnosis.summary
    assert "never downloads" in diagnosis.hint and "host_path" in diagnosis.hint


def test_the_cpu_kv_refusal_quotes_vllms_numbers_and_is_not_retried() -> None:
    tail = tuple(read("kv_cache_too_large_cpu.log").split("\n"))
    diagnosis = diagnose(FailureFacts(exit_code=1, log_tail=tail))
    assert diagnosis.code is C.KV_CACHE_TOO_LARGE and not diagnosis.retryable
    assert "40.0 GiB" in diagnosis.summary and "19.12 of 21.46 GiB" in diagnosis.summary
    assert "without a Python error" not in diagnosis.summary


def test_the_gpu_free_memory_refusal_quotes_vllms_numbers_and_is_not_retried() -> None:
    # Before this row the tail read as "the engine core failed to start; no known signature", retried.
    tail = tuple(read("gpu_memory_short_h200.log").split("\n"))
    diagnosis = diagnose(FailureFacts(exit_code=1, log_tail=tail))
    assert diagnosis.code is C.GPU_MEMORY_SHORT and not diagnosis.retryable
    assert "39.29 of 139.8 GiB free" in diagnosis.summary and "0.9" in diagnosis.summary
    assert "125.82 GiB" in diagnosis.summary
    # Later vLLM names the device; the external-weights variant of the same refusal is the same row.
    named = ("ValueError: Free memory on device cuda:0 (12.18/23.56 GiB) on startup is less than desired GPU "
             "memory utilization (0.92, 21.67 GiB). Decrease GPU memory utilization or reduce GPU memory "
             "used by other processes.")
    d2 = diagnose(FailureFacts(exit_code=1, log_tail=(named,)))
    assert d2.code is C.GPU_MEMORY_SHORT and "cuda:0" in d2.summary and "21.67 GiB" in d2.summary
    external = ("ValueError: Free memory on device cuda:1 (5.00/79.15 GiB) on startup is less than the "
                "engine's budget after excluding external process's weights (0.9, 60.00 GiB). Decrease GPU "
                "memory utilization or reduce GPU memory used by other processes.")
    assert diagnose(FailureFacts(exit_code=1, log_tail=(external,))).code is C.GPU_MEMORY_SHORT
    # vLLM's start-up INFO line with the same opening is not a refusal.
    info = ("(EngineCore pid=1) INFO 11-30 08:16:11 [gpu_worker.py:857] Free memory on device (139.29/139.8 "
            "GiB) on startup. Desired GPU memory utilization is (0.3, 41.94 GiB).")
    assert C.GPU_MEMORY_SHORT not in {f.code for f in scan_text(info)}


def test_a_worker_death_after_a_traceback_never_says_without_a_python_error() -> None:
    tail = (
        "(Worker pid=9) ERROR [multiproc_executor.py:1018] Traceback (most recent call last):",
        "(Worker pid=9) ERROR [multiproc_executor.py:1018]   File \"x.py\", line 1, in f",
        "(Worker pid=9) ERROR [multiproc_executor.py:1018] KeyError: 'layers.0.mlp'",
        "(EngineCore pid=8) ERROR [multiproc_executor.py:254] Worker proc VllmWorker-0 died unexpectedly, "
        "shutting down executor.",
    )
    diagnosis = diagnose(FailureFacts(exit_code=1, log_tail=tail))
    assert diagnosis.code is C.WORKER_DIED
    assert "without a Python error" not in diagnosis.summary and "after a Python error" in diagnosis.summary
    assert any("KeyError" in e for e in diagnosis.evidence)
    assert all("without a Python error" not in f.summary for f in scan_text("\n".join(tail)))
    # With no traceback before it, the death is still called a kill from outside.
    bare = diagnose(facts_from_text(read("worker_died_during_capture_round2.log")))
    assert "without a Python error" in bare.summary


BAD_ALLOC = "terminate called after throwing an instance of 'std::bad_alloc'"


def test_bad_alloc_after_the_weights_loaded_is_not_the_import_order_crash() -> None:
    text = "\n".join([
        "(Worker_TP0 pid=5) INFO [default_loader.py:397] Loading weights took 41.20 seconds",
        "(Worker_TP0 pid=5) INFO [gpu_model_runner.py:2602] Model loading took 7.27 GiB and 43.1 seconds",
        BAD_ALLOC, "  what():  std::bad_alloc",
    ])
    assert C.IMPORT_ORDER_BAD_ALLOC not in {f.code for f in scan_text(text)}
    assert diagnose(FailureFacts(exit_code=134, log_tail=tuple(text.split("\n")))).code is not (
        C.IMPORT_ORDER_BAD_ALLOC)
    # The tracker saw loading start even though the tail lost those lines: not the import crash either.
    assert diagnose(FailureFacts(exit_code=134, log_tail=(BAD_ALLOC,),
                                 phase_reached=Phase.WEIGHTS_LOADED)).code is not C.IMPORT_ORDER_BAD_ALLOC
    # Before any load progress it still is.
    assert diagnose(FailureFacts(exit_code=134, log_tail=(BAD_ALLOC,),
                                 phase_reached=Phase.PROCESS_STARTED)).code is C.IMPORT_ORDER_BAD_ALLOC


def test_constraint_violation_in_dummy_run_is_the_tree_defect_not_sdot4() -> None:
    diagnosis = diagnose(facts_from_text(read("compile_constraint_violation_dummy_run.log")))
    assert diagnosis.code is C.COMPILE_CONSTRAINT_VIOLATION
    assert "_dummy_run" in diagnosis.summary and "_dummy_run" in diagnosis.hint
    sdot4 = diagnose(facts_from_text(read("compile_constraint_violation_sdot4.log")))
    assert "_dummy_run" not in sdot4.summary


def test_triton_hints_say_prepend_to_pythonpath_never_pip_install() -> None:
    from appliance.diagnosis.signatures import SIGNATURES

    for sig in SIGNATURES:
        if sig.code in (C.TRITON_UNSUPPORTED_TARGET, C.TRITON_API_MISMATCH):
            assert "PYTHONPATH" in sig.hint and "never pip-install" in sig.hint, sig.code
            assert "install the gfx906-patched Triton into" not in sig.hint


def test_the_fallback_finding_does_not_claim_no_signature_matched() -> None:
    """doctor lists every finding of a file: the fallback row must not say "no known signature" beside
    the signature that matched the same traceback."""
    findings = scan_text(read("compile_constraint_violation_sdot4.log"))
    fallback = next(f for f in findings if f.code is C.ENGINE_START_FAILED)
    assert "no known signature" not in fallback.summary
    # When it IS the diagnosis, it says so.
    alone = diagnose(FailureFacts(exit_code=1, log_tail=("(EngineCore pid=3) ERROR [core.py:708] EngineCore "
                                                          "failed to start.",)))
    assert alone.code is C.ENGINE_START_FAILED and "no known signature" in alone.summary


def test_the_rccl_rows_say_they_need_nccl_debug_info() -> None:
    # Seed 000 一 §5: RCCL prints `via …` transport lines and its `Missing "iommu=pt"` warning only with
    # NCCL_DEBUG=INFO; an engine without it leaves these rows blind, and the table says so.
    from appliance.diagnosis.signatures import blind_rows

    rccl = {C.RCCL_NET_SOCKET, C.RCCL_IOMMU_PT_MISSING}
    assert rccl <= set(blind_rows({}))
    assert rccl <= set(blind_rows({"NCCL_DEBUG": "WARN"}))
    assert not rccl & set(blind_rows({"NCCL_DEBUG": "INFO"}))
    assert not rccl & set(blind_rows({"NCCL_DEBUG": "info"}))
