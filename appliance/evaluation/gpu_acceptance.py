"""The GPU acceptance run's judge (docs/gpu-h200.md): pure, no I/O beyond what the caller passes.

`scripts/gpu_h200/acceptance.sh` runs, on a lent H200, the launch path a change to how the engine
is launched (env, argv, cache paths, keys) must keep working: `up` with cuda-smollm2-graph (cold,
then warm by `warm_restart`), one more restart, `apply` cuda-smollm2-piecewise (cold + warm), one
more restart, `apply` cuda-smollm2-eager; after each, one chat completion through the gateway.
`scripts/gpu_h200/acceptance_judge.py` reads what came back and calls :func:`judge`.

Per launch it derives from vLLM's own log lines (vLLM 0.26.0):
  - the compile cache dir hash: ``Using cache directory: …/torch_compile_cache/<10 hex>/rank_0_0/…
    for vLLM's torch.compile``;
  - whether the AOT artifact was loaded (``Directly load AOT compilation from path …``) or saved
    (``saved AOT compiled function to …``);
  - torch.compile seconds (``torch.compile takes|took X s in total``).

Verdict PASS only when every launch got ready; for compiled recipes (no ``--enforce-eager``) the
first start was cold (not a hit) and every later start of the recipe is a hit — record ``cache ==
"hit"`` AND the AOT artifact loaded AND the same cache dir hash as that recipe's cold start; every
gateway answer was 200 and every recipe got one; and no planned step of the script was skipped or
failed. The warm/cold ready ratio is reported (goal ≤ 0.45 on graph), never judged.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

CACHE_DIR_RE = re.compile(
    r"Using cache directory: (\S*/torch_compile_cache/([0-9a-f]{10})/rank_\d+_\d+\S*)"
    r" for vLLM's torch\.compile"
)
AOT_LOADED_RE = re.compile(r"Directly load AOT compilation from path (\S+)")
AOT_SAVED_RE = re.compile(r"saved AOT compiled function to (\S+)")
COMPILE_S_RE = re.compile(r"torch\.compile (?:takes|took) ([0-9]+(?:\.[0-9]+)?) s in total")

# Secrets that may reach a log or a CLI output: the admin token (shown once by `up`, exported as
# APPLIANCE_ADMIN_TOKEN), gateway client keys, and the per-launch engine key (vLLM logs its
# non-default args, which may hold `'api_key': ['eng_…']`).
_SECRET_RES = (
    (re.compile(r"(APPLIANCE_ADMIN_TOKEN=)\S+"), r"\1<redacted>"),
    (re.compile(r"(shown once\): )\S+"), r"\1<redacted>"),
    (re.compile(r"adm_[A-Za-z0-9_-]{43}"), "adm_<redacted>"),
    (re.compile(r"sk-app-[0-9a-f]{12}-[A-Za-z0-9_-]+"), "sk-app-<redacted>"),
    (re.compile(r"sk-app-[A-Za-z0-9_-]{20,}"), "sk-app-<redacted>"),
    (re.compile(r"eng_[A-Za-z0-9_-]{43}"), "eng_<redacted>"),
)

WARM_COLD_GOAL = 0.45  # graph's warm/cold ready ratio goal: reported, not a pass criterion
GOAL_RECIPE = "cuda-smollm2-graph"
EXPECTED_RECIPES = ("cuda-smollm2-graph", "cuda-smollm2-piecewise", "cuda-smollm2-eager")
SECTION_PREFIX = "## Acceptance run "


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` without the appliance's secrets (and without any literal `secrets` given)."""
    for literal in secrets:
        if literal:
            text = text.replace(literal, "<redacted>")
    for pattern, repl in _SECRET_RES:
        text = pattern.sub(repl, text)
    return text


@dataclass(frozen=True)
class LogFacts:
    """What one engine log says about vLLM's compile cache."""

    cache_dir: str | None = None
    cache_hash: str | None = None
    aot_loaded: bool = False
    aot_saved: bool = False
    compile_s: float | None = None

    @property
    def aot(self) -> str:
        if self.aot_loaded and self.aot_saved:
            return "loaded+saved"
        return "loaded" if self.aot_loaded else "saved" if self.aot_saved else "–"


def log_facts(text: str) -> LogFacts:
    dirs = CACHE_DIR_RE.findall(text)
    seconds = COMPILE_S_RE.findall(text)
    return LogFacts(
        cache_dir=dirs[0][0] if dirs else None,
        cache_hash=dirs[0][1] if dirs else None,
        aot_loaded=AOT_LOADED_RE.search(text) is not None,
        aot_saved=AOT_SAVED_RE.search(text) is not None,
        compile_s=float(seconds[-1]) if seconds else None,
    )


@dataclass(frozen=True)
class GatewayAnswer:
    """One chat completion through the gateway after a step (`status` None: no HTTP answer)."""

    step: str
    status: int | None
    recipe: str | None = None
    launch_id: str | None = None
    error: str | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GatewayAnswer:
        status = d.get("status")
        return cls(step=str(d.get("step", "?")), status=status if isinstance(status, int) else None,
                   recipe=d.get("recipe"), launch_id=d.get("launch_id"),
                   error=None if d.get("error") is None else str(d.get("error")))


@dataclass(frozen=True)
class StepOutcome:
    """A step of the script: `status` "ok", "skipped" (budget guard), or "rc=N" (failed or cut)."""

    step: str
    status: str


@dataclass(frozen=True)
class LaunchRow:
    launch_id: str
    recipe: str
    kind: str
    start: str  # "cold" | "warm"
    compiled: bool
    status: str
    ready_s: float | None
    cache: str | None
    facts: LogFacts
    has_log: bool
    created_at: float
    gateway: tuple[int | None, ...] = ()


@dataclass
class Verdict:
    date: str
    rows: list[LaunchRow]
    failures: list[str] = field(default_factory=list)
    ratios: dict[str, list[float]] = field(default_factory=dict)
    answers: list[GatewayAnswer] = field(default_factory=list)
    steps: list[StepOutcome] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def word(self) -> str:
        return "PASS" if self.passed else "FAIL"


def _is_compiled(record: Mapping[str, Any]) -> bool:
    argv = record.get("argv") or []
    if argv:
        return "--enforce-eager" not in argv
    return not str(record.get("recipe", "")).endswith("-eager")


def _short(recipe: str) -> str:
    return recipe.removeprefix("cuda-smollm2-")


def _date_of(records: Sequence[Mapping[str, Any]], today: str | None) -> str:
    times = [float(r["created_at"]) for r in records if isinstance(r.get("created_at"), int | float)]
    if times:
        return time.strftime("%Y-%m-%d", time.gmtime(min(times)))
    return today or "unknown-date"


def judge(
    records: Sequence[Mapping[str, Any]],
    logs: Mapping[str, str],
    answers: Sequence[GatewayAnswer],
    steps: Sequence[StepOutcome] = (),
    expected_recipes: Sequence[str] = EXPECTED_RECIPES,
    today: str | None = None,
) -> Verdict:
    """Judge an acceptance run: `records` are `appliance launches ID` JSON objects, `logs` each
    launch's engine log by launch id, `answers` the gateway answers, `steps` the script's steps."""
    ordered = sorted(records, key=lambda r: (float(r.get("created_at") or 0.0), str(r.get("id"))))
    verdict = Verdict(date=_date_of(ordered, today), rows=[], answers=list(answers), steps=list(steps))
    fail = verdict.failures.append
    by_launch: dict[str, list[int | None]] = {}
    for a in answers:
        if a.launch_id:
            by_launch.setdefault(a.launch_id, []).append(a.status)

    cold_of: dict[str, LaunchRow] = {}  # recipe → its latest cold start
    for rec in ordered:
        lid, recipe = str(rec.get("id")), str(rec.get("recipe"))
        kind = str(rec.get("kind"))
        text = logs.get(lid)
        ready = rec.get("ready_s")
        start = "cold" if kind == "cold-warmup" or recipe not in cold_of else "warm"
        row = LaunchRow(
            launch_id=lid, recipe=recipe, kind=kind, start=start, compiled=_is_compiled(rec),
            status=str(rec.get("status")), ready_s=float(ready) if isinstance(ready, int | float) else None,
            cache=rec.get("cache"), facts=log_facts(text or ""), has_log=text is not None,
            created_at=float(rec.get("created_at") or 0.0), gateway=tuple(by_launch.get(lid, ())),
        )
        verdict.rows.append(row)
        name = f"{_short(recipe)} {start} ({lid})"
        if row.ready_s is None:
            fail(f"{name}: never ready (status {row.status}, diagnosis {rec.get('diagnosis_code')})")
        if not row.has_log:
            fail(f"{name}: no engine log to judge")
        if start == "cold":
            cold_of[recipe] = row
            if row.compiled and (row.cache == "hit" or row.facts.aot_loaded):
                fail(f"{name}: the first start was not cold (cache {row.cache}, AOT "
                     f"{row.facts.aot}): the cache root was not empty, so its restarts prove nothing")
            elif row.compiled and row.facts.cache_hash is None and row.has_log:
                fail(f"{name}: no `Using cache directory: …` line: no compile cache dir to compare against")
            continue
        if not row.compiled:
            continue
        cold = cold_of[recipe]
        why = []
        if row.cache != "hit":
            why.append(f"record cache {row.cache!r}, not 'hit'")
        if not row.facts.aot_loaded:
            why.append("no `Directly load AOT compilation from path` (AOT " + row.facts.aot + ")")
        if row.facts.cache_hash != cold.facts.cache_hash:
            why.append(f"cache dir {row.facts.cache_hash} ≠ cold start's {cold.facts.cache_hash} "
                       f"({row.facts.cache_dir} vs {cold.facts.cache_dir})")
        if why:
            fail(f"{name}: warm restart is not a hit: " + "; ".join(why))

    seen = {r.recipe for r in verdict.rows}
    for recipe in expected_recipes:
        if recipe not in seen:
            fail(f"{_short(recipe)}: no launch of {recipe}")
    for recipe in sorted(seen):
        rows = [r for r in verdict.rows if r.recipe == recipe]
        if rows[0].compiled and not any(r.start == "warm" for r in rows):
            fail(f"{_short(recipe)}: no warm restart to judge")
        if not any(a.recipe == recipe or a.launch_id in {r.launch_id for r in rows} for a in answers):
            fail(f"{_short(recipe)}: no chat completion through the gateway")
        first = next((r for r in rows if r.start == "cold"), None)
        if first is not None and first.ready_s:
            verdict.ratios[recipe] = [round(r.ready_s / first.ready_s, 3) for r in rows
                                      if r.start == "warm" and r.ready_s is not None]
    for a in answers:
        if a.status != 200:
            fail(f"gateway after {a.step}: {a.status if a.status is not None else 'no answer'}"
                 + (f" ({a.error})" if a.error else ""))
    for s in steps:
        if s.status != "ok":
            fail(f"step {s.step}: {s.status}")
    return verdict


def _fmt(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def render_table(v: Verdict) -> str:
    lines = [
        "| date | recipe | start | ready (s) | cache | cache dir | AOT | torch.compile (s) | gateway |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in v.rows:
        gw = ", ".join("–" if s is None else str(s) for s in r.gateway) or "–"
        when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(r.created_at)) if r.created_at else v.date
        lines.append(
            f"| {when} | `{r.recipe}` | {r.start} ({r.kind}) | {_fmt(r.ready_s)} | {r.cache or '–'} | "
            f"{r.facts.cache_hash or '–'} | {r.facts.aot} | {_fmt(r.facts.compile_s, 2)} | {gw} |"
        )
    return "\n".join(lines)


def render_ratios(v: Verdict) -> list[str]:
    out = []
    for recipe, ratios in v.ratios.items():
        if not ratios:
            continue
        text = ", ".join(f"{x:.2f}" for x in ratios)
        goal = ""
        if recipe == GOAL_RECIPE:
            met = max(ratios) <= WARM_COLD_GOAL
            goal = f" (goal ≤ {WARM_COLD_GOAL}: {'met' if met else 'not met'}; reported, not judged)"
        out.append(f"- `{recipe}` warm/cold ready: {text}; median {statistics.median(ratios):.2f}{goal}")
    return out


def render_markdown(v: Verdict) -> str:
    """The dated report: verdict, table, warm/cold ratios, failures, gateway answers."""
    lines = [f"**{v.word}** — acceptance run {v.date}: {len(v.rows)} launches, "
             f"{sum(1 for a in v.answers if a.status == 200)}/{len(v.answers)} gateway answers 200.", "",
             render_table(v), ""]
    lines += render_ratios(v)
    if v.failures:
        lines += ["", "Failures:"] + [f"- {f}" for f in v.failures]
    skipped = [s.step for s in v.steps if s.status == "skipped"]
    if skipped:
        lines += ["", "Skipped by the budget guard: " + ", ".join(skipped)]
    return "\n".join(lines) + "\n"


def replace_section(doc: str, v: Verdict, before: str = "## Exact commands") -> str:
    """`doc` with the section `## Acceptance run <date>` inserted (before `before`, else at the
    end) or replaced (up to the next `## ` heading)."""
    heading = SECTION_PREFIX + v.date
    body = (f"{heading}\n\n`bash .gpuwt/scripts/gpu_h200/acceptance.sh` on the lent H200, judged by "
            "`scripts/gpu_h200/acceptance_judge.py` (appliance/evaluation/gpu_acceptance.py).\n\n"
            f"{render_markdown(v)}\n")
    lines = doc.splitlines(keepends=True)
    start = next((i for i, ln in enumerate(lines) if ln.rstrip("\n") == heading), None)
    if start is not None:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        return "".join(lines[:start]) + body + "".join(lines[end:])
    at = next((i for i, ln in enumerate(lines) if ln.rstrip("\n") == before), None)
    if at is None:
        sep = "" if doc.endswith("\n\n") or not doc else ("\n" if doc.endswith("\n") else "\n\n")
        return doc + sep + body
    return "".join(lines[:at]) + body + "".join(lines[at:])


@dataclass(frozen=True)
class Inputs:
    records: list[dict[str, Any]]
    logs: dict[str, str]
    answers: list[GatewayAnswer]
    steps: list[StepOutcome]


def inputs_from_files(files: Mapping[str, str]) -> Inputs:
    """Parse an acceptance folder given as {relative path: text}: `launch-<ID>.json` (the records),
    `runs/<ID>/engine.log`, `gateway.jsonl` (one answer a line), `steps.tsv` (step TAB status)."""
    records: list[dict[str, Any]] = []
    logs: dict[str, str] = {}
    answers: list[GatewayAnswer] = []
    steps: list[StepOutcome] = []
    for path, text in sorted(files.items()):
        parts = path.split("/")
        if len(parts) == 1 and path.startswith("launch-") and path.endswith(".json"):
            # The record is the first JSON object; `launches ID` prints its explanation lines
            # (`compile: …`, `cache miss: …`) after it, on stderr, which a 2>&1 run captures too.
            data, _ = json.JSONDecoder().raw_decode(text.lstrip())
            if isinstance(data, dict) and "id" in data:
                records.append(data)
        elif len(parts) == 3 and parts[0] == "runs" and parts[2] == "engine.log":
            logs[parts[1]] = text
        elif path == "gateway.jsonl":
            answers += [GatewayAnswer.from_dict(json.loads(ln)) for ln in text.splitlines() if ln.strip()]
        elif path == "steps.tsv":
            for ln in text.splitlines():
                if "\t" in ln:
                    step, status = ln.split("\t", 1)
                    steps.append(StepOutcome(step.strip(), status.strip()))
    return Inputs(records, logs, answers, steps)
