"""The real side of a choice: the survey of every recipe of the host's platform (lint → admission →
render, as `appliance plan` shows each), the arms' expected cost from the launch history, and
`DriverSeam`, the `ChoiceSeam` that runs the real gate (controller/evaluation/compare.py) through the
supervisor in-process (controller/evaluation/controls.py `driver_control`).

A sweep's variants (appliance/evaluation/sweep.py) are surveyed the same way, from their generated
files read beside the catalogue before they are written (`survey_variants`), then written into the
preflight's generated-recipe directory (`write_variants`) once the choice is claimed, so the
supervisor applies them by name like any recipe.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from appliance.evaluation.bench_tiers import NoTierFits
from appliance.evaluation.sla_bound import SlaBound, breaches
from appliance.evaluation.sweep import is_variant, variant_sources
from appliance.evaluation.tournament import ArmCost, Entry, arm_cost, host_platform, matching
from appliance.recipe.recipe_loader import RecipeError
from appliance.recipe.render import RenderError
from controller.evaluation.bench import BenchParams
from controller.evaluation.choose import ArmFailed, GateError, GateOutcome, Progress, entry_of
from controller.evaluation.client import ClientError, EngineNotReady
from controller.evaluation.compare import CompareError, CompareOptions, Control, compare
from controller.evaluation.store import EvalStore
from controller.store import Store
from controller.supervisor.preflight import Preflight, UnknownRecipe
from host_setup.facts import HostFactsError


def survey(preflight: Preflight, platform: str | None = None) -> tuple[str, list[Entry]]:
    """Blocking: the host's platform and every launchable recipe of it, each admitted or refused with why."""
    platform = platform or host_platform(preflight.facts())
    entries: list[Entry] = []
    for name, recipe in sorted(preflight.catalogue.load().items()):
        if recipe.abstract or recipe.platform.value != platform or is_variant(name):
            continue
        mode = recipe.engine.mode.value
        try:
            report = preflight.report(name)
        except (UnknownRecipe, RecipeError, HostFactsError, OSError) as exc:
            entries.append(Entry(recipe=name, mode=mode, reason=f"not planned: {exc}"))
            continue
        refusals = [f"{f.code}: {f.summary}" for f in report.refusals]
        refusals += [f"render: {report.render_error}"] if report.render_error else []
        entries.append(entry_of(name, mode, report.spec.spec_hash if report.spec else None,
                                report.admission, refusals))
    return platform, entries


def survey_variants(
    preflight: Preflight, entries: list[Entry], pattern: str, grid: Mapping[str, list[int]]
) -> tuple[list[Entry], dict[str, str]]:
    """Blocking: every sweep variant of the admitted recipes matched by `pattern`, admitted or refused
    like any recipe (read with the catalogue, not yet written), and the files to write for them."""
    swept = [e.recipe for e in matching(entries, pattern) if e.admitted]
    sources = variant_sources(swept, grid)
    texts = {name: text for per in sources.values() for name, text in per.items()}
    try:
        recipes = preflight.catalogue.load_with(
            {str(preflight.generated_path(name)): text for name, text in texts.items()})
    except RecipeError as exc:
        return [Entry(recipe=n, sweep_of=r, reason=f"not loaded: {exc}") for r, per in sources.items()
                for n in per], texts
    out: list[Entry] = []
    for r, per in sources.items():
        for name in per:
            recipe = recipes[name]
            point = {f: getattr(recipe.engine, f) for f in grid}
            try:
                report = preflight.report_of(recipe)
            except (RecipeError, HostFactsError, OSError) as exc:
                out.append(Entry(recipe=name, mode=recipe.engine.mode.value, reason=f"not planned: {exc}",
                                 sweep_of=r, point=point))
                continue
            refusals = [f"{f.code}: {f.summary}" for f in report.refusals]
            refusals += [f"render: {report.render_error}"] if report.render_error else []
            entry = entry_of(name, recipe.engine.mode.value, report.spec.spec_hash if report.spec else None,
                             report.admission, refusals)
            out.append(entry.model_copy(update={"sweep_of": r, "point": point}))
    return out, texts


def write_variants(directory: Path, texts: Mapping[str, str]) -> None:
    """Blocking: the variants' recipe files, each written whole (a reader never sees half of one)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in texts.items():
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, directory / f"{name}.yaml")


def costs(store: Store, evals: EvalStore, entries: list[Entry]) -> dict[str, ArmCost]:
    """Blocking: each admitted variant's cold/warm ready seconds and bench seconds from history.
    A sweep variant never launched yet costs what the recipe it varies cost (a closer guess than
    the defaults; the plan says `from_history` either way)."""
    out: dict[str, ArmCost] = {}
    for e in sorted(entries, key=lambda x: x.sweep_of is not None):  # the swept recipes first
        if not e.admitted:
            continue
        history = [(p.start.value if p.start else None, p.ready_s)
                   for p in store.ready_history(e.recipe, e.spec_hash or "")]
        benches = [b for b in (evals.benchmark(str(row["id"])) for row in evals.benchmarks(5, e.recipe)) if b]
        cost = arm_cost(history, [b.finished_at - b.started_at for b in benches if not b.stopped])
        if not cost.from_history and e.sweep_of is not None and e.sweep_of in out:
            cost = out[e.sweep_of]
        out[e.recipe] = cost
    return out


@dataclass
class DriverSeam:
    """The gate and the switches of a choice, through the controller's own supervisor."""

    control: Control
    preflight: Preflight
    evals: EvalStore
    params: BenchParams
    options: CompareOptions
    ready_timeout_s: float = 3600
    sla: SlaBound | None = None  # the operator's latency bound (--sla): each arm's breaches are measured

    async def gate(
        self, champion: str, candidate: str, progress: Progress, allow_diff: frozenset[str] = frozenset()
    ) -> GateOutcome:
        options = replace(self.options, allow_diff=self.options.allow_diff | allow_diff)
        try:
            outcome = await compare(
                self.control, champion, candidate, self.params, self.evals,
                ready_timeout_s=self.ready_timeout_s, progress=progress, options=options,
            )
        except CompareError as exc:
            message = str(exc)
            for arm in (candidate, champion):  # compare.Control.wait_ready names the arm that did not start
                if message.startswith((f"{arm} failed to start", f"{arm} was not ready")):
                    raise ArmFailed(arm, message) from exc
            raise GateError(message) from exc
        except (EngineNotReady, NoTierFits, ClientError) as exc:
            raise GateError(f"{type(exc).__name__}: {exc}") from exc
        measured = None
        if self.sla is not None:
            measured = {champion: breaches(self.sla, outcome.baselines),
                        candidate: breaches(self.sla, outcome.candidates)}
        return GateOutcome(outcome.gate.verdict.value, outcome.id, list(outcome.gate.reasons), measured)

    async def spec_hash(self, recipe: str) -> str | None:
        try:
            return (await asyncio.to_thread(self.preflight.plan, recipe))[2].spec_hash
        except (UnknownRecipe, RecipeError, RenderError, HostFactsError, OSError):
            return None

    async def serving(self) -> str | None:
        s: dict[str, Any] = await self.control.status()
        return str(s.get("recipe")) if s.get("state") == "ready" else None

    async def switch_to(self, recipe: str) -> None:
        current = ((await self.control.status()).get("launch") or {}).get("id")
        try:
            await self.control.apply(recipe)
            await self.control.wait_ready(recipe, self.ready_timeout_s, current)
        except CompareError as exc:
            raise GateError(str(exc)) from exc
