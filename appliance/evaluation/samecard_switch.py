"""The same-card blue/green run's judge (docs/gpu-h200.md): pure, no I/O beyond what the caller passes.

`scripts/gpu_h200/samecard.sh` runs, on the lent H200: `appliance up` with cuda-smollm2-graph
(gpu_memory_utilization 0.3 of the card, so two engines fit on it), a load of chat completions
through the gateway from `scripts/gpu_h200/switch_load.py`, then `appliance restart` — which must
start the new engine beside the serving one on the SAME card (controller/supervisor/blue_green.py
`same_card_fit`), switch the gateway when it is ready, then drain and stop the old one: no hold.
`scripts/gpu_h200/samecard_judge.py` reads what came back and calls :func:`judge`.

PASS only when all of these hold:
  - a launch's record has the `switch-path` event of blue/green with `gpu_placement` "same_card"
    (its numbers: free GiB per card then, the need, the margin, are reported);
  - it has the `switched` event, it is still ready, and the launch it replaced ended "stopped";
  - no `switch-path` event of that launch says "hold" (nobody was held across its start);
  - the client sent requests before and during the switch, and none failed (every answer 200);
  - the longest request took less than the new engine's start (ready_s): none waited for a start.
The p99 of the requests that began during the switch against the p99 of those before it is
reported, with the goal (≤ 2×), never judged: a tail on a shared card is a figure to read.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# The goal for the switch: the p99 of requests during it within 2× the steady p99.
P99_GOAL_RATIO = 2.0


@dataclass(frozen=True)
class Sample:
    """One client request: when it began (wall-clock seconds, as the launch records), how long it
    took, and its HTTP status (None: no answer, e.g. a reset connection)."""

    start: float
    seconds: float
    status: int | None


@dataclass
class SameCardVerdict:
    passed: bool
    failures: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def word(self) -> str:
        return "PASS" if self.passed else "FAIL"


def samples_of(client: Mapping[str, Any]) -> list[Sample]:
    """The client's `samples` ([start, seconds, status] each, switch_load.py); malformed rows are
    dropped (they are counted in `figures["malformed_samples"]` by :func:`judge`)."""
    out: list[Sample] = []
    for row in client.get("samples") or ():
        if not isinstance(row, Sequence) or len(row) < 3:
            continue
        start, seconds, status = row[0], row[1], row[2]
        if not isinstance(start, int | float) or not isinstance(seconds, int | float):
            continue
        out.append(Sample(float(start), float(seconds), status if isinstance(status, int) else None))
    return out


def p99(values: Sequence[float]) -> float | None:
    """The nearest-rank 99th percentile (None: no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def _events(record: Mapping[str, Any], kind: str) -> list[Mapping[str, Any]]:
    return [e for e in record.get("events") or () if isinstance(e, Mapping) and e.get("kind") == kind]


def _data(event: Mapping[str, Any]) -> Mapping[str, Any]:
    data = event.get("data")
    return data if isinstance(data, Mapping) else {}


def judge(records: Sequence[Mapping[str, Any]], client: Mapping[str, Any]) -> SameCardVerdict:
    """`records`: the launch records (`appliance launches ID --json`); `client`: switch_load.py's JSON."""
    failures: list[str] = []
    figures: dict[str, Any] = {}
    by_id = {str(r.get("id")): r for r in records}
    paths = [(r, e) for r in records for e in _events(r, "switch-path")]
    beside = [(r, e) for r, e in paths if _data(e).get("path") == "blue_green"]
    holds = [(r, e) for r, e in paths if _data(e).get("path") == "hold"]
    figures["holds"] = [f"{r.get('id')}: {e.get('message')}" for r, e in holds]
    if not beside:
        why = "; ".join(figures["holds"]) or "no switch-path event at all"
        return SameCardVerdict(False, [f"no launch took blue/green ({why})"], figures)
    new, path = beside[-1]
    numbers = _data(path)
    figures |= {"launch": new.get("id"), "why": path.get("message"),
                "placement": numbers.get("gpu_placement"),
                "numbers": {k: v for k, v in numbers.items() if str(k).startswith("gpu")}}
    if numbers.get("gpu_placement") != "same_card":
        failures.append(f"blue/green, but not on the same card (placement {numbers.get('gpu_placement')!r})")
    if any(r is new for r, _ in holds):
        failures.append(f"launch {new.get('id')} also has a hold switch-path event")
    switched = _events(new, "switched")
    old_id = str(_data(switched[-1]).get("old_launch_id")) if switched else None
    figures |= {"old_launch": old_id, "status": new.get("status"), "ready_s": new.get("ready_s"),
                "cut": _data(switched[-1]).get("cut") if switched else None}
    if not switched:
        failures.append(f"launch {new.get('id')} has no switched event: the gateway was never pointed at it")
    if new.get("status") != "ready":
        failures.append(f"launch {new.get('id')} is {new.get('status')!r}, not ready")
    old = by_id.get(old_id) if old_id is not None else None
    if switched and (old is None or old.get("status") != "stopped"):
        failures.append(f"the replaced launch {old_id} is "
                        f"{'not in the records' if old is None else repr(old.get('status'))}, not stopped")

    samples = samples_of(client)
    figures["malformed_samples"] = len(client.get("samples") or ()) - len(samples)
    began = path.get("at")
    # The switch ends when the old engine is gone (else, at least, when the gateway moved).
    ended = ((old.get("ended_at") if old is not None else None)
             or (switched[-1].get("at") if switched else None))
    before = [s for s in samples if isinstance(began, int | float) and s.start < began]
    during = [s for s in samples if isinstance(began, int | float) and isinstance(ended, int | float)
              and began <= s.start <= ended]
    failed = [s for s in samples if s.status != 200]
    longest = max(samples, key=lambda s: s.seconds) if samples else None
    steady, switch = p99([s.seconds for s in before]), p99([s.seconds for s in during])
    figures |= {"requests": len(samples), "failed": len(failed),
                "statuses": sorted({str(s.status) for s in failed}),
                "before_switch": len(before), "during_switch": len(during),
                "window_s": round(ended - began, 1) if isinstance(began, int | float)
                and isinstance(ended, int | float) else None,
                "longest_s": round(longest.seconds, 3) if longest else None,
                "p99_steady_s": None if steady is None else round(steady, 3),
                "p99_switch_s": None if switch is None else round(switch, 3),
                "p99_ratio": round(switch / steady, 2) if steady and switch is not None else None,
                "p99_goal_met": ((switch <= P99_GOAL_RATIO * steady) if steady and switch is not None
                                 else None)}
    if not samples:
        failures.append("the client recorded no requests")
    if failed:
        failures.append(f"{len(failed)} of {len(samples)} requests failed (statuses {figures['statuses']})")
    if samples and not before:
        failures.append("no request began before the switch: nothing to compare it with")
    if samples and not during:
        failures.append("no request began during the switch: the load did not cover it")
    ready_s = new.get("ready_s")
    if longest is not None and isinstance(ready_s, int | float) and longest.seconds >= ready_s:
        failures.append(f"a request took {longest.seconds:.1f} s, as long as the new engine's start "
                        f"({ready_s:.1f} s): it was held, not served beside")
    return SameCardVerdict(not failures, failures, figures)


def inputs_from_files(files: Mapping[str, str]) -> tuple[list[Mapping[str, Any]], Mapping[str, Any]]:
    """{relative path: text} of a run's folder → (launch records, client figures): `launch-*.json`
    (one record each) and `client.json`. Unreadable JSON is left out (the judge then says what is
    missing)."""
    records: list[Mapping[str, Any]] = []
    client: Mapping[str, Any] = {}
    for rel, text in sorted(files.items()):
        try:
            data = json.loads(text)
        except ValueError:
            continue
        if not isinstance(data, Mapping):
            continue
        name = rel.rsplit("/", 1)[-1]
        if name.startswith("launch-") and name.endswith(".json"):
            records.append(data)
        elif name == "client.json":
            client = data
    return records, client


def render_text(verdict: SameCardVerdict) -> str:
    """The summary the script prints and the lead reads."""
    f = verdict.figures
    lines = [f"same-card blue/green: {verdict.word}"]
    if f.get("launch") is not None:
        lines.append(f"  launch {f['launch']} replaced {f.get('old_launch')} ({f.get('status')}, ready in "
                     f"{f.get('ready_s')} s); placement {f.get('placement')}; cut {f.get('cut')}")
        lines.append(f"  why: {f.get('why')}")
        lines.append(f"  numbers: {f.get('numbers')}")
    goal = f.get("p99_goal_met")
    if "requests" in f:
        lines.append(f"  requests {f['requests']} ({f['before_switch']} before the switch, "
                     f"{f['during_switch']} during its {f.get('window_s')} s), failed {f['failed']}, "
                     f"longest {f.get('longest_s')} s")
        lines.append(f"  p99 steady {f.get('p99_steady_s')} s, during the switch {f.get('p99_switch_s')} s "
                     f"(ratio {f.get('p99_ratio')}; goal ≤ {P99_GOAL_RATIO:g}×: "
                     f"{'n/a' if goal is None else 'met' if goal else 'not met'})")
    for hold in f.get("holds") or ():
        lines.append(f"  hold: {hold}")
    lines += [f"  FAIL: {why}" for why in verdict.failures]
    return "\n".join(lines)
