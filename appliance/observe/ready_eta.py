"""The expected ready time of a start, from earlier launches of the same variant. Pure.

A start takes 30 s to 30 minutes (DOMAIN §4: recipe C 352 s cold, 230 s warm; default graph
1542–1583 s), and the ready budget is set generously above that (≥ 2700 s for default graph), so
"12 % of the budget" says little about when this start will be ready or whether it is stuck. The
launch store knows how long earlier starts of the same variant took and how long each of their
phases took; this module turns those rows into:

- the expected ready time: median, range (min–max) and count of earlier launches that reached
  ready, of the same spec hash (falling back to the same recipe) and the same start state — a cold
  start (compile cache missed or emptied) is not compared with a warm one (S14c: 352 vs 230 s);
- each phase against its own history (the median duration of that phase in those launches);
- a *likely stall* flag when the phase the engine is in has taken several times its usual duration
  (≥ `STALL_FACTOR` × median and ≥ `STALL_MIN_EXTRA_S` more). It is a flag for the operator, not a
  verdict: the supervisor's own stall watch (no phase progress *and* no CPU) and the ready budget
  still decide when a start is killed (machine.py) — a slow phase that still makes progress is slow,
  not dead, and graph capture round 2 logs nothing for ~17 minutes.

Phases the recipe cannot have are never shown as pending: an eager recipe (`--enforce-eager`) has
no torch.compile and no graph capture; a CPU recipe has no graph capture. A phase that is seen
anyway is shown as seen (the log is the truth).

No clock and no I/O here: rows come in as `PastLaunch`, time as `now`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from statistics import median
from typing import Literal

from pydantic import BaseModel, ConfigDict

from appliance.observe.log_phases import PHASE_LABELS, PROGRESS_ORDER, Phase

STALL_FACTOR = 3.0  # a phase at ≥ 3× its median duration …
STALL_MIN_EXTRA_S = 30.0  # … and at least 30 s over it is flagged (a 2 s phase at 7 s is noise)

_COMPILE = frozenset({Phase.COMPILE_STARTED, Phase.COMPILE_FINISHED})
_CAPTURE = frozenset({Phase.GRAPH_CAPTURE, Phase.GRAPH_CAPTURE_DONE})


class StartState(StrEnum):
    COLD = "cold"  # the compile cache was empty or missed: the start compiles
    WARM = "warm"  # the compile cache was (expected to be) hit


def start_state(cache: str | None, cold_start: bool | None) -> StartState | None:
    """A start's cache state: the log's proof first (compile cache `hit`/`miss`), else what the
    controller knew when it started it (cache root empty → cold); None when neither is known."""
    if cache == "hit":
        return StartState.WARM
    if cache == "miss":
        return StartState.COLD
    if cold_start is None:
        return None
    return StartState.COLD if cold_start else StartState.WARM


def impossible_phases(eager: bool, cpu: bool) -> frozenset[Phase]:
    """Phases a recipe cannot have: eager has no torch.compile and no graph capture; CPU no capture."""
    out: set[Phase] = set()
    if eager:
        out |= _COMPILE | _CAPTURE
    if cpu:
        out |= _CAPTURE
    return frozenset(out)


def recipe_skips(argv: Sequence[str], platform: str) -> frozenset[Phase]:
    """`impossible_phases` of a launch spec: eager from its `--enforce-eager` (render.py writes it for
    `mode: eager`), CPU from its platform."""
    return impossible_phases(eager="--enforce-eager" in argv, cpu=platform == "cpu")


class PastLaunch(BaseModel):
    """One earlier launch that reached ready, as the store keeps it."""

    model_config = ConfigDict(frozen=True)

    launch_id: str
    spec_hash: str
    start: StartState | None
    ready_s: float
    # (phase name, seconds from the start) of each recorded phase row, in record order
    phases: tuple[tuple[str, float], ...] = ()


class PhaseExpectation(BaseModel):
    model_config = ConfigDict(frozen=True)

    phase: str
    label: str
    status: Literal["done", "current", "pending"]
    took_s: float | None  # done: how long it took; current: how long so far; pending: None
    usual_s: float | None  # median duration in the earlier launches (None: none of them had it)
    samples: int  # how many earlier launches the median is over


class StallFlag(BaseModel):
    model_config = ConfigDict(frozen=True)

    phase: str
    label: str
    took_s: float
    usual_s: float
    text: str  # e.g. "likely stalled: torch.compile 95 s, usually 18 s"


class ReadyEta(BaseModel):
    model_config = ConfigDict(frozen=True)

    start: StartState
    basis: Literal["spec", "recipe"] | None  # which launches it is based on; None: no history
    launches: int  # how many
    median_s: float | None
    min_s: float | None
    max_s: float | None
    elapsed_s: float
    remaining_s: float | None  # median − elapsed (negative: past the usual time)
    budget_s: float
    text: str  # the progress line's words
    phases: tuple[PhaseExpectation, ...]
    stall: StallFlag | None


def phase_durations(reached: Iterable[tuple[str, float]], end: float | None) -> dict[str, float]:
    """How long each progress phase lasted: from its first row to the first row of the next phase
    to arrive (in time order); the last one lasts until `end` (ready), or is left out without one.
    Cache hit/miss rows are outcomes of the compile, not steps, and are skipped."""
    steps = {p.value for p in PROGRESS_ORDER}
    first: dict[str, float] = {}
    for name, at in reached:
        if name in steps and name not in first:
            first[name] = at
    ordered = sorted(first.items(), key=lambda kv: kv[1])  # stable: same-poll rows keep record order
    out: dict[str, float] = {}
    for (name, at), (_, nxt) in itertools.pairwise(ordered):
        out[name] = max(0.0, nxt - at)
    if ordered and end is not None:
        name, at = ordered[-1]
        out[name] = max(0.0, end - at)
    return out


def _secs(x: float) -> str:
    return f"{round(x)} s"


def _range(lo: float, hi: float) -> str:
    return _secs(lo) if round(lo) == round(hi) else f"{round(lo)}–{round(hi)} s"


def _pick(history: Sequence[PastLaunch], spec_hash: str,
          start: StartState) -> tuple[Literal["spec", "recipe"] | None, list[PastLaunch]]:
    same_state = [h for h in history if h.start is start]
    same_spec = [h for h in same_state if h.spec_hash == spec_hash]
    if same_spec:
        return "spec", same_spec
    if same_state:
        return "recipe", same_state
    return None, []


def ready_eta(
    history: Sequence[PastLaunch],
    *,
    spec_hash: str,
    start: StartState,
    budget_s: float,
    started_at: float,
    now: float,
    reached: Mapping[str, float],
    skip: frozenset[Phase] = frozenset(),
) -> ReadyEta:
    """The ETA of the current start.

    `history`: earlier launches of the same recipe that reached ready (any spec hash, any state);
    `reached`: the phases this start has reached, name → when (the same clock as `now`);
    `skip`: phases the recipe cannot have (`impossible_phases`).
    """
    elapsed = max(0.0, now - started_at)
    basis, chosen = _pick(history, spec_hash, start)
    state = start.value

    # Each phase against its own history.
    usual: dict[str, list[float]] = {}
    for h in chosen:
        for name, lasted in phase_durations(h.phases, h.ready_s).items():
            usual.setdefault(name, []).append(lasted)
    mine = phase_durations(sorted(reached.items(), key=lambda kv: kv[1]), None)
    current = max(reached.items(), key=lambda kv: kv[1])[0] if reached else None
    if current is not None:
        # The latest phase to arrive is the one running (ties: the furthest in progress order).
        latest = max(reached.values())
        tied = [p for p in PROGRESS_ORDER if reached.get(p.value) == latest]
        current = tied[-1].value if tied else current
        mine.pop(current, None)
    phases: list[PhaseExpectation] = []
    stall: StallFlag | None = None
    for p in PROGRESS_ORDER:
        name, label = p.value, PHASE_LABELS[p]
        samples = usual.get(name, [])
        usual_s = round(median(samples), 1) if samples else None
        took: float | None
        if name == current:
            took = round(max(0.0, now - reached[name]), 1)
            status: Literal["done", "current", "pending"] = "current"
        elif name in reached:
            took, status = (round(mine[name], 1) if name in mine else None), "done"
        elif p in skip:
            continue
        else:
            took, status = None, "pending"
        phases.append(PhaseExpectation(phase=name, label=label, status=status, took_s=took,
                                       usual_s=usual_s, samples=len(samples)))
        if (status == "current" and p is not Phase.API_UP and took is not None and usual_s is not None
                and took >= STALL_FACTOR * usual_s and took - usual_s >= STALL_MIN_EXTRA_S):
            stall = StallFlag(phase=name, label=label, took_s=took, usual_s=usual_s,
                              text=f"likely stalled: {label} {_secs(took)}, usually {_secs(usual_s)}")

    if not chosen:
        others = "" if not history else f" {state}"
        text = (f"no earlier{others} launches of this variant: expected within the ready budget of "
                f"{_secs(budget_s)}")
        return ReadyEta(start=start, basis=None, launches=0, median_s=None, min_s=None, max_s=None,
                        elapsed_s=round(elapsed, 1), remaining_s=None, budget_s=budget_s, text=text,
                        phases=tuple(phases), stall=stall)

    times = [h.ready_s for h in chosen]
    mid, lo, hi = median(times), min(times), max(times)
    remaining = mid - elapsed
    n = len(chosen)
    over = f"over {n} launch{'es' if n != 1 else ''}" + (" of this recipe" if basis == "recipe" else "")
    why = f"({state}; {_range(lo, hi)} {over})"
    if remaining >= 0.5:
        text = f"expected ready in ~{_secs(remaining)} {why}"
    else:
        text = f"past the usual ready time of ~{_secs(mid)} by {_secs(-remaining)} {why}"
    return ReadyEta(start=start, basis=basis, launches=n, median_s=round(mid, 1), min_s=round(lo, 1),
                    max_s=round(hi, 1), elapsed_s=round(elapsed, 1), remaining_s=round(remaining, 1),
                    budget_s=budget_s, text=text, phases=tuple(phases), stall=stall)
