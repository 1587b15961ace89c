"""The host memory page: memory over time (controller/watch/history.py) and the GPU cards' health."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import Response

from controller.console.gpu_views import gpu_health_view
from controller.console.routes.pages import Pages


def register(router: APIRouter, pages: Pages) -> None:
    page, current, data, preflight = pages.page, pages.current, pages.data, pages.ctx.preflight

    @router.get("/memory")
    async def memory(request: Request, minutes: int = 60) -> Response:
        session = current(request)
        minutes = max(5, min(minutes, 6 * 60))
        view = await asyncio.to_thread(data.memory_view, minutes * 60.0)
        return page(request, "memory.html", session, memory=view, minutes=minutes,
                    gpu=gpu_health_view(preflight.gpu))
