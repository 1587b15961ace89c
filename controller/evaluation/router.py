"""Admin API routes for benchmarks, comparisons and fingerprints (included by controller/api/app.py).

    GET  /benchmarks[?recipe=&limit=]     stored bench results (newest first)
    GET  /benchmarks/{id}                 one result with every request
    GET  /comparisons, /fingerprints      stored verdicts and fingerprints
    POST /compare                         {"baseline", "candidate", ...}: 202, runs in the controller
    GET  /compare/{id}                    state, verdict, reasons
    GET  /compare/{id}/events             progress as server-sent events, until the verdict
    POST /choices                         {"recipes", "baseline", "budget", "sweep", ...}: plan (dry_run)
                                          or run the tournament (controller/evaluation/choose.py); 202
    GET  /choices, /choices/{id}          decision records (?format=markdown: the table)
    GET  /choices/{id}/events?after=N     the choice's progress so far (polled by `appliance choose`)

`POST /compare` and `POST /choices` switch recipes, so they carry the API's admin dependency (handed in
by create_app: the same guard as every other mutating route). One compare or choice at a time: a
second gets 409. The compare drives the supervisor in-process (controller/evaluation/controls.py).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Request, status
from fastapi.responses import PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from appliance.evaluation.accuracy import ITEMS_PER_KIND, MAX_DROP_POINTS
from appliance.evaluation.bench_result import BenchResult
from appliance.evaluation.bench_tiers import FIRST_N, FULL_REQUESTS, NoTierFits
from appliance.evaluation.protocol import Thresholds
from appliance.evaluation.tournament import (
    ChoiceInputError,
    ChoiceRecord,
    markdown,
)
from controller.evaluation.bench import BenchParams
from controller.evaluation.choices import BesideRefused, ChoiceBody, Choices, PromoteRefused, beside_refusal
from controller.evaluation.choose import ChoiceBusy
from controller.evaluation.client import ClientError, EngineNotReady
from controller.evaluation.compare import CompareError, CompareOptions, compare
from controller.evaluation.controls import driver_control
from controller.evaluation.store import EvalStore
from controller.store import Store
from controller.supervisor.driver import Driver
from controller.supervisor.preflight import Preflight

SSE_HEARTBEAT_S = 15.0
_NAME = r"^[a-z0-9][a-z0-9._-]*$"


class CompareBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # as sent, never coerced (api/keys.py)

    baseline: str = Field(min_length=1, max_length=200, pattern=_NAME)
    candidate: str = Field(min_length=1, max_length=200, pattern=_NAME)
    requests_per_tier: int = Field(default=FIRST_N, ge=FIRST_N, le=1000)
    concurrency: int = Field(default=5, ge=1, le=256)
    # None: each tier's declared max output ; a number is the fast mode's cap.
    output_tokens: int | None = Field(default=None, ge=1, le=32768)
    full: bool = False  # the full run: 100 prompts per tier, three rounds (seed 003 §1120)
    ignore_eos: bool = False  # natural stops by default (DOMAIN §7: the gate checks the lengths)
    single_stream: bool = True
    warmup: int = Field(default=1, ge=0, le=100)
    smoke: bool = True
    accuracy: bool = True
    accuracy_items: int = Field(default=ITEMS_PER_KIND, ge=1, le=200)
    accuracy_drop: float = Field(default=MAX_DROP_POINTS, ge=0, le=100)
    length_tolerance: float = Field(default=0.02, ge=0, le=1)
    allow_diff: list[Literal["max_num_seqs", "max_num_batched_tokens", "sampling", "output_limits"]] = Field(
        default_factory=list
    )
    max_rounds: int = Field(default=3, ge=1, le=10)
    rounds: int = Field(default=1, ge=1, le=10)
    warm: bool = True
    ready_timeout_s: float = Field(default=3600, gt=0, le=4 * 3600)


@dataclass
class CompareJob:
    id: str
    body: CompareBody
    started_at: float = field(default_factory=time.time)
    state: str = "running"  # running / done / failed
    events: list[dict[str, Any]] = field(default_factory=list)
    result: dict[str, Any] | None = None
    error: str | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None

    def publish(self, event: dict[str, Any]) -> None:
        self.events.append({"at": time.time(), **event})
        self.changed.set()

    def view(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state,
            "baseline": self.body.baseline,
            "candidate": self.body.candidate,
            "started_at": self.started_at,
            "events": len(self.events),
            "result": self.result,
            "error": self.error,
        }


def evaluation_router(
    driver: Driver,
    store: Store,
    preflight: Preflight,
    require_admin: Callable[..., Any],
    evals: EvalStore | None = None,
    on_start: list[Callable[[], Any]] | None = None,
    choices: Choices | None = None,
) -> APIRouter:
    """`choices`: the one `Choices` create_app shares with the console (a new one when alone).
    `on_start`: where the router puts what the service runs once its loop runs (resuming a choice
    that a controller restart cut off)."""
    # create_app hands in the one EvalStore it shares with the console's Benchmarks pages
    evals = evals or EvalStore(store.path)
    driver.metrics.set_evaluation_source(evals.latest_by_recipe)
    router = APIRouter(tags=["evaluation"])
    jobs: dict[str, CompareJob] = {}
    choices = choices or Choices(driver, store, preflight, evals)
    chooser = choices.chooser

    if on_start is not None:
        on_start.append(choices.resume)

    @router.get("/benchmarks")
    async def benchmarks(
        limit: Annotated[int, Query(ge=1, le=1000)] = 50, recipe: str | None = None
    ) -> list[dict[str, Any]]:
        return await asyncio.to_thread(evals.benchmarks, limit, recipe)

    @router.get("/benchmarks/{bench_id}", response_model=BenchResult)
    async def benchmark(bench_id: str) -> BenchResult:
        found = await asyncio.to_thread(evals.benchmark, bench_id)
        if found is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no benchmark {bench_id!r}")
        return found

    @router.get("/comparisons")
    async def comparisons(limit: Annotated[int, Query(ge=1, le=1000)] = 50) -> list[dict[str, Any]]:
        return await asyncio.to_thread(evals.comparisons, limit)

    @router.get("/fingerprints")
    async def fingerprints(
        limit: Annotated[int, Query(ge=1, le=1000)] = 50, recipe: str | None = None
    ) -> list[dict[str, Any]]:
        return await asyncio.to_thread(evals.fingerprints, limit, recipe)

    async def run(job: CompareJob) -> None:
        b = job.body
        params = BenchParams(
            output_tokens=b.output_tokens,
            requests_per_tier=max(b.requests_per_tier, FULL_REQUESTS) if b.full else b.requests_per_tier,
            concurrency=b.concurrency,
            ignore_eos=b.ignore_eos,
            single_stream=b.single_stream,
            warmup=b.warmup,
        )
        options = CompareOptions(
            thresholds=Thresholds(
                max_rounds=b.max_rounds, accuracy_drop=b.accuracy_drop, length_tolerance=b.length_tolerance
            ),
            smoke=b.smoke,
            accuracy=b.accuracy,
            accuracy_items=b.accuracy_items,
            allow_diff=frozenset(b.allow_diff),
        )
        try:
            outcome = await compare(
                driver_control(driver, store, preflight),
                b.baseline,
                b.candidate,
                params,
                evals,
                rounds=b.rounds,
                warm=b.warm,
                ready_timeout_s=b.ready_timeout_s,
                progress=job.publish,
                options=options,
            )
        except (CompareError, EngineNotReady, NoTierFits, ClientError) as exc:
            job.error, job.state = f"{type(exc).__name__}: {exc} (nothing stored)", "failed"
            job.publish({"phase": "failed", "error": job.error})
            return
        except Exception as exc:  # an unexpected bug must still end the job visibly, not hang its stream
            job.error, job.state = f"{type(exc).__name__}: {exc} (nothing stored)", "failed"
            job.publish({"phase": "failed", "error": job.error})
            raise
        job.result = {
            "comparison_id": outcome.id,
            "gate": outcome.gate.model_dump(mode="json"),
            "baselines": [r.summary() for r in outcome.baselines],
            "candidates": [r.summary() for r in outcome.candidates],
        }
        job.state = "done"
        job.publish({"phase": "done", "verdict": outcome.gate.verdict.value})

    @router.post(
        "/compare",
        status_code=status.HTTP_202_ACCEPTED,
        dependencies=[Depends(require_admin)],
        responses={409: {}, 422: {}},
    )
    async def start_compare(body: CompareBody) -> dict[str, Any]:
        if body.baseline == body.candidate:
            raise HTTPException(422, "baseline and candidate are the same recipe")
        if any(j.state == "running" for j in jobs.values()):
            raise HTTPException(status.HTTP_409_CONFLICT, "a compare is already running")
        if chooser.task is not None and not chooser.task.done():
            raise HTTPException(status.HTTP_409_CONFLICT, "a choice is running (its gates switch recipes)")
        why = beside_refusal(choices.beside(), "a compare")
        if why is not None:
            raise HTTPException(status.HTTP_409_CONFLICT, why)
        job = CompareJob(id=f"cmpjob-{uuid.uuid4().hex[:12]}", body=body)
        jobs[job.id] = job
        job.task = asyncio.get_running_loop().create_task(run(job), name=f"compare {job.id}")
        return job.view()

    def _job(job_id: str) -> CompareJob:
        job = jobs.get(job_id)
        if job is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no compare {job_id!r}")
        return job

    @router.get("/compare/{job_id}")
    async def compare_status(job_id: str) -> dict[str, Any]:
        return _job(job_id).view()

    @router.get("/compare/{job_id}/events", response_class=StreamingResponse)
    async def compare_events(request: Request, job_id: str) -> StreamingResponse:
        job = _job(job_id)

        async def stream() -> AsyncIterator[bytes]:
            sent = 0
            while True:
                job.changed.clear()  # before flushing: an event published during a yield wakes the wait
                while sent < len(job.events):
                    data = json.dumps(job.events[sent], default=str)
                    yield f"id: {sent}\nevent: progress\ndata: {data}\n\n".encode()
                    sent += 1
                if job.state != "running":
                    yield f"event: end\ndata: {json.dumps(job.view(), default=str)}\n\n".encode()
                    return
                if await request.is_disconnected():
                    return
                try:
                    await asyncio.wait_for(job.changed.wait(), timeout=SSE_HEARTBEAT_S)
                except TimeoutError:
                    yield b": keep-alive\n\n"

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @router.post(
        "/choices",
        status_code=status.HTTP_202_ACCEPTED,
        dependencies=[Depends(require_admin)],
        responses={409: {}, 422: {}},
    )
    async def start_choice(body: ChoiceBody) -> dict[str, Any]:
        if any(j.state == "running" for j in jobs.values()):
            raise HTTPException(status.HTTP_409_CONFLICT, "a compare is running")
        try:
            if body.dry_run:
                shown = await choices.plan(body)
                return {**shown.model_dump(mode="json"), "state": "plan"}
            record = await choices.start(body)
        except ChoiceInputError as exc:
            raise HTTPException(422, str(exc)) from exc
        except ChoiceBusy as exc:
            raise HTTPException(status.HTTP_409_CONFLICT, f"choice {exc} is already running") from exc
        except BesideRefused as exc:
            raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from exc
        return record.model_dump(mode="json")

    @router.post("/choices/{choice_id}/promote", dependencies=[Depends(require_admin)],
                 responses={404: {}, 409: {}})
    async def promote_choice(choice_id: str) -> dict[str, Any]:
        """Apply an ended choice's champion (never one whose gate was ACCEPT-PENDING-FULL) and record it."""
        try:
            record = await choices.promote(choice_id, "the API")
        except LookupError as exc:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no choice {choice_id!r}") from exc
        except PromoteRefused as exc:
            raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from exc
        return record.model_dump(mode="json")

    @router.get("/choices")
    async def list_choices(limit: Annotated[int, Query(ge=1, le=1000)] = 50) -> list[dict[str, Any]]:
        records = await asyncio.to_thread(choices.records.list, limit)
        return [_summary(r) for r in records]

    async def _choice(choice_id: str) -> ChoiceRecord:
        record = await asyncio.to_thread(choices.records.get, choice_id)
        if record is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no choice {choice_id!r}")
        return record

    @router.get("/choices/{choice_id}", response_model=None)
    async def get_choice(
        choice_id: str, format: Literal["json", "markdown"] = "json"
    ) -> dict[str, Any] | PlainTextResponse:
        record = await _choice(choice_id)
        if format == "markdown":
            return PlainTextResponse(markdown(record), media_type="text/markdown; charset=utf-8")
        return record.model_dump(mode="json")

    @router.get("/choices/{choice_id}/events")
    async def choice_events(
        choice_id: str, after: Annotated[int, Query(ge=0)] = 0
    ) -> dict[str, Any]:
        record = await _choice(choice_id)
        events = chooser.events.get(choice_id, [])
        return {"state": record.state, "events": events[after:], "next": len(events)}

    return router


def _summary(r: ChoiceRecord) -> dict[str, Any]:
    return {"id": r.id, "state": r.state, "platform": r.platform, "pattern": r.pattern,
            "baseline": r.baseline, "champion": r.champion, "started_at": r.started_at,
            "ended_at": r.ended_at, "fast": r.fast,
            "tried": sum(x.status in ("won", "lost", "failed-start", "error", "stale") for x in r.lines)}
