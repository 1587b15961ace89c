"""The plan of the recipe that runs now: what a restart of it would leave, from the host as it is.

Admission predicts a start from the host's capacity (MemTotal less the page-cache floor, plus swap),
as if nothing ran. For the recipe the controller serves now that reads wrong: a plan showed
"predicted min MemAvailable 20.29 GiB" right under "MemAvailable 19.65 GiB", the running engine's
own footprint being already out of MemAvailable. A restart first stops that engine, so what the new
start has is MemAvailable now plus what that engine holds (its resident memory, measured as the
blue/green check measures it); the predicted low point is that less the start's predicted peak, held
against the recipe's MemAvailable target (DOMAIN §3: host RAM is the binding constraint).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from appliance.recipe.admission import Admission, Verdict


class RunningPlan(BaseModel):
    model_config = ConfigDict(frozen=True)

    recipe: str
    launch_id: str
    start: str  # "cold" or "warm": the start a restart would be (the compile cache as it is)
    mem_available_gib: float
    engine_gib: float | None  # the running engine's resident memory; None: could not be measured
    available_gib: float  # what a restart starts from: MemAvailable now + the engine's footprint
    demand_gib: float | None  # the start's predicted peak (admission's memory model); None: no model
    predicted_min_mem_available_gib: float | None
    target_gib: float
    verdict: Verdict
    text: str


def running_plan(admission: Admission, launch_id: str, mem_available_gib: float, engine_gib: float | None,
                 cold: bool, target_gib: float) -> RunningPlan:
    start = "cold" if cold else "warm"
    checks = {c.name: c for c in admission.checks}
    check = checks.get(f"memory-peak-{start}") or checks.get("memory-peak-cold")
    raw = check.numbers.get("demand_gib") if check is not None else None
    demand = float(raw) if isinstance(raw, int | float) else None
    available = mem_available_gib + (engine_gib or 0.0)
    held = (f"MemAvailable now {mem_available_gib:.2f} GiB + what the engine holds "
            f"{engine_gib:.2f} GiB = {available:.2f} GiB" if engine_gib is not None else
            f"MemAvailable now {mem_available_gib:.2f} GiB (what the engine holds could not be measured: "
            "counted as nothing, so this is a floor)")
    head = (f"{admission.recipe} is running now (launch {launch_id}); a restart ({start} start) would have "
            f"{held}")
    if demand is None:
        return RunningPlan(recipe=admission.recipe, launch_id=launch_id, start=start,
                           mem_available_gib=round(mem_available_gib, 2), engine_gib=_r(engine_gib),
                           available_gib=round(available, 2), demand_gib=None,
                           predicted_min_mem_available_gib=None, target_gib=target_gib, verdict="warn",
                           text=f"{head}; the recipe has no memory model: its peak cannot be predicted")
    low = available - demand
    verdict: Verdict = "warn" if low < target_gib else "admit"
    text = (f"{head}; less its predicted peak {demand:.2f} GiB: predicted min MemAvailable {low:.2f} GiB, "
            f"{'under' if low < target_gib else 'at or above'} the recipe's bar {target_gib:.2f} GiB")
    return RunningPlan(recipe=admission.recipe, launch_id=launch_id, start=start,
                       mem_available_gib=round(mem_available_gib, 2), engine_gib=_r(engine_gib),
                       available_gib=round(available, 2), demand_gib=round(demand, 2),
                       predicted_min_mem_available_gib=round(low, 2), target_gib=target_gib, verdict=verdict,
                       text=text)


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 2)
