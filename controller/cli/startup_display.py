"""The CLI's start-up display, fed by the controller API's event stream (the JSON calls and their
client are controller/api_client.py, shared with the evaluation's controls).

An engine start takes 90 s here and up to 30 minutes on the reference host; the display says
where it is (phase, fraction of the ready budget used) on every phase change and at least every
~15 s (the stream's keep-alive), and ends on ready or failed with the diagnosis.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from controller.api_client import ApiError

# --------------------------------------------------------------------------------------------
# The start-up display


def _bar(fraction: float | None, width: int = 20) -> str:
    if fraction is None:
        return " " * (width + 2)
    filled = max(0, min(width, round(fraction * width)))
    return "[" + "#" * filled + "." * (width - filled) + "]"


def _s(v: float) -> str:
    return f"{round(v)} s"


def eta_phase_line(p: dict[str, Any]) -> str:
    """A phase of the status `eta` against its history: ``[>] torch.compile  13 s so far (usually 18 s)``."""
    mark = {"done": "x", "current": ">"}.get(str(p.get("status")), " ")
    took = p.get("took_s")
    took_text = "" if took is None else _s(took) + (" so far" if p.get("status") == "current" else "")
    usual = p.get("usual_s")
    usual_text = f"(usually {_s(usual)})" if usual is not None else ""
    return f"  [{mark}] {p.get('label'):<20} {took_text:>11}  {usual_text}".rstrip()


def eta_note(status: dict[str, Any] | None) -> str:
    """The ETA and any likely-stall flag for a progress line, `` · expected ready in ~18 s (…)``."""
    eta = (status or {}).get("eta") or {}
    text = f" · {eta['text']}" if eta.get("text") else ""
    stall = eta.get("stall") or {}
    return text + (f" · {str(stall['text']).upper()}" if stall.get("text") else "")


def usual_of(status: dict[str, Any] | None, phase: object) -> str:
    """`` (usually ~18 s)`` for a phase the status ETA has a history for, else ``""``."""
    for p in ((status or {}).get("eta") or {}).get("phases") or []:
        if p.get("phase") == phase and p.get("usual_s") is not None:
            return f" (usually ~{_s(p['usual_s'])})"
    return ""


@dataclass
class StartView:
    """Turns the event stream into lines; `outcome` is set on ready / failed / idle."""

    echo: Callable[[str], None]
    started: float = field(default_factory=time.monotonic)
    outcome: str | None = None
    seen_busy: bool = False  # a start was under way at some point (so "idle" means it was stopped)
    last_line: float = 0.0
    last_phase: str | None = None

    def _say(self, text: str, status: dict[str, Any] | None = None) -> None:
        elapsed = time.monotonic() - self.started
        launch = (status or {}).get("launch") or {}
        progress = (status or {}).get("progress")
        budget = launch.get("ready_budget_s")
        share = f"{progress * 100:3.0f}% of {budget} s" if progress is not None and budget else ""
        self.echo(f"[{elapsed:6.1f}s] {_bar(progress)} {share:>14}  {text}")
        self.last_line = time.monotonic()

    def status(self, s: dict[str, Any], heartbeat: bool = False) -> None:
        state = s.get("state")
        launch = s.get("launch") or {}
        if heartbeat:
            if state in ("starting", "preflight", "draining", "stopping"):
                where = launch.get("describe") or "waiting for the first phase"
                self._say(f"{state}: {where}{eta_note(s)}", s)
            elif state == "exited":
                self._say("exited: the engine ended; classifying the exit", s)
            elif state == "backoff":
                retry = s.get("backoff_remaining_s")
                self._say(f"backoff: retry in {retry} s (failure {s.get('failures')})", s)
            return
        self._say(f"controller state {state}" + (f", recipe {s.get('recipe')}" if s.get("recipe") else ""), s)
        self._check_end(s)

    def _check_end(self, s: dict[str, Any]) -> None:
        state = s.get("state")
        if state in ("preflight", "starting", "draining", "stopping", "backoff", "exited"):
            self.seen_busy = True
        if state == "ready":
            self.outcome = "ready"
        elif state == "failed":
            self.outcome = "failed"
        elif state == "idle" and self.seen_busy:
            self.outcome = "idle"

    def event(self, kind: str, data: dict[str, Any], status: dict[str, Any] | None) -> None:
        if kind == "state":
            self._say(f"→ {data.get('state')}", status)
            self._check_end({"state": data.get("state")})
        elif kind == "phase":
            label = str(data.get("label"))
            if label != self.last_phase:  # two markers of one phase (e.g. both API server lines)
                self.last_phase = label
                detail = f"  ({data['detail']})" if data.get("detail") else ""
                self._say(f"{label}{usual_of(status, data.get('phase'))}{detail}", status)
        elif kind == "event" and data.get("kind") not in ("phase",):
            self._say(f"{data.get('kind')}: {data.get('message')}", status)


async def follow_start(base: str, view: StartView, fetch_status: Callable[[], dict[str, Any]],
                       timeout_s: float | None = None) -> str | None:
    """Follow `/events` until the view has an outcome (or the timeout). Returns the outcome."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    client_timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=60)
    async with aiohttp.ClientSession(timeout=client_timeout) as session, \
            session.get(base + "/events") as resp:
        if resp.status != 200:
            raise ApiError(resp.status, await resp.text())
        kind = "event"
        async for raw in resp.content:
            line = raw.decode(errors="replace").rstrip("\n")
            if line.startswith(":"):
                view.status(await asyncio.to_thread(fetch_status), heartbeat=True)
            elif line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                if kind == "status":
                    view.status(data)
                else:
                    status = await asyncio.to_thread(fetch_status) if kind in ("phase", "state") else None
                    view.event(kind, data, status)
            if view.outcome is not None:
                return view.outcome
            if deadline is not None and time.monotonic() > deadline:
                return None
    return view.outcome
