"""Why did the engine fail? THE diagnosis of one failed start, from everything the supervisor knows.

`diagnose(facts)` picks one diagnosis from the exit code, signal, docker's OOMKilled flag, the log tail
(scanned against the table, appliance/diagnosis/signatures.py, by appliance/diagnosis/scan.py), kernel OOM
records, GPU events, the phase reached and whether the start stalled or ran over its budget. `retryable`
maps the diagnosis to policy: a pinned-memory OOM "often succeeds on retry" (S11f §10.1) so the
supervisor backs off and relaunches; a configuration bug is not, so it stops as FATAL instead of
crash-looping through a 27-minute start.

Pure: no files, no clocks, no processes. Kernel OOM kills come in as `appliance.observe.kmsg.OomEvent`s
(the supervisor's kmsg watch, already attributed to the engine by `appliance.observe.oom_attribution`) and are
phrased by `oom_attribution.diagnose_oom`, so an OOM reads the same in the watch and here;
`appliance.diagnosis.scan.oom_events_in_text` finds them in saved dmesg/kmsg/journal text for `doctor`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from appliance.diagnosis.scan import Finding, clip, scan_lines
from appliance.diagnosis.signatures import SIGNATURES, Decides, DiagnosisCode, Severity, Signature
from appliance.observe.gpu_events import FaultSide, GpuAction, GpuEvent, GpuEventKind
from appliance.observe.kmsg import OomEvent, OomEventKind, OomScope
from appliance.observe.log_phases import PHASE_LABELS, PROGRESS_ORDER, Phase
from appliance.observe.oom_attribution import diagnose_oom
from appliance.observe.rank_logs import deaths_in

# The table's rows by code (a code is on one row: tests/unit/test_diagnosis.py).
_BY_CODE: dict[DiagnosisCode, Signature] = {s.code: s for s in SIGNATURES}


class Diagnosis(BaseModel):
    model_config = ConfigDict(frozen=True)

    code: DiagnosisCode
    severity: Severity
    summary: str
    hint: str
    evidence: tuple[str, ...]
    retryable: bool
    fact: str
    findings: tuple[Finding, ...] = ()  # everything recognised in the log tail, benign lines included


# --- diagnosing one failure -----------------------------------------------------------------------


@dataclass(frozen=True)
class FailureFacts:
    """Everything the supervisor knows when a start ends badly. All optional: `doctor` has only text."""

    exit_code: int | None = None
    signal: int | None = None  # terminating signal; derived from exit codes > 128 when absent
    oom_killed: bool | None = None  # docker State.OOMKilled
    log_tail: tuple[str, ...] = ()
    oom_events: tuple[OomEvent, ...] = ()  # kernel OOM kills of the engine's processes (attributed)
    gpu_events: tuple[GpuEvent, ...] = ()  # GPU kernel events on the engine's cards or pids (attributed)
    phase_reached: Phase | None = None
    progress: str | None = None  # e.g. PhaseTracker.describe(): "capturing graphs round 2: 38/51 · …"
    stalled: bool = False  # no phase progress and no CPU time for the stall window
    over_budget: bool = False  # the recipe's ready budget ran out
    elapsed_s: float | None = None
    budget_s: float | None = None
    probe_error: str | None = None  # the last readiness-probe error, e.g. "connection reset by peer"
    runtime_reason: str | None = None  # ExitInfo.reason: the runtime's words (kubernetes: Unschedulable: …)


_SIGNAL_NAMES = {1: "SIGHUP", 2: "SIGINT", 6: "SIGABRT", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM"}
_EXCEPTION_LINE = re.compile(r"^\s*(?:\(\S+ pid=\d+\)\s*)?(?:[\w.]+\.)?\w*(?:Error|Exception|Interrupt)\b:?")
_FAILED_PROCS = re.compile(r"Failed core proc\(s\): \{(.*)\}")

def _by_rank(decides: Decides) -> tuple[DiagnosisCode, ...]:
    return tuple(s.code for s in sorted(SIGNATURES, key=lambda s: s.rank) if s.decides is decides)


# Known failures, most specific first (by rank). Kernel OOM first: the kill explains the death, and
# dying workers leave misleading tracebacks.
_FAILURE_ORDER: tuple[DiagnosisCode, ...] = _by_rank(Decides.FAILURE)
# Degradations (warnings) reported when nothing failed, first match wins.
_DEGRADED_ORDER: tuple[DiagnosisCode, ...] = _by_rank(Decides.DEGRADED)


def _signal_of(facts: FailureFacts) -> int | None:
    if facts.signal is not None:
        return facts.signal
    if facts.exit_code is not None and facts.exit_code > 128:
        return facts.exit_code - 128  # shell/docker convention: 128 + signal
    if facts.exit_code is not None and facts.exit_code < 0:
        return -facts.exit_code  # subprocess convention
    return None


def _signal_name(sig: int) -> str:
    return _SIGNAL_NAMES.get(sig, f"signal {sig}")


def _where(facts: FailureFacts) -> str:
    if facts.progress:
        return f" (at: {facts.progress})"
    if facts.phase_reached is not None:
        return f" (furthest phase: {PHASE_LABELS[facts.phase_reached]})"
    return ""


def _from_signature(
    sig: Signature,
    finding: Finding | None,
    facts: FailureFacts,
    findings: tuple[Finding, ...],
    extra_evidence: tuple[str, ...] = (),
    summary: str | None = None,
) -> Diagnosis:
    return Diagnosis(
        code=sig.code,
        severity=sig.severity,
        summary=(summary or sig.summary) + _where(facts),
        hint=sig.hint,
        evidence=extra_evidence + (finding.evidence if finding else ()),
        retryable=sig.retryable,
        fact=sig.fact,
        findings=findings,
    )


def _last_exception(lines: Sequence[str]) -> tuple[str, ...]:
    for line in reversed(lines):
        if _EXCEPTION_LINE.search(line) and "Traceback" not in line:
            return (clip(line.strip()),)
    return ()


_MISSING_MODULE = re.compile(r"No module named '([^']+)'")


_VALUE_ERROR = re.compile(r"Value error, (.+?)(?: \[type=|$)")


def _missing_module_summary(finding: Finding) -> str | None:
    """MODULE_NOT_FOUND names the module(s), ENGINE_CONFIG_INVALID vLLM's reason; None for
    every other code."""
    if finding.code is DiagnosisCode.ENGINE_CONFIG_INVALID:
        reasons = [m.group(1).strip() for line in finding.evidence if (m := _VALUE_ERROR.search(line))]
        return f"vLLM refused the configuration: {reasons[0]} (not retryable)" if reasons else None
    if finding.code is not DiagnosisCode.MODULE_NOT_FOUND:
        return None
    names = sorted({m.group(1) for line in finding.evidence for m in _MISSING_MODULE.finditer(line)})
    return f"Python module {', '.join(repr(n) for n in names)} is not installed: the engine image/venv " \
           "is broken (not retryable)"


_KV_REFUSED = re.compile(
    r"Available memory on node (\d+) \((-?[\d.]+)/([\d.]+) GiB\) on kv cache allocation is less than "
    r"requested memory for kv \((-?[\d.]+(?:/[\d.]+)?) GiB\)")
_GPU_SHORT = re.compile(
    r"Free memory on device\b\s*([^\s(]*)\s*\(([\d.]+)/([\d.]+) GiB\) on startup is less than "
    r"(?:desired GPU memory utilization|the engine's budget[^(]*) \(([\d.]+), ([\d.]+) GiB\)")
_REPO_ID = re.compile(r"Repo id must (?:be in the form|use)[^:]*: '([^']*)'")
_TRACEBACK = re.compile(r"Traceback \(most recent call last\)")
# An exception line, also behind vLLM's `(Worker pid=N) ERROR mm-dd hh:mm:ss [file.py:N] ` prefix.
_RAISED = re.compile(r"(?:^|\]\s|\)\s)\s*(?:[\w.]+\.)?\w*(?:Error|Exception|Interrupt)\b:")


def _ruled_out(code: DiagnosisCode, facts: FailureFacts) -> bool:
    """A row the facts beyond the text rule out: the import-order crash happens at import, so not once
    the log tracker saw the start reach weight loading (the tail may have lost those lines)."""
    if code is not DiagnosisCode.IMPORT_ORDER_BAD_ALLOC or facts.phase_reached is None:
        return False
    reached = facts.phase_reached
    return reached in PROGRESS_ORDER and PROGRESS_ORDER.index(reached) >= PROGRESS_ORDER.index(
        Phase.WEIGHTS_LOADING)


def _summary_from_tail(code: DiagnosisCode, tail: Sequence[str]) -> str | None:
    """Rows whose summary quotes the engine's own numbers or names."""
    if code is DiagnosisCode.KV_CACHE_TOO_LARGE:
        for line in tail:
            if (m := _KV_REFUSED.search(line)) is not None:
                node, free, total, want = m.groups()
                return (f"the KV cache does not fit: vLLM asked for {want} GiB for KV on NUMA node {node}, "
                        f"which had {free} of {total} GiB available (not retryable)")
    if code is DiagnosisCode.GPU_MEMORY_SHORT:
        for line in tail:
            if (m := _GPU_SHORT.search(line)) is not None:
                device, free, total, util, want = m.groups()
                card = f"the card {device}" if device else "the card"
                return (f"{card} had {free} of {total} GiB free at start, less than gpu_memory_utilization "
                        f"{util} asks for ({want} GiB): vLLM refused to start (not retryable)")
    if code is DiagnosisCode.MODEL_PATH_INVALID:
        for line in tail:
            if (m := _REPO_ID.search(line)) is not None:
                return (f"the model path {m.group(1)!r} is not a model folder (missing, or no config.json): "
                        "vLLM took it for a Hugging Face repo id (not retryable)")
    if code is DiagnosisCode.WORKER_DIED:  # reached only when no traceback precedes the death
        return f"{_dead_worker(tail)} without a Python error: it was killed from outside"
    if code is DiagnosisCode.COMPILE_CONSTRAINT_VIOLATION and any("_dummy_run" in line for line in tail):
        return ("torch.compile failed a dynamic-shape guard (ConstraintViolationError) in profile_run → "
                "_dummy_run: the vLLM tree's defect (seen with cudagraph_mode=NONE), not the sdot4 op")
    return None


def _dead_worker(tail: Sequence[str]) -> str:
    """"<which worker> died[ of <signal>]", in the executor's words: vLLM names the process
    `VllmWorker-<rank>` (its tensor-parallel rank) and reports `exit code: -9` for a SIGKILL
    (appliance/observe/rank_logs.py)."""
    deaths = deaths_in(tuple(tail))
    if not deaths:
        return "an engine worker process died"
    d = deaths[0]
    who = f"engine worker {d.process}" + (f" (tensor-parallel rank {d.rank})" if d.rank is not None else "")
    if d.signal is not None:
        return f"{who} died of {_signal_name(d.signal)} (exit code {d.exit_code})"
    if d.exit_code is not None:
        return f"{who} died with exit code {d.exit_code}"
    return f"{who} died"


def _error_before(tail: Sequence[str], finding: Finding) -> str | None:
    """The last Python exception line above the worker's death, when a traceback precedes it."""
    above = tail[:finding.first_line_no - 1]
    if not any(_TRACEBACK.search(line) for line in above):
        return None
    for line in reversed(above):
        if _RAISED.search(line) and "Traceback" not in line:
            return clip(line.strip())
    return "a Python traceback"


def _worker_died_after_error(
    sig: Signature, finding: Finding, facts: FailureFacts, findings: tuple[Finding, ...], error: str,
) -> Diagnosis:
    return Diagnosis(
        code=sig.code, severity=sig.severity,
        summary=f"{_dead_worker(facts.log_tail)} after a Python error (no known signature matched it)"
                + _where(facts),
        hint="read the traceback above the worker's death: the worker raised, it was not killed from "
             "outside; "
             "report the signature if it recurs",
        evidence=(error, *finding.evidence), retryable=True,
        fact="DOMAIN §5: unknown signatures are retried with backoff, then stopped as failed",
        findings=findings,
    )


def diagnose(facts: FailureFacts) -> Diagnosis:
    """THE diagnosis of one failed start. Evidence-first: kernel OOM records, then known log
    signatures, then the docker OOM flag, probes, stall/budget, signal, exit code."""
    tail = list(facts.log_tail)
    findings = tuple(scan_lines(tail))
    found = {f.code: f for f in findings}

    # 1. Kernel OOM kills attributed to the engine: the kill explains the death.
    kills = [e for e in facts.oom_events if e.kind is OomEventKind.KILL]
    if kills:
        return _from_oom(kills, facts, findings)

    # 1a. The card failed under the engine (a fatal Xid, a reset), or the driver saw the engine fault.
    if facts.gpu_events and (gpu := _from_gpu(facts.gpu_events, facts, findings)) is not None:
        return gpu

    # 1b. The runtime says the engine's shim was killed: the engine ended because its parent did (the
    # kernel's parent-death signal), whatever its log says while it shut down.
    if facts.runtime_reason and _SHIM_KILLED.search(facts.runtime_reason):
        return _shim_killed(facts.runtime_reason, facts, findings)

    # 2. Known signatures in the log tail, most specific first.
    for code in _FAILURE_ORDER:
        if code in found and not _ruled_out(code, facts):
            sig = _BY_CODE[code]
            if code is DiagnosisCode.WORKER_DIED and (error := _error_before(tail, found[code])):
                return _worker_died_after_error(sig, found[code], facts, findings, error)
            summary = _missing_module_summary(found[code]) or _summary_from_tail(code, tail)
            return _from_signature(sig, found[code], facts, findings, summary=summary)

    sig_no = _signal_of(facts)

    # 3. Docker says OOM-killed but no kernel record tells global from cgroup.
    if facts.oom_killed:
        return Diagnosis(
            code=DiagnosisCode.OOM_KILLED_UNATTRIBUTED, severity=Severity.ERROR,
            summary="the runtime reports the engine OOM-killed, but no kernel OOM record was available to "
                    "tell a global OOM from a cgroup limit" + _where(facts),
            hint="read `dmesg | grep -E 'oom-kill|Killed process'`: constraint=CONSTRAINT_NONE/global_oom "
                 "means host RAM + swap (add swap, swappiness 200, warm cache, eager); CONSTRAINT_MEMCG "
                 "means a container limit (recreate without one)",
            evidence=(f"OOMKilled=true, exit code {facts.exit_code}",), retryable=False,
            fact="DOMAIN §3: an earlier 'cgroup OOM' diagnosis from memory.events oom_kill was wrong — the "
                 "kernel text said global_oom",
            findings=findings,
        )

    # 3b. The runtime says why the engine never ran (no exit code): its words are the evidence. So
    # too when the controller gave up (budget, stall) while the runtime still said it was waiting
    # (a pod for a node): the stop's own exit code is of the controller's making, not the engine's.
    if facts.runtime_reason and (facts.exit_code is None or facts.over_budget or facts.stalled):
        return _runtime_cannot_run(facts.runtime_reason, facts, findings)

    # 4. The readiness probe was reset while the engine listens on loopback.
    if facts.probe_error and "reset" in facts.probe_error.lower() and DiagnosisCode.LOOPBACK_BIND in found:
        sig = _BY_CODE[DiagnosisCode.BIND_LOCALHOST_IN_BRIDGE]
        return _from_signature(sig, found[DiagnosisCode.LOOPBACK_BIND], facts, findings,
                               extra_evidence=(f"probe: {facts.probe_error}",))

    # 5. Stalled or out of time.
    cache_note = ""
    if DiagnosisCode.AOT_CACHE_MISS in found:
        cache_note = "; the compile cache missed, so this start was cold"
    if facts.stalled:
        return Diagnosis(
            code=DiagnosisCode.STALLED, severity=Severity.ERROR,
            summary="no phase progress and no CPU time for the stall window" + _where(facts) + cache_note,
            hint="look at what the engine waits on (py-spy dump, /proc/<pid>/stack); a model that does not "
                 "fit one card stalls in torch.compile — raise TP",
            evidence=_stall_evidence(facts, tail), retryable=True,
            fact="DOMAIN §3: 28.51 GiB weights on a 31.98 GiB card stalls in torch.compile",
            findings=findings,
        )
    if facts.over_budget:
        spent = ""
        if facts.elapsed_s is not None and facts.budget_s is not None:
            spent = f" ({facts.elapsed_s:.0f} s of a {facts.budget_s:.0f} s budget)"
        return Diagnosis(
            code=DiagnosisCode.READY_BUDGET_EXCEEDED, severity=Severity.ERROR,
            summary="the engine was still starting when its ready budget ran out" + spent + _where(facts)
                    + cache_note,
            hint="raise the recipe's ready budget (default graph needs ≥ 2700 s; recipe C 352 s cold / "
                 "230 s warm; eager B's ready time is not recorded) or make the start warm "
                 "(AOT warm-up then restart)",
            evidence=_stall_evidence(facts, tail), retryable=False,
            fact="DOMAIN §4: default graph is ready after 1542–1583 s; an orchestrator waiting 1500 s killed "
                 "the engine at 38/51 of graph-capture round 2",
            findings=findings,
        )

    # 6. The engine core reported a failed start with no known signature.
    if DiagnosisCode.ENGINE_START_FAILED in found:
        finding = found[DiagnosisCode.ENGINE_START_FAILED]
        child = _failed_child_signal(tail)
        summary = "the engine core failed to start; no known signature matched the traceback"
        if child is not None:
            summary = (f"the engine core failed to start: a core process died of {_signal_name(child)}"
                       + (" — with no OOM record at hand, check dmesg for an OOM kill" if child == 9 else ""))
        return _from_signature(_BY_CODE[DiagnosisCode.ENGINE_START_FAILED], finding, facts, findings,
                               extra_evidence=_last_exception(tail), summary=summary)

    # 7. Killed by a signal, or a plain non-zero exit.
    if sig_no is not None:
        sigkill = sig_no == 9
        return Diagnosis(
            code=DiagnosisCode.KILLED_BY_SIGNAL, severity=Severity.ERROR,
            summary=f"the engine was killed by {_signal_name(sig_no)}" + _where(facts) + cache_note,
            hint=("SIGKILL with no kernel OOM record: something outside killed it (an orchestrator's "
                  "timeout?) — check `dmesg | grep -i oom` if the kmsg watch was not running" if sigkill else
                  "see the log tail; SIGABRT right at import is the import-order bug (torch first)"),
            evidence=(f"exit code {facts.exit_code}, signal {sig_no}", *_last_exception(tail)),
            retryable=True,
            fact="DOMAIN §4: an orchestrator that waits only 1500 s kills a default-graph start at 38/51 of "
                 "round 2",
            findings=findings,
        )
    if facts.exit_code not in (None, 0):
        return Diagnosis(
            code=DiagnosisCode.EXIT_NONZERO, severity=Severity.ERROR,
            summary=f"the engine exited with code {facts.exit_code}" + _where(facts) + cache_note,
            hint="no known signature matched: read the log tail; retried with backoff, then stopped as "
                 "failed",
            evidence=(f"exit code {facts.exit_code}", *_last_exception(tail)), retryable=True,
            fact="ARCHITECTURE 'Failure': classify, back off (10 s doubling to 5 min), relaunch or stop as "
                 "FATAL",
            findings=findings,
        )

    # 8. Nothing failed, but the engine runs degraded: every start is cold, or the all-reduce is slow.
    for code in _DEGRADED_ORDER:
        if code in found:
            return _from_signature(_BY_CODE[code], found[code], facts, findings)

    return Diagnosis(
        code=DiagnosisCode.UNKNOWN, severity=Severity.INFO,
        summary="no known failure signature" + _where(facts),
        hint="nothing to act on from this text alone",
        evidence=(), retryable=True, fact="DOMAIN §5", findings=findings,
    )


# The process runtime's words (controller/runtime/process.py `_ended`): "the engine's shim (pid N) was
# killed (killed by signal 9 (SIGKILL))".
_SHIM_KILLED = re.compile(r"\bshim \(pid \d+\) was killed\b")


def _shim_killed(reason: str, facts: FailureFacts, findings: tuple[Finding, ...]) -> Diagnosis:
    return Diagnosis(
        code=DiagnosisCode.SHIM_KILLED, severity=Severity.ERROR,
        summary=f"{reason}: the engine ended with it" + _where(facts),
        hint="something outside the appliance killed the engine's shim (a `kill -9` by PID or pattern, "
             "a service manager stopping the controller's cgroup, the kernel's OOM killer — check "
             "`dmesg | grep -i oom`); the engine's own exit status is unknown. Retried like a crash",
        evidence=(f"runtime: {reason}",), retryable=True,
        fact="the shim is the engine's parent; when it dies the kernel TERMs the engine and the "
             "runtime ends what is left of its process group",
        findings=findings,
    )


def _runtime_cannot_run(reason: str, facts: FailureFacts, findings: tuple[Finding, ...]) -> Diagnosis:
    # Waiting for capacity can end by itself (an autoscaler, another launch ending): retryable.
    # An image or configuration the runtime refuses needs someone to change it: not retryable.
    capacity = reason.startswith("Unschedulable")
    return Diagnosis(
        code=DiagnosisCode.RUNTIME_CANNOT_RUN, severity=Severity.ERROR,
        summary=f"the runtime could not run the engine: {reason}" + _where(facts),
        hint=("the cluster has no node with the requested GPUs / memory / labels free: see `appliance host "
              "plan RECIPE` for what the node must have, free the resources, or change the node selector; "
              "where an autoscaler adds nodes more slowly than the controller's grace "
              "(APPLIANCE_K8S_UNSCHEDULABLE_GRACE_S, 300 s by default), raise that grace"
              if capacity else
              "the image cannot be pulled or the container cannot be created as rendered: check the image "
              "name, the registry's pull secret and the referenced Secret/claims"),
        evidence=(f"runtime: {reason}",), retryable=capacity,
        fact="a pod the scheduler cannot place never starts, so it has neither exit code nor log",
        findings=findings,
    )


_OOM_CODES = {
    OomScope.GLOBAL: DiagnosisCode.GLOBAL_OOM,
    OomScope.CGROUP: DiagnosisCode.CGROUP_OOM,
    OomScope.CPUSET: DiagnosisCode.NODE_CONSTRAINED_OOM,
    OomScope.MEMPOLICY: DiagnosisCode.NODE_CONSTRAINED_OOM,
}


def _from_oom(kills: Sequence[OomEvent], facts: FailureFacts, findings: tuple[Finding, ...]) -> Diagnosis:
    # A global OOM decides over a cgroup one in the same failure: it is the host, not this container.
    order = (OomScope.GLOBAL, OomScope.CGROUP, OomScope.CPUSET, OomScope.MEMPOLICY, OomScope.UNKNOWN)
    main = min(kills, key=lambda e: order.index(e.scope))
    phase = facts.phase_reached.value if facts.phase_reached is not None else None
    said = diagnose_oom(main, phase=phase)
    code = _OOM_CODES.get(main.scope, DiagnosisCode.OOM_KILLED_UNATTRIBUTED)
    sig = _BY_CODE.get(code)
    others = len(kills) - 1
    more = f" (+{others} more kill{'s' if others > 1 else ''})" if others else ""
    evidence = tuple(line for e in kills for line in e.lines)[:8]
    return Diagnosis(
        code=code, severity=Severity.ERROR, summary=f"{said.title}: {said.detail}{more}",
        hint=said.action, evidence=evidence, retryable=False,
        fact=sig.fact if sig else "DOMAIN §3: tell a global OOM from a cgroup limit by the kernel's "
                                  "constraint=",
        findings=findings,
    )


def _stall_evidence(facts: FailureFacts, tail: Sequence[str]) -> tuple[str, ...]:
    last = tuple(clip(line.strip()) for line in tail[-3:] if line.strip())
    where = (f"at: {facts.progress}",) if facts.progress else ()
    return where + last


def _failed_child_signal(lines: Sequence[str]) -> int | None:
    for line in reversed(lines):
        m = _FAILED_PROCS.search(line)
        if m is not None:
            codes = re.findall(r":\s*(-?\d+)", m.group(1))
            for code in codes:
                if int(code) < 0:
                    return -int(code)
            return None
    return None


_ACTION_HINT = {
    GpuAction.DRAIN_NODE: "drain the node and reboot it; check power, seating and cooling",
    GpuAction.RESET_GPU: "reset the card (nvidia-smi -r -i N, or reboot) before relaunching on it; "
                         "drain the node if it recurs, check cooling",
    GpuAction.CHECK_COOLING: "check cooling and airflow, then reset the card",
    GpuAction.RESTART_APP: "relaunching is enough; reset the card when it is idle",
    GpuAction.NONE: "nothing to do for the card",
}


def _from_gpu(events: Sequence[GpuEvent], facts: FailureFacts,
              findings: tuple[Finding, ...]) -> Diagnosis | None:
    """A GPU event that explains the death: a hardware fault first (fatal ones first), then the
    engine's own fault as the driver saw it. Consequences (Xid 45) and notes (63, 92) explain nothing."""
    hardware = [e for e in events if e.side is FaultSide.HARDWARE and e.action is not GpuAction.NONE]
    hangs = [e for e in events if e.kind is GpuEventKind.RING_TIMEOUT]
    application = [e for e in events if e.side is FaultSide.APPLICATION]
    evidence = tuple(clip(e.text) for e in events if e.text)[:8]
    main = next((e for e in hardware if e.fatal), None) or next(
        (e for e in hardware if e.xid not in (63, 92)), None)
    if main is None and hangs:
        main = hangs[0]
    if main is not None:
        sig = _BY_CODE[DiagnosisCode.GPU_FAULT]
        others = len(events) - 1
        more = f" (+{others} more GPU event{'s' if others > 1 else ''})" if others else ""
        return Diagnosis(
            code=sig.code, severity=Severity.ERROR,
            summary=f"GPU fault, not an engine bug — {main.describe()}{more}" + _where(facts),
            hint=_ACTION_HINT[main.action]
            + (f" — then `appliance gpu reset-done {main.card if main.card is not None else 'N'}`; not "
               "relaunched on this card until then" if main.fatal else ""),
            evidence=evidence, retryable=not main.fatal, fact=sig.fact, findings=findings,
        )
    if application:
        first = application[0]
        sig = _BY_CODE[DiagnosisCode.GPU_ENGINE_FAULT]
        return Diagnosis(
            code=sig.code, severity=Severity.ERROR,
            summary=f"the engine faulted on the GPU — {first.describe()}; the card is healthy"
            + _where(facts),
            hint=sig.hint, evidence=evidence, retryable=True, fact=sig.fact, findings=findings,
        )
    return None
