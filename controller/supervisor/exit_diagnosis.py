"""Why a launch ended: its evidence gathered into `FailureFacts` and classified by the one table
(appliance/diagnosis/diagnosis.py).

Per host: the evidence sources (the kmsg OOM kills, the GPU kernel events) are the host's watches;
the launch's own evidence (exit, log tail, phases, probe error) comes in with its `LaunchRun`.
"""

from __future__ import annotations

from appliance.diagnosis.diagnose import Diagnosis, FailureFacts, diagnose
from appliance.diagnosis.signatures import DiagnosisCode
from controller.runtime.base import ExitInfo
from controller.supervisor.clock import Clock
from controller.supervisor.host_seams import GpuEventSource, OomSource
from controller.supervisor.launch_run import LaunchRun
from controller.supervisor.machine import Launch
from controller.supervisor.signals import Failure

# The failures the machine itself decides; their codes are appliance.diagnosis.signatures's, so the driver's
# re-diagnosis over the evidence and the machine's own verdict use one spelling.
MACHINE_DIAGNOSED = frozenset({DiagnosisCode.STALLED.value, DiagnosisCode.READY_BUDGET_EXCEEDED.value})


def failure_of(d: Diagnosis) -> Failure:
    return Failure(code=d.code.value, summary=d.summary, hint=d.hint, retryable=d.retryable)


class ExitDiagnoser:
    def __init__(self, clock: Clock, oom_events: OomSource | None = None,
                 gpu_events: GpuEventSource | None = None) -> None:
        self._clock = clock
        self._oom_events = oom_events
        self._gpu_events = gpu_events

    def diagnose(
        self, launch: Launch, info: ExitInfo | None, run: LaunchRun | None, *,
        stalled: bool = False, over_budget: bool = False,
    ) -> Diagnosis:
        follower = run.follower if run is not None else None
        tracker = follower.tracker if follower else None
        now = self._clock.now()
        facts = FailureFacts(
            exit_code=info.exit_code if info else None,
            signal=info.signal if info else None,
            oom_killed=info.oom_killed if info else None,
            # When the machine decided (budget, stall), `info` is what stopping the engine returned,
            # so its reason is the controller's doing; what counts is what the runtime said while the
            # engine waited (a pod for a node), so the record has the scheduler's words.
            runtime_reason=(run.runtime_note if run is not None else None) if stalled or over_budget
            else info.reason if info else None,
            log_tail=follower.tail_lines() if follower else (),
            oom_events=tuple(self._oom_events(launch.launch_id)) if self._oom_events else (),
            gpu_events=tuple(self._gpu_events(launch.launch_id)) if self._gpu_events else (),
            phase_reached=tracker.furthest if tracker else None,
            progress=tracker.describe() if tracker and tracker.current else None,
            stalled=stalled,
            over_budget=over_budget,
            elapsed_s=now - launch.started_at,
            budget_s=float(launch.spec.ready_budget_s),
            probe_error=run.probe_error if run is not None else None,
        )
        return diagnose(facts)
