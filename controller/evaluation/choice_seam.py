"""The real side of a choice: the survey of every recipe of the host's platform (lint → admission →
render, as `appliance plan` shows each), the arms' expected cost from the launch history, and
`DriverSeam`, the `ChoiceSeam` that runs the real gate (controller/evaluation/compare.py) through the
supervisor in-process (controller/evaluation/controls.py `driver_control`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from appliance.evaluation.bench_tiers import NoTierFits
from appliance.evaluation.tournament import ArmCost, Entry, arm_cost, host_platform
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
        if recipe.abstract or recipe.platform.value != platform:
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


def costs(store: Store, evals: EvalStore, entries: list[Entry]) -> dict[str, ArmCost]:
    """Blocking: each admitted variant's cold/warm ready seconds and bench seconds from history."""
    out: dict[str, ArmCost] = {}
    for e in entries:
        if not e.admitted:
            continue
        history = [(p.start.value if p.start else None, p.ready_s)
                   for p in store.ready_history(e.recipe, e.spec_hash or "")]
        benches = [b for b in (evals.benchmark(str(row["id"])) for row in evals.benchmarks(5, e.recipe)) if b]
        out[e.recipe] = arm_cost(history, [b.finished_at - b.started_at for b in benches if not b.stopped])
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

    async def gate(self, champion: str, candidate: str, progress: Progress) -> GateOutcome:
        try:
            outcome = await compare(
                self.control, champion, candidate, self.params, self.evals,
                ready_timeout_s=self.ready_timeout_s, progress=progress, options=self.options,
            )
        except CompareError as exc:
            message = str(exc)
            for arm in (candidate, champion):  # compare.Control.wait_ready names the arm that did not start
                if message.startswith((f"{arm} failed to start", f"{arm} was not ready")):
                    raise ArmFailed(arm, message) from exc
            raise GateError(message) from exc
        except (EngineNotReady, NoTierFits, ClientError) as exc:
            raise GateError(f"{type(exc).__name__}: {exc}") from exc
        return GateOutcome(outcome.gate.verdict.value, outcome.id, list(outcome.gate.reasons))

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
