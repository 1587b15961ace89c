"""Choosing a recipe for this host: the pure rules of `appliance choose` (the runner is
controller/evaluation/choose.py). Pure: recipes, admissions, launch history and time come in as values.

The candidate order rule (seed 000's A → B → C, seed 004's discipline), said in every record as `RULE`:

- the **baseline** is the safest admitted recipe: eager, the largest predicted host-memory margin
  (the smallest `margin_gib` over its cold and warm starts, appliance/recipe/admission.py); the
  operator may name another (`--baseline`), which must itself be admitted;
- the **candidates** follow, eager before compiled modes (graph), and within a mode the larger
  memory margin first, the smaller margin last (a tie: by name);
- the champion starts as the baseline; each candidate runs the whole gate against the current
  champion and a win (ACCEPT, or ACCEPT-PENDING-FULL, which then needs the full run before promotion)
  makes it champion.

With a sweep (appliance/evaluation/sweep.py), each admitted recipe of the choice first has its
variants gated against each other (`stage="sweep"` lines, under `--allow-diff` for exactly the swept
fields): the first admitted variant in the same order (the larger margin first) starts as the
recipe's sweep champion, a win replaces it, and the last standing is *picked*: the recipe's
tournament line then names that variant. Every sweep line comes before every tournament line, so the
tournament starts only once each recipe has its variant.

Every recipe of the host's platform is a line of the record: refused ones with their lint or
admission reason, not-tried ones with why (the pattern, the budget spent before its turn), a failed
start with its diagnosis (skipped, never retried into the budget), a recipe edited during the choice
as stale.

The budget decides at each candidate's turn, with the time actually spent (`over_budget`), never at
plan time: the plan's ETA is a forecast (on a fresh host the defaults', 2,100 s an arm; the H200's
first choice took 330 s against it, docs/gpu-h200.md), so a candidate the ETAs put past the budget is
planned and says so. Records written before kept their plan-time `not-tried` "budget: ..." lines;
they load as they are and stay not tried.

An operator's latency bound (`--sla`, appliance/evaluation/sla_bound.py) narrows the tournament and
the sweep: a gate won by a candidate over the bound in some tier does not make it champion (its line:
"lost", and why), and a champion over the bound (the baseline: no gate judges it) is named so and is
not promoted. Each arm's measured breaches are on its line (`sla`: None when no bound was asked or the
arm was not measured yet, [] when it held).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping, Sequence
from statistics import median
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from appliance.evaluation.gate import Verdict
from appliance.evaluation.sla_bound import SlaBound
from appliance.host_facts import HostFacts
from appliance.recipe.admission import Admission

RULE = (
    "baseline: the admitted eager recipe with the largest predicted host-memory margin (or the one named); "
    "candidates: eager before compiled modes, within a mode the larger memory margin first, the smaller "
    "last (ties by name); each runs the whole gate against the current champion, a win makes it champion"
)
WINS = frozenset({Verdict.ACCEPT.value, Verdict.ACCEPT_PENDING_FULL.value})
# What one arm costs when the launch store has no history of it yet (a guess, said as such in the plan).
DEFAULT_READY_S = 300.0
DEFAULT_BENCH_S = 600.0

Stage = Literal["sweep", "tournament"]
Status = Literal[
    "baseline", "planned", "running", "won", "lost", "failed-start", "error", "stale", "refused", "not-tried"
]
State = Literal["running", "done", "stopped-budget", "failed", "interrupted"]


class ChoiceInputError(ValueError):
    """Bad input to a choice (a pattern matching nothing, a refused baseline, a budget too small):
    refused before anything is switched."""


class Entry(BaseModel):
    """One recipe of the host's platform as the survey saw it (lint → admission → render)."""

    model_config = ConfigDict(frozen=True)

    recipe: str
    mode: str | None = None
    spec_hash: str | None = None
    admitted: bool = False
    admission: str | None = None  # admit / warn / refuse (None: never reached admission)
    margin_gib: float | None = None
    reason: str | None = None  # why it is refused (lint, admission, render, load)
    numbers: dict[str, float | int | str | None] = Field(default_factory=dict)
    sweep_of: str | None = None  # a sweep variant: the recipe it varies (appliance/evaluation/sweep.py)
    point: dict[str, int] = Field(default_factory=dict)  # … and its grid point


class Line(BaseModel):
    """One recipe's line in the decision record."""

    recipe: str
    status: Status
    why: str = ""
    mode: str | None = None
    spec_hash: str | None = None
    admission: str | None = None
    margin_gib: float | None = None
    numbers: dict[str, float | int | str | None] = Field(default_factory=dict)
    against: str | None = None  # the champion it was gated against
    comparison_id: str | None = None  # the stored compare record (GET /comparisons, `appliance compare`)
    verdict: str | None = None
    reasons: list[str] = Field(default_factory=list)
    eta_s: float | None = None
    # Whether eta_s comes from this host's launch and bench history (False: the defaults, a guess).
    eta_from_history: bool | None = None
    took_s: float | None = None
    stage: Stage = "tournament"
    # A sweep line: the recipe it is a variant of and its grid point; a tournament line: the recipe
    # whose sweep picked this variant (None: the recipe as written).
    sweep_of: str | None = None
    point: dict[str, int] = Field(default_factory=dict)
    # The operator's latency bound on this arm (--sla): None when none was asked or the arm was not
    # measured yet; [] when it held; else each breach as a sentence (appliance/evaluation/sla_bound.py).
    sla: list[str] | None = None


class ChoiceRecord(BaseModel):
    """The decision record (`appliance choices ID`): what was tried, against what, and why."""

    id: str
    state: State = "running"
    platform: str
    pattern: str
    rule: str = RULE
    baseline: str
    champion: str
    champion_why: str = "the baseline: no candidate has beaten it yet"
    # The winning gate's verdict (accept-pending-full: promotion needs the full run first).
    champion_verdict: str | None = None
    serving_before: str | None = None
    promote: bool = False
    promoted: str | None = None
    promoted_at: float | None = None
    promoted_via: str | None = None  # `choose --promote`, the console, the API
    restored: str | None = None
    fast: bool = False
    budget_s: float | None = None
    eta_s: float = 0.0
    started_at: float
    ended_at: float | None = None
    ended_why: str | None = None
    lines: list[Line]
    settings: dict[str, object] = Field(default_factory=dict)  # the gate's knobs as asked (resume uses them)
    versions: dict[str, str] = Field(default_factory=dict)
    cards: dict[str, object] = Field(default_factory=dict)
    sweep: dict[str, list[int]] = Field(default_factory=dict)  # the declared grid (empty: no sweep stage)
    sweep_champions: dict[str, str] = Field(default_factory=dict)  # swept recipe → its variant so far
    picked: dict[str, str] = Field(default_factory=dict)  # swept recipe → the variant its sweep picked

    def line(self, recipe: str, stage: Stage | None = None) -> Line:
        """`recipe`'s line in `stage`; without one, its tournament line first (a picked variant
        has a line in both stages)."""
        found = [x for x in self.lines if x.recipe == recipe and (stage is None or x.stage == stage)]
        return next((x for x in found if x.stage == "tournament"), None) or found[0]

    def group(self, recipe: str) -> list[Line]:
        """The sweep lines of one swept recipe."""
        return [x for x in self.lines if x.stage == "sweep" and x.sweep_of == recipe]


class ArmCost(BaseModel):
    """What one arm is expected to cost, from the launch history (cold and warm ready, bench)."""

    model_config = ConfigDict(frozen=True)

    cold_ready_s: float
    warm_ready_s: float
    bench_s: float
    from_history: bool

    @property
    def total_s(self) -> float:
        # A candidate arm starts cold once then restarts warm (compare.py: both arms are warm), is
        # benched; the champion is switched back to warm and benched again.
        return self.cold_ready_s + self.warm_ready_s + self.bench_s * 2 + self.warm_ready_s


def host_platform(facts: HostFacts) -> str:
    """The platform whose recipes this host runs: its GPUs' vendor, else the CPU."""
    vendors = {g.vendor for g in facts.gpus}
    if "nvidia" in vendors:
        return "cuda"
    if vendors & {"amd", "hygon"}:
        return "gfx906"
    return "cpu"


def margin_of(admission: Admission) -> tuple[float | None, dict[str, float | int | str | None]]:
    """The smallest predicted host-memory margin over the recipe's starts, and that check's numbers."""
    peaks = [c for c in admission.checks if c.name.startswith("memory-peak-")
             and isinstance(c.numbers.get("margin_gib"), (int, float))]
    if not peaks:
        return None, {}
    worst = min(peaks, key=lambda c: float(c.numbers["margin_gib"] or 0.0))
    return float(worst.numbers["margin_gib"] or 0.0), dict(worst.numbers)


def parse_duration(text: str) -> float:
    """`90s`, `45m`, `2h`, `1h30m` or plain seconds → seconds (ChoiceInputError otherwise)."""
    s = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", s):
        return float(s)
    parts = re.findall(r"(\d+(?:\.\d+)?)([hms])", s)
    if not parts or "".join(n + u for n, u in parts) != s:
        raise ChoiceInputError(f"budget {text!r}: say it like 90s, 45m, 2h or 1h30m")
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)


def _sort_key(e: Entry) -> tuple[int, float, str]:
    return (0 if e.mode == "eager" else 1, -(e.margin_gib if e.margin_gib is not None else float("-inf")),
            e.recipe)


def order(entries: Iterable[Entry]) -> list[Entry]:
    """The admitted entries in the rule's order (module doc)."""
    return sorted((e for e in entries if e.admitted), key=_sort_key)


def matching(entries: Sequence[Entry], pattern: str) -> list[Entry]:
    """The entries whose name matches the shell pattern (several may be given, comma-separated)."""
    pats = [p.strip() for p in pattern.split(",") if p.strip()]
    return [e for e in entries if any(fnmatch.fnmatchcase(e.recipe, p) for p in pats)]


def choose_baseline(entries: Sequence[Entry], named: str | None) -> Entry:
    """The named baseline (it must be admitted) or the rule's: the eager admitted recipe with the
    largest margin. ChoiceInputError with the reason when there is none."""
    if named is not None:
        found = next((e for e in entries if e.recipe == named), None)
        if found is None:
            raise ChoiceInputError(f"baseline {named!r} is not among the recipes chosen from")
        if not found.admitted:
            raise ChoiceInputError(f"baseline {named!r} is refused on this host: {found.reason}")
        return found
    eager = [e for e in order(entries) if e.mode == "eager"]
    if not eager:
        admitted = order(entries)
        if not admitted:
            raise ChoiceInputError("no recipe is admitted on this host: nothing to choose from")
        raise ChoiceInputError(
            "no admitted eager recipe to be the baseline (seed 000: the safe baseline runs eager); "
            "name one with --baseline"
        )
    return eager[0]


def arm_cost(history: Sequence[tuple[str | None, float]], bench_history: Sequence[float]) -> ArmCost:
    """Median cold and warm ready seconds (`history`: (start state, ready_s) of earlier launches of the
    variant) and the median bench seconds of its earlier benches; defaults where none is known."""
    cold = [s for st, s in history if st == "cold"]
    warm = [s for st, s in history if st == "warm"]
    known = bool(history or bench_history)
    warm_s = median(warm) if warm else (median(cold) if cold else DEFAULT_READY_S)
    return ArmCost(
        cold_ready_s=median(cold) if cold else warm_s,
        warm_ready_s=warm_s,
        bench_s=median(bench_history) if bench_history else DEFAULT_BENCH_S,
        from_history=known,
    )


def plan(
    *,
    choice_id: str,
    platform: str,
    entries: Sequence[Entry],
    pattern: str,
    baseline: str | None,
    costs: Mapping[str, ArmCost],
    budget_s: float | None,
    started_at: float,
    serving_before: str | None = None,
    promote: bool = False,
    fast: bool = False,
    variants: Sequence[Entry] = (),
    sweep: Mapping[str, Sequence[int]] | None = None,
) -> ChoiceRecord:
    """The plan of a choice: every entry a line, the baseline, the candidates in order with their
    ETA; refused and unmatched ones with why. Every admitted candidate is planned, even one the ETAs
    put past the budget (its why says so): the ETA is a forecast (on a fresh host the defaults'
    guess), and the runner decides at each turn with the time actually spent (`over_budget`).
    The record's ETA is the sum over every planned line. ChoiceInputError for bad input.
    `variants`: the sweep's variants of the chosen recipes (each with `sweep_of`), surveyed like
    any recipe; their lines come first (module doc)."""
    chosen = matching(entries, pattern)
    if not chosen:
        names = ", ".join(sorted(e.recipe for e in entries)) or "none"
        raise ChoiceInputError(f"the pattern {pattern!r} matches no recipe of platform {platform} ({names})")
    base = choose_baseline(chosen, baseline)
    candidates = [e for e in order(chosen) if e.recipe != base.recipe]
    swept = [base, *candidates] if sweep else []
    groups = {r.recipe: order(v for v in variants if v.sweep_of == r.recipe) for r in swept}
    # The first gate of the choice: a sweep's second variant against its first, else a candidate.
    firsts = [(g[1], g[0].recipe) for g in groups.values() if len(g) > 1]
    firsts += [(c, base.recipe) for c in candidates]
    if budget_s is not None and firsts:
        first = costs[firsts[0][0].recipe].total_s
        if budget_s < first:
            raise ChoiceInputError(
                f"budget {budget_s:.0f} s is too small for one arm: {firsts[0][0].recipe} is expected to "
                f"take {first:.0f} s against {firsts[0][1]}"
            )
    chosen_names = {e.recipe for e in chosen}
    lines: list[Line] = []
    eta = 0.0

    def line(
        e: Entry, status: Status, why: str, eta_s: float | None = None, stage: Stage = "tournament"
    ) -> Line:
        known = costs[e.recipe].from_history if eta_s is not None and e.recipe in costs else None
        return Line(recipe=e.recipe, status=status, why=why, mode=e.mode, spec_hash=e.spec_hash,
                    admission=e.admission, margin_gib=e.margin_gib, numbers=e.numbers, eta_s=eta_s,
                    eta_from_history=known, stage=stage, sweep_of=e.sweep_of if stage == "sweep" else None,
                    point=e.point)

    for r in swept:
        group = groups[r.recipe]
        for rank, v in enumerate(group):
            if rank == 0:
                lines.append(line(v, "baseline", f"the sweep of {r.recipe} starts from its admitted variant "
                                  "with the largest memory margin", stage="sweep"))
                continue
            cost = costs[v.recipe].total_s
            why = f"variant {rank + 1} of {r.recipe}'s sweep{may_not_fit(eta, cost, budget_s)}"
            eta += cost
            lines.append(line(v, "planned", why, cost, "sweep"))
        for v in sorted((v for v in variants if v.sweep_of == r.recipe and not v.admitted),
                        key=lambda x: x.recipe):
            lines.append(line(v, "refused", v.reason or "refused", stage="sweep"))
    lines.append(line(base, "baseline", "named with --baseline" if baseline else
                      "the safest admitted recipe: eager, the largest memory margin"))
    for rank, e in enumerate(candidates, start=1):
        cost = costs[e.recipe].total_s
        why = f"candidate {rank} by the rule{may_not_fit(eta, cost, budget_s)}"
        eta += cost
        lines.append(line(e, "planned", why, cost))
    for e in sorted(entries, key=lambda x: x.recipe):
        if e.recipe in chosen_names and e.admitted:
            continue
        if e.recipe not in chosen_names:
            lines.append(line(e, "not-tried", f"not matched by the pattern {pattern!r}"))
        else:
            lines.append(line(e, "refused", e.reason or "refused"))
    record = ChoiceRecord(
        id=choice_id, platform=platform, pattern=pattern, baseline=base.recipe, champion=base.recipe,
        serving_before=serving_before, promote=promote, fast=fast, budget_s=budget_s, eta_s=eta,
        started_at=started_at, lines=lines, sweep={k: list(v) for k, v in (sweep or {}).items()},
        sweep_champions={r: g[0].recipe for r, g in groups.items() if g},
    )
    for r in swept:
        if not groups[r.recipe]:
            t = record.line(r.recipe, "tournament")
            t.why += "; as written: no variant of its sweep is admitted"
        record = settle(record, r.recipe)
    return record


def champion_for(record: ChoiceRecord, x: Line) -> str:
    """Whom a line is gated against: its sweep's variant so far, or the tournament's champion."""
    if x.stage == "sweep" and x.sweep_of is not None:
        return record.sweep_champions[x.sweep_of]
    return record.champion


def allow_diff_for(record: ChoiceRecord, x: Line) -> frozenset[str]:
    """The differences a line's gate allows: exactly the swept fields in a sweep, none between recipes."""
    return frozenset(record.sweep) if x.stage == "sweep" else frozenset()


def settle(record: ChoiceRecord, recipe: str) -> ChoiceRecord:
    """Once no variant of `recipe`'s sweep is left to gate, the variant standing is picked: the
    recipe's tournament line (and the baseline or champion, if it is that recipe) names it."""
    group = record.group(recipe)
    champ = record.sweep_champions.get(recipe)
    if champ is None or recipe in record.picked or any(x.status in ("planned", "running") for x in group):
        return record
    out = record.model_copy(deep=True)
    v = out.line(champ, "sweep")
    t = out.line(recipe, "tournament")
    t.recipe, t.spec_hash, t.mode, t.admission = v.recipe, v.spec_hash, v.mode, v.admission
    t.margin_gib, t.numbers, t.sweep_of, t.point = v.margin_gib, dict(v.numbers), recipe, dict(v.point)
    t.why = f"{t.why}; the variant its sweep picked ({', '.join(f'{k}={n}' for k, n in v.point.items())})"
    out.picked[recipe] = champ
    if out.baseline == recipe:
        out.baseline = champ
    if out.champion == recipe:
        out.champion = champ
    return out


def next_candidate(record: ChoiceRecord) -> Line | None:
    """The next planned line, or None when the tournament is over."""
    return next((x for x in record.lines if x.status == "planned"), None)


def judged(record: ChoiceRecord, recipe: str, verdict: str, comparison_id: str | None,
           reasons: Sequence[str], took_s: float, stage: Stage = "tournament",
           sla: Mapping[str, list[str]] | None = None) -> ChoiceRecord:
    """The record after `recipe`'s gate against the champion (of its sweep, in that stage): a win
    makes it champion — unless the operator's bound (`sla`: arm recipe → its breaches in this gate,
    given when a bound was asked) is broken by the candidate. The champion's breaches land on its line
    the first time it is measured."""
    out = record.model_copy(deep=True)
    x = out.line(recipe, stage)
    against = champion_for(record, x)
    over = list((sla or {}).get(recipe) or [])
    if sla is not None:
        x.sla = over
        champ = _line_of(out, against)
        if champ is not None and champ.sla is None and against in sla:
            champ.sla = list(sla[against])
    won = verdict in WINS and not over
    x.status = "won" if won else "lost"
    x.verdict, x.comparison_id, x.reasons = verdict, comparison_id, list(reasons)
    x.against, x.took_s = against, took_s
    if verdict in WINS and over:
        x.why = f"won its gate against {against} ({verdict}) but breaks the SLA: {'; '.join(over)}"
    else:
        x.why = (f"beat {against} ({verdict})" if won else f"did not beat {against} ({verdict})")
    if stage == "sweep" and x.sweep_of is not None:
        x.why += f" with --allow-diff {','.join(record.sweep)}"
        if won:
            out.sweep_champions[x.sweep_of] = recipe
        return settle(out, x.sweep_of)
    if won:
        out.champion, out.champion_verdict = recipe, verdict
        out.champion_why = f"won its gate against {against} ({verdict}, comparison {comparison_id})"
    return out


def _line_of(record: ChoiceRecord, recipe: str) -> Line | None:
    """The line a champion's measurements belong to: its tournament line, else its sweep line."""
    return next((x for x in record.lines if x.recipe == recipe and x.stage == "tournament"),
                next((x for x in record.lines if x.recipe == recipe), None))


def sla_of(record: ChoiceRecord) -> SlaBound | None:
    """The operator's bound, as the choice was asked (its settings: the one place it is kept)."""
    raw = record.settings.get("sla")
    return SlaBound.model_validate(raw) if raw else None


def champion_over_sla(record: ChoiceRecord) -> list[str]:
    """The champion's breaches of the operator's bound ([]: none asked, held, or not measured)."""
    champ = _line_of(record, record.champion)
    return list(champ.sla or []) if champ is not None and sla_of(record) is not None else []


def skipped(
    record: ChoiceRecord, recipe: str, status: Status, why: str, took_s: float | None = None,
    stage: Stage = "tournament",
) -> ChoiceRecord:
    """The record with `recipe` skipped (a failed start, an error, a stale spec), never retried."""
    out = record.model_copy(deep=True)
    x = out.line(recipe, stage)
    x.status, x.why, x.against, x.took_s = status, why, champion_for(record, x), took_s
    if stage == "sweep" and x.sweep_of is not None:
        return settle(out, x.sweep_of)
    return out


def may_not_fit(eta_before_s: float, cost_s: float, budget_s: float | None) -> str:
    """The words a planned line gets when, by the ETAs, it would start too late to finish within the
    budget ('' when it fits): a forecast only, `over_budget` decides at its turn."""
    if budget_s is None or eta_before_s + cost_s <= budget_s:
        return ""
    left = max(0.0, budget_s - eta_before_s)
    return (f"; by the ETA it may not fit: expected {cost_s:.0f} s, {left:.0f} s of {budget_s:.0f} s "
            "left at its turn")


def budget_note(eta_s: float, budget_s: float | None) -> str:
    """What a plan says beside its ETA when that is over the budget ('' otherwise); one line."""
    if budget_s is None or eta_s <= budget_s:
        return ""
    return ("a forecast over the budget: the budget is checked at each candidate's turn against the time "
            "spent, so it may stop the choice before the last candidates")


def over_budget(record: ChoiceRecord, elapsed_s: float, recipe: str, stage: Stage = "tournament") -> bool:
    """Whether `recipe`, started now, would by its ETA end past the budget: the time actually spent
    (`elapsed_s`) plus its expected cost. The one budget decision of a running choice."""
    if record.budget_s is None:
        return False
    return elapsed_s + (record.line(recipe, stage).eta_s or 0.0) > record.budget_s


def stop_at_budget(record: ChoiceRecord, elapsed_s: float, now: float) -> ChoiceRecord:
    """The budget is spent: the rest is not tried, the champion so far stands."""
    out = record.model_copy(deep=True)
    for x in out.lines:
        if x.status == "planned":
            x.status = "not-tried"
            x.why = f"budget: {elapsed_s:.0f} s of {record.budget_s or 0:.0f} s spent before its turn"
    why = f"the budget stopped it with the champion so far ({out.champion})"
    return ended(out, "stopped-budget", now, why)


def promotion_refusal(record: ChoiceRecord) -> str | None:
    """Why the champion cannot be promoted after the choice (None: it can)."""
    if record.state == "running":
        return f"choice {record.id} is still running: promote it once it has ended"
    if record.champion_verdict == Verdict.ACCEPT_PENDING_FULL.value:
        return (f"{record.champion}'s gate was ACCEPT-PENDING-FULL: promotion needs the full run first "
                f"(appliance compare --full {record.line(record.champion).against or record.baseline} "
                f"{record.champion})")
    if record.state == "failed" and record.champion == record.baseline:
        return f"choice {record.id} failed before any candidate was judged: there is no decision to promote"
    over = champion_over_sla(record)
    if over:
        return (f"{record.champion} breaks the SLA asked for this choice ({'; '.join(over)}): no recipe "
                f"tried meets it; not promoted")
    return None


def promotion_recorded(record: ChoiceRecord, now: float, via: str) -> ChoiceRecord:
    """The record once its champion's apply was accepted."""
    return record.model_copy(update={"promoted": record.champion, "promoted_at": now, "promoted_via": via})


def ended(record: ChoiceRecord, state: State, now: float, why: str) -> ChoiceRecord:
    out = record.model_copy(update={"state": state, "ended_at": now, "ended_why": why})
    return out


def resumed(record: ChoiceRecord) -> ChoiceRecord:
    """After a controller restart: a candidate whose gate was cut off runs again (a compare stores
    nothing until its verdict, so nothing of it is counted twice)."""
    out = record.model_copy(deep=True)
    for x in out.lines:
        if x.status == "running":
            x.status, x.why = "planned", "its gate was cut off by a controller restart: run again"
    return out


def markdown(record: ChoiceRecord) -> str:
    """The decision record as a Markdown table anyone can read later."""
    head = [
        f"# Choice {record.id} ({record.state})",
        "",
        f"- platform: {record.platform}; recipes: `{record.pattern}`"
        + ("; FAST MODE (capped outputs: not a full measurement)" if record.fast else ""),
        f"- champion: **{record.champion}** — {record.champion_why}",
        *([f"- SLA (--sla): {summary}"] if (summary := sla_summary(record)) else []),
        f"- baseline: {record.baseline}; serving before: {record.serving_before or 'nothing'}",
        f"- rule: {record.rule}",
        f"- budget: {_secs(record.budget_s)}; expected: {_secs(record.eta_s)}; "
        f"took: {_secs((record.ended_at or record.started_at) - record.started_at)}",
    ]
    if record.ended_why:
        head.append(f"- ended: {record.ended_why}")
    if record.promote or record.promoted or record.restored:
        via = f" (via {record.promoted_via})" if record.promoted_via else ""
        head.append(f"- promoted: {record.promoted or 'no'}{via}; returned to: {record.restored or '-'}")
    if record.sweep:
        grid = "; ".join(f"{k}={','.join(str(v) for v in vs)}" for k, vs in record.sweep.items())
        picked = ", ".join(f"{k} → {v}" for k, v in record.picked.items()) or "none yet"
        head.append(f"- sweep stage: {grid} (gated under --allow-diff {','.join(record.sweep)}); "
                    f"picked: {picked}")
    rows: list[str] = []
    for title, stage in (("Sweep stage", "sweep"), ("Tournament", "tournament")):
        shown = [x for x in record.lines if x.stage == stage]
        if stage == "sweep" and not shown:
            continue
        rows += _table(shown, f"## {title}" if record.sweep else None)
    return "\n".join(head + rows) + "\n"


def sla_summary(record: ChoiceRecord) -> str | None:
    """The operator's bound and where the champion stands against it (None: no bound was asked)."""
    bound = sla_of(record)
    if bound is None:
        return None
    champ = _line_of(record, record.champion)
    over = champion_over_sla(record)
    state = (f"breaks it: {'; '.join(over)}" if over else
             "holds it" if champ is not None and champ.sla is not None else "was not measured against it")
    return f"{bound.words()}; the champion {state}"


def _table(lines: Sequence[Line], title: str | None) -> list[str]:
    rows = ["", *([title, ""] if title else []),
            "| recipe | mode | admission | margin GiB | status | against | verdict | comparison | ETA "
            "| took | why |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for x in lines:
        margin = "-" if x.margin_gib is None else f"{x.margin_gib:.2f}"
        rows.append(
            f"| {x.recipe} | {x.mode or '-'} | {x.admission or '-'} | {margin} | {x.status} "
            f"| {x.against or '-'} "
            f"| {x.verdict or '-'} | {x.comparison_id or '-'} | {_secs(x.eta_s)} | {_secs(x.took_s)} "
            f"| {line_why(x).replace('|', '/')} |"
        )
    return rows


def line_why(x: Line) -> str:
    """The line's why, with its breaches of the operator's bound when the why does not say them."""
    if x.sla and "breaks the SLA" not in x.why:
        return f"{x.why}; over the SLA: {'; '.join(x.sla)}"
    return x.why


def _secs(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s / 60:.1f} min" if s >= 120 else f"{s:.0f} s"
