"""The benchmarks pages, read-only (`appliance bench | compare` write them): stored comparisons and
benches, one comparison per tier and gate step, one bench's tiers."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import Response

from controller.console.routes.pages import Pages


def register(router: APIRouter, pages: Pages) -> None:
    page, problem, current, bench = pages.page, pages.problem, pages.current, pages.bench

    @router.get("/benchmarks")
    async def benchmarks(request: Request) -> Response:
        session = current(request)
        view = await asyncio.to_thread(bench.index_view)
        return page(request, "benchmarks.html", session, view=view)

    @router.get("/comparisons/{comparison_id}")
    async def comparison(request: Request, comparison_id: str) -> Response:
        session = current(request)
        try:
            view = await asyncio.to_thread(bench.comparison_view, comparison_id)
        except ValueError as exc:  # pydantic's ValidationError: a row this version cannot read
            return problem(request, session, 500, "Comparison unreadable",
                           f"Comparison {comparison_id!r} is stored but does not load: {exc}",
                           "/console/benchmarks")
        if view is None:
            return problem(request, session, 404, "Unknown comparison", f"No comparison {comparison_id!r}.",
                           "/console/benchmarks")
        return page(request, "comparison.html", session, cmp=view)

    @router.get("/benchmarks/{bench_id}")
    async def benchmark(request: Request, bench_id: str) -> Response:
        session = current(request)
        try:
            view = await asyncio.to_thread(bench.bench_view, bench_id)
        except ValueError as exc:  # pydantic's ValidationError: a row this version cannot read
            return problem(request, session, 500, "Benchmark unreadable",
                           f"Benchmark {bench_id!r} is stored but does not load: {exc}",
                           "/console/benchmarks")
        if view is None:
            return problem(request, session, 404, "Unknown benchmark", f"No benchmark {bench_id!r}.",
                           "/console/benchmarks")
        return page(request, "benchmark.html", session, bench=view)
