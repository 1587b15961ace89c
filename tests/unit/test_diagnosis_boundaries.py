"""Boundaries of the diagnosis that a mutation run over appliance/diagnosis/ found unpinned
(docs/mutation-testing.md): each test fails on the mutant named in its comment. Kept apart from
test_diagnosis.py, which the GPU-health signatures are extending at the same time."""

from __future__ import annotations

import pytest

from appliance.diagnosis.diagnose import Diagnosis, FailureFacts, diagnose
from appliance.diagnosis.scan import clip, scan_lines
from appliance.diagnosis.signatures import (
    CONTEXT_LINES,
    SIGNATURES,
    DiagnosisCode,
    Severity,
    severity_at_least,
)
from appliance.observe.kmsg import OomEvent, OomEventKind, OomScope
from appliance.observe.log_phases import Phase

C = DiagnosisCode
BENIGN = "rocblaslt warning: No paths matched"  # a benign note: found, never decides
ENGINE_FAILED = ("RuntimeError: Engine core initialization failed. See root cause above. "
                 "Failed core proc(s): {{'EngineCore_DP0': {code}}}")


def _kill(scope: OomScope, pid: int, lines: int = 3) -> OomEvent:
    return OomEvent(kind=OomEventKind.KILL, scope=scope, pid=pid, task="VLLM::Worker_TP",
                    anon_rss_bytes=7 * 2**30, lines=tuple(f"oom line {pid}.{n}" for n in range(lines)))


def test_a_severity_at_its_floor_counts() -> None:
    # `>=` → `>`: a warning asked for with --min warning was dropped.
    assert severity_at_least(Severity.WARNING, Severity.WARNING)
    assert severity_at_least(Severity.ERROR, Severity.WARNING)
    assert not severity_at_least(Severity.INFO, Severity.WARNING)


def test_clip_keeps_a_line_of_exactly_the_limit_and_cuts_two_fifths_head_and_the_tail() -> None:
    assert clip("x" * 320) == "x" * 320
    assert clip("x" * 321) != "x" * 321  # the default limit is 320
    text = "a" * 100 + "b" * 300
    cut = clip(text)
    head = 320 * 2 // 5  # 128: who logged it
    assert cut == f"{text[:head]} … {text[-(320 - head - 3):]}" and len(cut) == 320


def test_context_reaches_exactly_context_lines_either_side() -> None:
    # A pinned-memory OOM needs its UvaBuffer/pin_memory context within CONTEXT_LINES of the error.
    sig = next(s for s in SIGNATURES if s.code is C.PINNED_MEMORY_OOM)
    assert sig.needs_context
    near = ["hipErrorOutOfMemory", *["filler"] * (CONTEXT_LINES - 1), "UvaBuffer.__init__"]
    far = ["hipErrorOutOfMemory", *["filler"] * CONTEXT_LINES, "UvaBuffer.__init__"]
    assert C.PINNED_MEMORY_OOM in {f.code for f in scan_lines(near)}
    assert C.PINNED_MEMORY_OOM not in {f.code for f in scan_lines(far)}
    before = ["UvaBuffer.__init__", *["filler"] * (CONTEXT_LINES - 1), "hipErrorOutOfMemory"]
    assert C.PINNED_MEMORY_OOM in {f.code for f in scan_lines(before)}


def test_a_finding_numbers_its_first_line_from_one_and_quotes_three() -> None:
    lines = ["ok", *["std::bad_alloc"] * 4]
    (finding,) = [f for f in scan_lines(lines) if f.code is C.IMPORT_ORDER_BAD_ALLOC]
    assert (finding.first_line_no, finding.count) == (2, 4)
    assert finding.evidence == ("2: std::bad_alloc", "3: std::bad_alloc", "4: std::bad_alloc")


@pytest.mark.parametrize(("exit_code", "code", "words"), [
    (128, C.EXIT_NONZERO, "exited with code 128"),  # 128 is no signal: 128 + n is signal n
    (129, C.KILLED_BY_SIGNAL, "killed by SIGHUP"),
    (128 + 42, C.KILLED_BY_SIGNAL, "killed by signal 42"),  # a signal without a name keeps its number
])
def test_exit_codes_above_128_are_signals_and_128_is_not(exit_code: int, code: DiagnosisCode,
                                                         words: str) -> None:
    d = diagnose(FailureFacts(exit_code=exit_code))
    assert d.code is code and words in d.summary


def test_only_sigkill_points_at_an_oom_kill() -> None:
    killed = diagnose(FailureFacts(exit_code=137))
    termed = diagnose(FailureFacts(exit_code=143))
    assert "no kernel OOM record" in killed.hint and "dmesg" in killed.hint
    assert "dmesg" not in termed.hint and "import-order" in termed.hint


def _cases() -> dict[str, FailureFacts]:
    worker_died = "(EngineCore_DP0 pid=7) Worker proc VllmWorker-0 died unexpectedly, shutting down executor."
    reset = "connection reset by peer"
    return {
        "oom": FailureFacts(log_tail=(BENIGN,), oom_events=(_kill(OomScope.GLOBAL, 1),)),
        "shim": FailureFacts(log_tail=(BENIGN,),
                             runtime_reason="the engine's shim (pid 5) was killed (SIGKILL)"),
        "signature": FailureFacts(log_tail=(BENIGN, "ModuleNotFoundError: No module named 'amdsmi'")),
        "worker after error": FailureFacts(log_tail=(BENIGN, "Traceback (most recent call last):",
                                                     "ValueError: boom", worker_died)),
        "oom flag": FailureFacts(log_tail=(BENIGN,), oom_killed=True, exit_code=137),
        "runtime": FailureFacts(log_tail=(BENIGN,), runtime_reason="Unschedulable: 0/3 nodes"),
        "loopback": FailureFacts(log_tail=(BENIGN, "INFO: Uvicorn running on http://127.0.0.1:8000"),
                                 probe_error=reset, exit_code=None),
        "stalled": FailureFacts(log_tail=(BENIGN,), stalled=True),
        "over budget": FailureFacts(log_tail=(BENIGN,), over_budget=True),
        "start failed": FailureFacts(log_tail=(BENIGN, ENGINE_FAILED.format(code=1)), exit_code=1),
        "signal": FailureFacts(log_tail=(BENIGN,), exit_code=137),
        "exit": FailureFacts(log_tail=(BENIGN,), exit_code=1),
        "degraded": FailureFacts(log_tail=(BENIGN, "Cannot load aot compilation from path /c")),
        "nothing": FailureFacts(log_tail=(BENIGN,)),
    }


@pytest.mark.parametrize("case", list(_cases()))
def test_every_diagnosis_carries_every_finding_of_its_log(case: str) -> None:
    # `findings=findings` dropped from any one branch: doctor then showed no findings for that kind.
    facts = _cases()[case]
    d = diagnose(facts)
    assert d.findings == tuple(scan_lines(list(facts.log_tail)))
    assert C.ROCBLASLT_NO_PATHS in {f.code for f in d.findings}


@pytest.mark.parametrize(("case", "retryable"), [
    ("worker after error", True), ("exit", True), ("nothing", True), ("signal", True),
    ("oom", False), ("over budget", False),
])
def test_which_endings_are_retried(case: str, retryable: bool) -> None:
    assert diagnose(_cases()[case]).retryable is retryable


def test_a_worker_death_after_an_error_quotes_that_error_first() -> None:
    d = diagnose(_cases()["worker after error"])
    assert d.code is C.WORKER_DIED and "after a Python error" in d.summary
    assert d.evidence[0] == "ValueError: boom"  # the exception line, not the line just above the death


def test_the_error_quoted_is_the_exception_line_not_the_last_line_above_the_death() -> None:
    died = "(EngineCore_DP0 pid=7) Worker proc VllmWorker-0 died unexpectedly, shutting down executor."
    tail = ("Traceback (most recent call last):", "ValueError: boom", "  (shutting down the executor)", died)
    assert diagnose(FailureFacts(log_tail=tail)).evidence[0] == "ValueError: boom"


def test_a_traceback_after_the_worker_death_is_not_before_it() -> None:
    died = "(EngineCore_DP0 pid=7) Worker proc VllmWorker-0 died unexpectedly, shutting down executor."
    d = diagnose(FailureFacts(log_tail=(died, "Traceback (most recent call last):", "ValueError: later")))
    assert d.code is C.WORKER_DIED and "without a Python error" in d.summary


def test_the_runtime_reason_decides_when_the_controller_gave_up_by_budget_or_stall() -> None:
    reason = "Unschedulable: 0/3 nodes are available"
    for facts in (FailureFacts(runtime_reason=reason, exit_code=137, over_budget=True),
                  FailureFacts(runtime_reason=reason, exit_code=137, stalled=True)):
        assert diagnose(facts).code is C.RUNTIME_CANNOT_RUN
    # With an exit code of its own and no give-up, the engine's exit decides.
    assert diagnose(FailureFacts(runtime_reason=reason, exit_code=1)).code is C.EXIT_NONZERO


def test_runtime_hints_tell_waiting_for_capacity_from_a_refused_image() -> None:
    waiting = diagnose(FailureFacts(runtime_reason="Unschedulable: 0/3 nodes are available"))
    refused = diagnose(FailureFacts(runtime_reason="ErrImagePull: no such image"))
    assert waiting.retryable and "autoscaler" in waiting.hint and "pull secret" not in waiting.hint
    assert not refused.retryable and "pull secret" in refused.hint and "autoscaler" not in refused.hint


def test_the_bridge_diagnosis_shows_the_probe_error_and_the_loopback_line() -> None:
    d = diagnose(_cases()["loopback"])
    assert d.code is C.BIND_LOCALHOST_IN_BRIDGE
    assert d.evidence[0] == "probe: connection reset by peer"
    assert any("Uvicorn running on http://127.0.0.1:8000" in e for e in d.evidence[1:])


def test_over_budget_without_a_budget_figure_says_no_numbers() -> None:
    d = diagnose(FailureFacts(over_budget=True, elapsed_s=10.0))
    assert d.code is C.READY_BUDGET_EXCEEDED and " s of a " not in d.summary
    d = diagnose(FailureFacts(over_budget=True, elapsed_s=10.0, budget_s=900.0))
    assert "(10 s of a 900 s budget)" in d.summary


def test_a_failed_start_quotes_its_line_and_names_a_dead_core_by_signal() -> None:
    tail = ("RuntimeError: something specific", ENGINE_FAILED.format(code=1))
    d = diagnose(FailureFacts(log_tail=tail, exit_code=1))
    assert d.code is C.ENGINE_START_FAILED and "no known signature matched" in d.summary
    # The last exception line as it stands, then the finding's own numbered line.
    assert d.evidence[0] == ENGINE_FAILED.format(code=1)
    assert d.evidence[1].startswith("2: RuntimeError: Engine core initialization failed")
    # A core that exited 0 died of no signal; -9 is SIGKILL (then: look for an OOM kill), -15 is not.
    for code, words, dmesg in (("0", "no known signature matched", False), ("-9", "died of SIGKILL", True),
                               ("-15", "died of SIGTERM", False)):
        d = diagnose(FailureFacts(log_tail=(ENGINE_FAILED.format(code=code),), exit_code=1))
        assert words in d.summary and ("check dmesg" in d.summary) is dmesg, code


def test_oom_kills_name_how_many_more_died_and_keep_eight_lines() -> None:
    one = diagnose(FailureFacts(oom_events=(_kill(OomScope.GLOBAL, 1),)))
    assert one.code is C.GLOBAL_OOM and "more kill" not in one.summary
    assert one.fact == next(s.fact for s in SIGNATURES if s.code is C.GLOBAL_OOM)
    three = diagnose(FailureFacts(oom_events=tuple(_kill(OomScope.GLOBAL, p) for p in (1, 2, 3))))
    assert "(+2 more kills)" in three.summary and len(three.evidence) == 8
    two = diagnose(FailureFacts(oom_events=(_kill(OomScope.GLOBAL, 1), _kill(OomScope.CGROUP, 2))))
    assert "(+1 more kill)" in two.summary and two.code is C.GLOBAL_OOM


def test_an_oom_of_unknown_scope_is_unattributed_with_the_constraint_advice() -> None:
    d = diagnose(FailureFacts(oom_events=(_kill(OomScope.UNKNOWN, 1),)))
    assert d.code is C.OOM_KILLED_UNATTRIBUTED and "constraint=" in d.fact


def test_stall_evidence_is_where_it_stood_then_the_last_three_lines() -> None:
    tail = ("one", "two", "three", "four", "", "five", "six")
    d = diagnose(FailureFacts(log_tail=tail, stalled=True, progress="capturing graphs round 2: 38/51"))
    assert d.evidence == ("at: capturing graphs round 2: 38/51", "five", "six")
    d = diagnose(FailureFacts(log_tail=tail, stalled=True))
    assert d.evidence == ("five", "six")


def test_config_and_module_refusals_quote_vllm() -> None:
    config = diagnose(FailureFacts(log_tail=(
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for VllmConfig",
        "  Value error, Total number of attention heads (9) must be divisible by tensor parallel size (2)."
        " [type=value_error, input_value=ArgsKwargs(()), input_type=ArgsKwargs]",
    ), exit_code=1))
    assert config.code is C.ENGINE_CONFIG_INVALID
    assert config.summary == ("vLLM refused the configuration: Total number of attention heads (9) must be "
                              "divisible by tensor parallel size (2). (not retryable)")
    modules = diagnose(FailureFacts(log_tail=("ModuleNotFoundError: No module named 'vllm._C'",
                                              "ModuleNotFoundError: No module named 'amdsmi'"), exit_code=1))
    assert modules.code is C.MODULE_NOT_FOUND
    assert modules.summary.startswith("Python module 'amdsmi', 'vllm._C' is not installed")
    # A config refusal without vLLM's "Value error" line keeps the row's own summary.
    bare = diagnose(FailureFacts(log_tail=("1 validation error for VllmConfig",), exit_code=1))
    sig = next(s for s in SIGNATURES if s.code is C.ENGINE_CONFIG_INVALID)
    assert bare.summary == sig.summary


def test_bad_alloc_once_weights_started_loading_is_not_the_import_order_crash() -> None:
    tail = ("std::bad_alloc",)
    assert diagnose(FailureFacts(log_tail=tail, exit_code=134)).code is C.IMPORT_ORDER_BAD_ALLOC
    at_weights = diagnose(FailureFacts(log_tail=tail, exit_code=134, phase_reached=Phase.WEIGHTS_LOADING))
    assert at_weights.code is not C.IMPORT_ORDER_BAD_ALLOC


def test_diagnoses_are_diagnoses() -> None:
    assert all(isinstance(diagnose(f), Diagnosis) for f in _cases().values())
