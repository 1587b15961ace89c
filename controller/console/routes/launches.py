"""The launches pages: the history, one launch (phase waterfall, memory picture, its benches), and its
engine log (the tail, redacted) with the text endpoint the log page's follow mode polls."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request, status
from fastapi.responses import Response, StreamingResponse

from appliance.observe.log_filter import ACCESS_LINE, is_access_line
from controller.api_context import LogUnavailable, read_launch_log
from controller.console.auth import COOKIE
from controller.console.routes.pages import Pages, secure

LOG_TAIL_CHARS = 64 * 1024  # the log page shows this much of the end of the log
LOG_MAX_CHUNKS = 64  # reading to the end takes at most this many runtime reads (4 MiB each for files)


def register(router: APIRouter, pages: Pages) -> None:
    page, problem, current = pages.page, pages.problem, pages.current
    sessions, data, bench = pages.sessions, pages.data, pages.bench
    ctx = pages.ctx
    driver = ctx.driver

    @router.get("/launches")
    async def launches(request: Request) -> Response:
        session = current(request)
        rows = await asyncio.to_thread(data.launch_rows)
        return page(request, "launches.html", session, rows=rows)

    @router.get("/launches/{launch_id}")
    async def launch(request: Request, launch_id: str) -> Response:
        session = current(request)
        view = await asyncio.to_thread(data.launch_view, launch_id)
        if view is None:
            return problem(request, session, 404, "Unknown launch", f"No launch {launch_id!r}.",
                           "/console/launches")
        benches = await asyncio.to_thread(bench.for_launch, launch_id)
        return page(request, "launch.html", session, launch=view, benches=benches)

    def log_tail(launch_id: str) -> tuple[str, int, bool]:
        """The end of the launch's log (the API's data path, keys redacted), its end offset, and
        whether the start was cut off (longer than LOG_TAIL_CHARS, or than LOG_MAX_CHUNKS reads)."""
        tail, offset, cut = "", 0, False
        for _ in range(LOG_MAX_CHUNKS):
            text, next_offset = read_launch_log(ctx, launch_id, offset)
            if next_offset == offset or not text:
                break
            tail += text
            if len(tail) > LOG_TAIL_CHARS:
                tail, cut = tail[-LOG_TAIL_CHARS:], True
            offset = next_offset
        else:
            cut = True
        return tail, offset, cut

    @router.get("/launches/{launch_id}/log")
    async def launch_log(request: Request, launch_id: str, access: bool = False) -> Response:
        """The log's tail; HTTP access lines (Prometheus' scrapes, probes) hidden unless `access`."""
        session = current(request)
        record = await asyncio.to_thread(ctx.store.get_launch, launch_id)
        if record is None:
            return problem(request, session, 404, "Unknown launch", f"No launch {launch_id!r}.",
                           "/console/launches")
        try:
            text, offset, cut = await asyncio.to_thread(log_tail, launch_id)
        except LogUnavailable as exc:
            return page(request, "log.html", session, exc.code, r=record, text="", offset=0, cut=False,
                        error=f"The engine log cannot be read: {exc}",
                        stored_tail=record.log_tail, live=False)
        live = driver.view.is_current(launch_id)
        hidden = 0
        if not access:
            lines = text.split("\n")
            kept = [x for x in lines if not is_access_line(x)]
            hidden, text = len(lines) - len(kept), "\n".join(kept)
        return page(request, "log.html", session, r=record, text=text, offset=offset, cut=cut,
                    stored_tail=record.log_tail if not text else None, live=live, access=access,
                    hidden=hidden, access_pattern=ACCESS_LINE.pattern)

    @router.get("/launches/{launch_id}/log/download")
    async def launch_log_download(request: Request, launch_id: str) -> Response:
        """The whole log as a file (redacted as everywhere, every line kept), read chunk by chunk."""
        session, _ = sessions.lookup(request.cookies.get(COOKIE))
        if session is None:
            return secure(Response("log in first", status.HTTP_401_UNAUTHORIZED, media_type="text/plain"))
        try:  # the first chunk here, so an unknown launch is a 404 and not a broken download
            first, offset = await asyncio.to_thread(read_launch_log, ctx, launch_id, 0)
        except LogUnavailable as exc:
            return secure(Response(str(exc), exc.code, media_type="text/plain"))

        async def chunks() -> AsyncIterator[bytes]:
            text, at = first, offset
            while text:
                yield text.encode()
                text, next_at = await asyncio.to_thread(read_launch_log, ctx, launch_id, at)
                if next_at == at:
                    break
                at = next_at

        name = re.sub(r"[^A-Za-z0-9._-]", "_", launch_id)
        disposition = f'attachment; filename="{name}.log"'
        return secure(StreamingResponse(chunks(), media_type="text/plain; charset=utf-8",
                                        headers={"Content-Disposition": disposition}))

    @router.get("/launches/{launch_id}/log.txt")
    async def launch_log_text(request: Request, launch_id: str, offset: int = 0) -> Response:
        """What the log page's follow mode polls: text from `offset`, `X-Next-Offset` where to go on."""
        session, _ = sessions.lookup(request.cookies.get(COOKIE))
        if session is None:
            return secure(Response("log in first", status.HTTP_401_UNAUTHORIZED, media_type="text/plain"))
        try:
            text, next_offset = await asyncio.to_thread(read_launch_log, ctx, launch_id, max(0, offset))
        except LogUnavailable as exc:
            return secure(Response(str(exc), exc.code, media_type="text/plain"))
        return secure(Response(text, media_type="text/plain; charset=utf-8",
                               headers={"X-Next-Offset": str(next_offset)}))
