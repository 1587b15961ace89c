"""One controller's choices (`appliance choose`): the body a choice is asked with, and `Choices`, what
the admin API (controller/evaluation/router.py) and the console (controller/console/routes/choices.py)
both ask of them — a plan with its ETA, a start, a promotion — over one store and one runner, so a
choice started from either is the same choice and two cannot run at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from appliance.evaluation.accuracy import ITEMS_PER_KIND
from appliance.evaluation.bench_tiers import FIRST_N
from appliance.evaluation.protocol import Thresholds
from appliance.evaluation.sla_bound import SlaBound
from appliance.evaluation.sweep import check_sweep
from appliance.evaluation.tournament import (
    ArmCost,
    ChoiceInputError,
    ChoiceRecord,
    Entry,
    plan,
    promotion_recorded,
    promotion_refusal,
)
from appliance.evaluation.tournament import parse_duration as parse_duration
from controller.evaluation.bench import BenchParams
from controller.evaluation.choice_seam import DriverSeam, costs, survey, survey_variants, write_variants
from controller.evaluation.choice_store import ChoiceStore
from controller.evaluation.choose import Chooser
from controller.evaluation.compare import CompareOptions
from controller.evaluation.controls import driver_control
from controller.evaluation.store import EvalStore
from controller.store import Store
from controller.supervisor.driver import Driver
from controller.supervisor.preflight import Preflight
from controller.supervisor.signals import Apply

_NAME = r"^[a-z0-9][a-z0-9._-]*$"
FAST_OUTPUT_TOKENS = 64  # the fast mode's cap (the CLI's `--fast`): named as such in every record


class ChoiceBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    recipes: str = Field(default="*", min_length=1, max_length=400, pattern=r"^[a-z0-9*?\[\]!._,-]+$")
    baseline: str | None = Field(default=None, min_length=1, max_length=200, pattern=_NAME)
    budget: str | None = Field(default=None, min_length=1, max_length=20)  # 90s, 45m, 2h, 1h30m
    platform: Literal["cpu", "cuda", "gfx906"] | None = None  # None: this host's (its GPUs' vendor)
    promote: bool = False
    dry_run: bool = False  # the plan and its ETA only: nothing is claimed or switched
    fast: bool = False  # FAST MODE: outputs capped, small accuracy sets (tests; named in the record)
    requests_per_tier: int = Field(default=FIRST_N, ge=FIRST_N, le=1000)
    concurrency: int = Field(default=5, ge=1, le=256)
    accuracy: bool = True  # off: every gate says its accuracy step was not run (a HOLD at best)
    accuracy_items: int = Field(default=ITEMS_PER_KIND, ge=1, le=200)
    max_rounds: int = Field(default=3, ge=1, le=10)
    ready_timeout_s: float = Field(default=3600, gt=0, le=4 * 3600)
    # The sweep stage (appliance/evaluation/sweep.py): field → values, e.g. {"max_num_seqs": [64, 128]};
    # which fields, how many values and which numbers are checked there (422 naming the rule).
    sweep: dict[str, list[int]] | None = None
    # The operator's latency bound (appliance/evaluation/sla_bound.py): P99 TTFT / TPOT in ms per tier;
    # a candidate over it does not become champion, a champion over it is not promoted.
    sla: SlaBound | None = None


class BesideRefused(RuntimeError):
    """A compare or choice refused because engines run beside the primary (the reason is the message)."""


class PromoteRefused(RuntimeError):
    """A champion that cannot be promoted now (the reason is the message); `busy`: the controller
    refused the apply (a start in progress), not the choice."""

    def __init__(self, message: str, busy: bool = False) -> None:
        super().__init__(message)
        self.busy = busy


@dataclass
class Prepared:
    """Everything a choice is planned from, gathered once (survey, variants, history)."""

    body: ChoiceBody
    platform: str
    entries: list[Entry]
    variants: list[Entry]
    texts: dict[str, str]
    costs: dict[str, ArmCost]
    budget_s: float | None
    grid: dict[str, list[int]]
    serving_before: str | None
    extra: dict[str, Any]


def beside_refusal(beside: list[str], what: str) -> str | None:
    """Why `what` (a compare, a choice, a promotion) may not run while engines run beside the primary:
    it switches the primary through recipes whose names and ports nobody checked against theirs, and
    its measurements would share the host with them. None when none runs beside it."""
    if not beside:
        return None
    names = ", ".join(beside)
    stops = "; ".join(f"appliance stop --model {name}" for name in beside)
    return (f"{what} switches the primary engine, and engines run beside it ({names}): their names, "
            f"ports and load are not part of it; stop them first ({stops})")


class Choices:
    def __init__(self, driver: Driver, store: Store, preflight: Preflight, evals: EvalStore,
                 beside: Callable[[], list[str]] = list) -> None:
        """`beside`: the model names of the engines running beside the primary (the engine set's)."""
        self.driver, self.store, self.preflight, self.evals = driver, store, preflight, evals
        self.beside = beside
        self.records = ChoiceStore(store.path)
        self.chooser = Chooser(self.records, metrics=driver.metrics)

    def seam_for(self, b: ChoiceBody) -> DriverSeam:
        params = BenchParams(output_tokens=FAST_OUTPUT_TOKENS if b.fast else None,
                             requests_per_tier=b.requests_per_tier, concurrency=b.concurrency)
        options = CompareOptions(thresholds=Thresholds(max_rounds=b.max_rounds), accuracy=b.accuracy,
                                 accuracy_items=1 if b.fast else b.accuracy_items)
        return DriverSeam(driver_control(self.driver, self.store, self.preflight), self.preflight, self.evals,
                          params, options, b.ready_timeout_s, b.sla)

    def resume(self) -> None:
        """After a controller restart: the choice that was running continues (its settings as asked)."""
        record = self.records.running()
        if record is not None:
            self.chooser.resume(self.seam_for(ChoiceBody.model_validate(record.settings, strict=False)))

    def running(self) -> bool:
        return self.chooser.task is not None and not self.chooser.task.done()

    async def prepare(self, body: ChoiceBody) -> Prepared:
        """The survey, the sweep's variants and the arms' costs (ChoiceInputError: bad input)."""
        budget_s = parse_duration(body.budget) if body.budget else None
        grid = check_sweep(body.sweep) if body.sweep is not None else {}
        if grid and self.preflight.generated_dir is None:
            raise ChoiceInputError("this controller has no directory for generated recipes: no sweep")
        platform, entries = await asyncio.to_thread(survey, self.preflight, body.platform)
        variants: list[Entry] = []
        texts: dict[str, str] = {}
        if grid:
            variants, texts = await asyncio.to_thread(
                survey_variants, self.preflight, entries, body.recipes, grid)
        arm_costs = await asyncio.to_thread(costs, self.store, self.evals, entries + variants)
        serving = self.driver.status()
        before = str(serving.get("recipe")) if serving.get("state") == "ready" else None
        extra = {"settings": body.model_dump(mode="json"), "versions": _versions(self.store, serving)}
        return Prepared(body, platform, entries, variants, texts, arm_costs, budget_s, grid, before, extra)

    async def plan(self, body: ChoiceBody) -> ChoiceRecord:
        """The plan and its ETA, nothing claimed or switched (ChoiceInputError: bad input)."""
        p = await self.prepare(body)
        shown = plan(choice_id="plan", platform=p.platform, entries=p.entries, pattern=body.recipes,
                     baseline=body.baseline, costs=p.costs, budget_s=p.budget_s,
                     started_at=self.chooser.clock(), serving_before=p.serving_before, promote=body.promote,
                     fast=body.fast, variants=p.variants, sweep=p.grid)
        return shown.model_copy(update=p.extra)

    async def start(self, body: ChoiceBody) -> ChoiceRecord:
        """Claim and run a choice in the background (ChoiceInputError; ChoiceBusy: one is running;
        BesideRefused: engines run beside the primary)."""
        why = beside_refusal(self.beside(), "a choice")
        if why is not None:
            raise BesideRefused(why)
        p = await self.prepare(body)
        record = self.chooser.begin(
            p.entries, platform=p.platform, pattern=body.recipes, baseline=body.baseline, costs=p.costs,
            budget_s=p.budget_s, serving_before=p.serving_before, promote=body.promote, fast=body.fast,
            extra=p.extra, variants=p.variants, sweep=p.grid)
        if p.texts and self.preflight.generated_dir is not None:
            # Claimed: the variants become recipes the supervisor applies by name (their texts are the
            # ones just admitted, so their spec hashes match the plan's).
            await asyncio.to_thread(write_variants, self.preflight.generated_dir, p.texts)
        self.chooser.start(record, self.seam_for(body))
        return record

    async def promote(self, choice_id: str, via: str) -> ChoiceRecord:
        """Apply an ended choice's champion through the ordinary apply (blue/green where it fits, else
        the hold) and record it on the choice; PromoteRefused with the reason, LookupError: no such."""
        record = await asyncio.to_thread(self.records.get, choice_id)
        if record is None:
            raise LookupError(choice_id)
        why = promotion_refusal(record) or beside_refusal(self.beside(), "promoting a champion")
        if why is not None:
            raise PromoteRefused(why)
        rejected = self.driver.submit(Apply(record.champion, False))
        if rejected is not None:
            raise PromoteRefused(f"the controller refused the apply: {rejected.reason}", busy=True)
        record = promotion_recorded(record, self.chooser.clock(), via)
        await asyncio.to_thread(self.records.save, record)
        return record


def _versions(store: Store, serving: dict[str, Any]) -> dict[str, str]:
    """The serving launch's interpreter and package versions (what the choice ran on)."""
    launch_id = (serving.get("launch") or {}).get("id")
    record = store.get_launch(str(launch_id)) if launch_id else None
    if record is None:
        return {}
    return {**record.packages, **({"interpreter": record.interpreter} if record.interpreter else {})}
