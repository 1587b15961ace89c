"""`appliance choose` / `POST /choices`: every recipe of this host's platform → lint → admission → the
gate as a tournament (appliance/evaluation/tournament.py holds the rules) → a decision record.

The runner is effectful; what it drives is one declared seam, `ChoiceSeam` (the gate of one pair,
a recipe's spec hash now, what is serving, a switch): the API's `driver_seam` runs the real compare
(controller/evaluation/compare.py) through the supervisor in-process; tests hand in a fake that
returns verdicts. The record is saved in the launch store's file after every step (choice_store.py),
so a controller restart mid-choice resumes from the next planned candidate (`Chooser.resume`).
At the end the host returns to the recipe that was serving before, unless told to promote the
champion (through the ordinary apply: blue/green where it fits, else the hold); a champion whose
gate said ACCEPT-PENDING-FULL is not promoted without the full run.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from appliance.evaluation.gate import Verdict
from appliance.evaluation.tournament import (
    ArmCost,
    ChoiceInputError,
    ChoiceRecord,
    Entry,
    allow_diff_for,
    champion_for,
    champion_over_sla,
    ended,
    judged,
    margin_of,
    next_candidate,
    over_budget,
    plan,
    promotion_recorded,
    resumed,
    skipped,
    stop_at_budget,
)
from controller.evaluation.choice_store import ChoiceStore

log = logging.getLogger(__name__)
Progress = Callable[[dict[str, Any]], None]


def _quiet(event: dict[str, Any]) -> None:
    del event


class ChoiceBusy(RuntimeError):
    """Another choice is running (its id is the message)."""


class ArmFailed(RuntimeError):
    """An arm of a gate failed its start (the diagnosis is the message): it is skipped, not retried."""

    def __init__(self, recipe: str, diagnosis: str) -> None:
        super().__init__(diagnosis)
        self.recipe = recipe


class GateError(RuntimeError):
    """A gate could not produce a verdict for another reason (nothing stored): the candidate is skipped."""


@dataclass(frozen=True)
class GateOutcome:
    verdict: str
    comparison_id: str | None
    reasons: list[str] = field(default_factory=list)
    # With an operator's bound (--sla): each arm's recipe → its breaches in this gate ([]: held).
    sla: dict[str, list[str]] | None = None


class ChoiceSeam(Protocol):
    """What a choice drives (the declared seam; tests replace exactly this)."""

    async def gate(
        self, champion: str, candidate: str, progress: Progress, allow_diff: frozenset[str] = frozenset()
    ) -> GateOutcome:
        """The whole gate of `candidate` against `champion` (raises ArmFailed or GateError);
        `allow_diff`: the forbidden differences this gate allows (a sweep's swept fields)."""
        ...

    async def spec_hash(self, recipe: str) -> str | None:
        """The recipe's spec hash as it renders now (None: it no longer renders or is gone)."""
        ...

    async def serving(self) -> str | None:
        """The recipe serving now (None: nothing ready)."""
        ...

    async def switch_to(self, recipe: str) -> None:
        """Apply `recipe` and wait until it is ready (raises GateError when it is not)."""
        ...


class ChoiceMetrics(Protocol):
    def record_choice_candidate(self, outcome: str) -> None: ...

    def choice_started(self) -> None: ...

    def choice_ended(self, outcome: str, seconds: float | None) -> None: ...


@dataclass
class Chooser:
    store: ChoiceStore
    seam: ChoiceSeam | None = None  # set by each start: the gate's settings are the choice's own
    metrics: ChoiceMetrics | None = None
    clock: Callable[[], float] = time.time
    task: asyncio.Task[ChoiceRecord] | None = None
    events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def begin(
        self,
        entries: list[Entry],
        *,
        platform: str,
        pattern: str,
        baseline: str | None,
        costs: dict[str, ArmCost],
        budget_s: float | None,
        serving_before: str | None,
        promote: bool = False,
        fast: bool = False,
        extra: dict[str, Any] | None = None,
        variants: list[Entry] | None = None,
        sweep: dict[str, list[int]] | None = None,
    ) -> ChoiceRecord:
        """Plan and claim a choice (ChoiceInputError: bad input; ChoiceBusy: one is running)."""
        running = self.store.running()
        if running is not None:
            raise ChoiceBusy(running.id)
        try:
            record = plan(
                choice_id=f"choice-{uuid.uuid4().hex[:12]}", platform=platform, entries=entries,
                pattern=pattern, baseline=baseline, costs=costs, budget_s=budget_s,
                started_at=self.clock(), serving_before=serving_before, promote=promote, fast=fast,
                variants=variants or [], sweep=sweep,
            )
        except ChoiceInputError:
            if self.metrics is not None and not any(e.admitted for e in entries):
                self.metrics.choice_ended("none-admitted", None)  # the alert's signal
            raise
        if extra:
            record = record.model_copy(update=extra)
        other = self.store.claim(record)
        if other is not None:
            raise ChoiceBusy(other)
        if self.metrics is not None:
            self.metrics.choice_started()
        return record

    def start(self, record: ChoiceRecord, seam: ChoiceSeam | None = None) -> asyncio.Task[ChoiceRecord]:
        """Run a claimed record in the background (the API's POST /choices)."""
        if seam is not None:
            self.seam = seam
        self.task = asyncio.get_running_loop().create_task(self.run(record), name=f"choice {record.id}")
        return self.task

    def resume(self, seam: ChoiceSeam | None = None) -> asyncio.Task[ChoiceRecord] | None:
        """After a controller restart: the choice that was running continues from its next candidate."""
        record = self.store.running()
        if record is None:
            return None
        log.info("resuming choice %s after a restart", record.id)
        if self.metrics is not None:
            self.metrics.choice_started()
        return self.start(resumed(record), seam)

    def _publish(self, record: ChoiceRecord, event: dict[str, Any]) -> None:
        self.events.setdefault(record.id, []).append({"at": self.clock(), **event})

    async def run(self, record: ChoiceRecord) -> ChoiceRecord:
        """The tournament from the record's next planned candidate; the record is saved after every step."""
        def publish(event: dict[str, Any]) -> None:
            self._publish(record, event)

        # A cancel (the controller stopping) leaves the record as last saved, `running`: it resumes at
        # the next start. Nothing is saved here: `record` is the one handed in, older than the store's.
        record = await self._tournament(record, publish)
        record = await self._finish(record, publish)
        self.store.save(record)
        if self.metrics is not None:
            self.metrics.choice_ended(record.state, (record.ended_at or self.clock()) - record.started_at)
        publish({"phase": "end", "state": record.state, "champion": record.champion})
        return record

    @property
    def _seam(self) -> ChoiceSeam:
        if self.seam is None:
            raise RuntimeError("a choice runs with a seam: Chooser.start(record, seam)")
        return self.seam

    async def _tournament(self, record: ChoiceRecord, publish: Progress) -> ChoiceRecord:
        while (line := next_candidate(record)) is not None:
            elapsed = self.clock() - record.started_at
            stage = line.stage
            # The one budget decision: the time actually spent, not the plan's forecast (a fresh
            # host's default ETAs would have ruled out candidates an early fast gate leaves time for).
            if over_budget(record, elapsed, line.recipe, stage):
                return stop_at_budget(record, elapsed, self.clock())
            now_hash = await self._seam.spec_hash(line.recipe)
            if now_hash != line.spec_hash:
                why = (f"edited during the choice: spec hash {line.spec_hash} → {now_hash}; not run "
                       "(start a new choice to gate the new version)")
                record = skipped(record, line.recipe, "stale", why, stage=stage)
                self._count("stale")
                self.store.save(record)
                continue
            record = record.model_copy(deep=True)
            record.line(line.recipe, stage).status = "running"
            self.store.save(record)
            champion = champion_for(record, line)
            left = sum(x.eta_s or 0.0 for x in record.lines if x.status in ("planned", "running"))
            publish({"phase": "candidate", "stage": stage, "recipe": line.recipe, "champion": champion,
                     "eta_s": line.eta_s, "elapsed_s": elapsed, "left_s": left})
            t0 = self.clock()
            try:
                out = await self._seam.gate(champion, line.recipe, publish,
                                            allow_diff=allow_diff_for(record, line))
            except ArmFailed as exc:
                took = self.clock() - t0
                if exc.recipe != line.recipe:  # the champion itself did not start: nothing to gate against
                    record = skipped(record, line.recipe, "error",
                                     f"not gated: the champion {exc.recipe} failed to start: {exc}", took,
                                     stage)
                    self.store.save(record)
                    return ended(record, "failed", self.clock(),
                                 f"the champion {exc.recipe} failed to start: {exc}")
                record = skipped(record, line.recipe, "failed-start", f"failed to start: {exc}", took, stage)
                self._count("failed-start")
            except GateError as exc:
                record = skipped(record, line.recipe, "error", f"no verdict: {exc}", self.clock() - t0, stage)
                self._count("error")
            else:
                record = judged(record, line.recipe, out.verdict, out.comparison_id, out.reasons,
                                self.clock() - t0, stage, sla=out.sla)
                self._count(out.verdict)
            self.store.save(record)
            status = record.line(line.recipe, stage).status
            publish({"phase": "judged", "stage": stage, "recipe": line.recipe, "status": status,
                     "champion": champion_for(record, line)})
        why = f"every planned candidate was gated; champion {record.champion}"
        return ended(record, "done", self.clock(), why)

    async def _finish(self, record: ChoiceRecord, publish: Progress) -> ChoiceRecord:
        """Promote the champion when told (never one that needs the full run), else go back."""
        target = record.serving_before
        promoting = False
        update: dict[str, Any] = {}
        if record.promote and record.state in ("done", "stopped-budget"):
            over = champion_over_sla(record)
            if record.champion_verdict == Verdict.ACCEPT_PENDING_FULL.value:
                update["ended_why"] = (f"{record.ended_why}; not promoted: {record.champion}'s gate was "
                                       "ACCEPT-PENDING-FULL, promotion needs the full run (compare --full)")
            elif over:
                update["ended_why"] = (f"{record.ended_why}; not promoted: {record.champion} breaks the SLA "
                                       f"({'; '.join(over)})")
            else:
                target, promoting = record.champion, True
        if target is None:
            return record.model_copy(update=update)
        try:
            if await self._seam.serving() != target:
                publish({"phase": "switch-back" if target == record.serving_before else "promote",
                         "recipe": target})
                await self._seam.switch_to(target)
        except GateError as exc:
            why = f"{update.get('ended_why', record.ended_why)}; could not switch to {target}: {exc}"
            return record.model_copy(update={"ended_why": why})
        if promoting:
            return promotion_recorded(record.model_copy(update=update), self.clock(), "choose --promote")
        return record.model_copy(update={**update, "restored": target})

    def _count(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.record_choice_candidate(outcome)


def entry_of(recipe: str, mode: str | None, spec_hash: str | None, admission: Any | None,
             refusals: list[str]) -> Entry:
    """A survey line from a plan report's parts (controller/supervisor/preflight.py PlanReport)."""
    margin, numbers = margin_of(admission) if admission is not None else (None, {})
    return Entry(
        recipe=recipe, mode=mode, spec_hash=spec_hash, admitted=not refusals,
        admission=admission.verdict if admission is not None else None, margin_gib=margin,
        reason="; ".join(refusals) or None, numbers=numbers,
    )

