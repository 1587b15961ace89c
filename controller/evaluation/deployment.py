"""Seed 004 §7's deployment check, run where the engine runs once it is ready, recorded with the
launch as one `deployment-proof` event (its time is when the probe landed).

The probe (appliance/evaluation/deployment.py) imports torch and vllm in the engine's own interpreter
— seconds — so it runs in a thread from the on-ready hook (controller/evaluation/proof.py), after
the kernel-path proof and off the ready path's timing. It is bounded (`PROBE_TIMEOUT_S`) and never
fails the launch: a probe that cannot run is recorded as such, and the gate's proof step fails a
recipe that declared `expect.deployment` on it (ProofResult.problems).
"""

from __future__ import annotations

import time
from typing import Any

from appliance.engine_secret import redact as redact_keys
from appliance.evaluation.deployment import (
    DeploymentFacts,
    evaluate,
    parse_probe_output,
    probe_argv,
    probe_script,
    version_summary,
)
from appliance.recipe.launch_spec import LaunchSpec
from appliance.recipe.recipe_model import DeploymentCheck
from controller.runtime.base import EngineExec, EngineHandle, EngineRuntimeError, Runtime

DEPLOYMENT_EVENT = "deployment-proof"
# Importing torch then vllm takes seconds on the H200 host; the gfx906 fork under DTK is slower to
# import (its extensions load at import). Bounded well past both, never the ready budget.
PROBE_TIMEOUT_S = 120.0


def probe_facts(runtime: Runtime, spec: LaunchSpec, handle: EngineHandle, check: DeploymentCheck | None,
                timeout_s: float = PROBE_TIMEOUT_S) -> DeploymentFacts:
    """Blocking (a child process or a docker exec): run it in a thread."""
    if not isinstance(runtime, EngineExec):
        return DeploymentFacts(
            error=f"the {handle.runtime} runtime cannot run a command where the engine runs")
    try:
        code, text = runtime.engine_exec(spec, handle, probe_argv(spec, probe_script(check)), timeout_s)
    except EngineRuntimeError as exc:
        return DeploymentFacts(error=redact_keys(str(exc))[:500])
    if code is None:
        return DeploymentFacts(error=f"the probe did not finish within {timeout_s:.0f} s")
    facts = parse_probe_output(redact_keys(text))
    if facts.error is not None and code != 0:
        facts = facts.model_copy(update={"error": f"exit code {code}; {facts.error}"})
    return facts


def deployment_record(runtime: Runtime, spec: LaunchSpec, handle: EngineHandle,
                      check: DeploymentCheck | None, timeout_s: float = PROBE_TIMEOUT_S) -> dict[str, Any]:
    """The `deployment-proof` event's data: what was declared, what the probe saw, the problems."""
    started = time.monotonic()
    facts = probe_facts(runtime, spec, handle, check, timeout_s)
    return {
        "declared": check.model_dump(mode="json") if check is not None else None,
        "facts": facts.model_dump(mode="json"),
        "problems": evaluate(check, facts),
        "versions": version_summary(facts),
        "probe_s": round(time.monotonic() - started, 3),
    }


def summary(record: dict[str, Any]) -> str:
    problems: list[str] = record.get("problems") or []
    declared = record.get("declared")
    verdict = ("; ".join(problems) if problems else
               "deployed as declared" if declared else "no deployment check declared")
    return f"deployment: {verdict}; {record.get('versions')}"
