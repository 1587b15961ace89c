"""What the console pages show, gathered from the driver, store, preflight and host history.

Blocking helpers (SQLite, recipe files, host facts) are called from the routes in a worker thread.
Charts are SVG strings from controller/console/charts.py, marked safe for the templates.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from markupsafe import Markup

from appliance.observe.log_phases import PHASE_LABELS, Phase
from appliance.recipe.admission import admit
from appliance.recipe.lint import lint
from appliance.recipe.recipe_diff import RecipeDiff
from appliance.recipe.recipe_model import Recipe
from controller import admin_token
from controller.api_context import ApiContext
from controller.console import charts
from controller.gateway import control
from controller.gateway.hold.text import status_line
from controller.store import LaunchRecord, redact_spec
from controller.supervisor.driver import Driver
from controller.supervisor.gateway_link import NoGateway
from controller.supervisor.preflight import PlanReport, UnknownRecipe
from controller.watch.history import HostHistory, HostPoint, OomMark

log = logging.getLogger(__name__)

GIB = 2**30
GATEWAY_TIMEOUT_S = 2.0
MEMORY_PAD_S = 30.0  # the memory picture of a launch starts a little before it and ends after it
STALE_SAMPLE_S = 10.0  # the host watch samples once a second: an older latest sample is said to be old
TARGET_TTL_S = 30.0  # the Now page's stream asks for the recipe's target each second: read it this seldom


def known_reasons() -> set[str]:
    """The only texts the log-in page repeats from its query string (auth.py writes them)."""
    return {
        "your session expired — log in again",
        "your session is not valid here (the controller may have restarted) — log in again",
        "your session is not valid here — log in again",
        "your session ended (logged out, expired or the controller restarted) — log in again",
        "the admin token changed — log in with the new one",
    }


def safe_next(target: str) -> str:
    """Only a console path: an open redirect to another site is refused."""
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not parts.path.startswith("/console/") or "//" in parts.path:
        return "/console/"
    return parts.path


MAX_LIMIT = 1_000_000  # a per-key limit above this is a typo, not a limit


def optional_positive(text: str, what: str) -> int | None:
    text = text.strip()
    if not text:
        return None
    if not text.isdigit() or not 1 <= int(text) <= MAX_LIMIT:
        raise ValueError(f"{what} must be a whole number from 1 to {MAX_LIMIT:,} (or empty for no limit)")
    return int(text)


def key_name(text: str) -> str:
    name = text.strip()
    if not name or len(name) > 200:
        raise ValueError("a key needs a name of 1 to 200 characters")
    return name


def _gib(v: float | int | None) -> str:
    return "—" if v is None else f"{v / GIB:.2f} GiB"


def _secs(v: float | int | None) -> str:
    if v is None:
        return "—"
    v = float(v)
    return f"{v:.0f} s" if v < 120 else f"{int(v // 60)} min {int(v % 60):02d} s"


def _when(t: float | None) -> str:
    return "—" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _num(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.2f}"
    return "—" if v is None else str(v)


FILTERS: dict[str, Callable[..., str]] = {"gib": _gib, "secs": _secs, "when": _when, "num": _num}


def _pct(part: Any, whole: Any) -> float | None:
    if not isinstance(part, int | float) or not isinstance(whole, int | float) or whole <= 0:
        return None
    return round(min(100.0, 100.0 * part / whole), 1)


def eta_phases(eta: dict[str, Any]) -> list[dict[str, Any]]:
    """The status ETA's phases as the Now page lists them: ``torch.compile · 95 s, usually 18 s``."""
    out: list[dict[str, Any]] = []
    for p in eta.get("phases") or []:
        took, usual = p.get("took_s"), p.get("usual_s")
        bits = [_secs(took)] if took is not None else []
        if usual is not None:
            bits.append(f"usually {_secs(usual)}")
        label = str(p.get("label") or p.get("phase"))
        out.append({"label": label + (" · " + ", ".join(bits) if bits else ""),
                    "done": p.get("status") == "done", "current": p.get("status") == "current"})
    return out


def state_line(status: dict[str, Any]) -> dict[str, str]:
    """Every state label of the Now page from the one status object, so no two disagree: the
    progress line, the retry line (only a backoff has a next try), and this start's cache outcome."""
    state = str(status.get("state") or "idle")
    launch = status.get("launch") or {}
    progress = status.get("progress")
    failures = int(status.get("failures") or 0)
    most = status.get("max_failures")
    wait = status.get("backoff_remaining_s")
    if state == "starting" and progress is not None:
        text = (f"{progress * 100:.1f} % of the ready budget ({_secs(launch.get('elapsed_s'))} of "
                f"{_secs(launch.get('ready_budget_s'))})")
    elif state == "starting":
        text = "starting: the runtime is bringing the engine up (the ready budget counts from then)"
    elif state == "backoff":
        text = (f"backing off after a failure: next try in {_secs(wait)}" if isinstance(wait, int | float)
                and wait > 0 else "backing off after a failure: the next try starts now")
    else:
        text = {
            "idle": "idle: no engine running",
            "preflight": "preflight: checking the recipe against this host before starting",
            "ready": f"ready in {_secs(launch.get('ready_s'))}",
            "draining": "draining: requests in flight finish, then the engine stops",
            "stopping": "stopping the engine",
            "exited": "the engine exited: classifying how (a kernel OOM record can come a moment later)",
            "failed": "failed: the controller gave up; Restart or Apply to try again",
        }.get(state, state)
    retry = ""
    if failures:
        of = f"{failures} of {most}" if most else str(failures)
        if state == "backoff":
            soon = isinstance(wait, int | float) and wait > 0
            retry = f"{of} failures before giving up" + (
                f"; next try in {_secs(wait)}" if soon else "; retrying now")
        elif state == "failed":
            retry = f"{of} failures: gave up"
        elif state in ("preflight", "starting"):
            retry = f"{of} failures before giving up: this start is a retry"
        else:
            retry = f"{of} failures before giving up"
    cache = launch.get("cache")
    if cache == "hit":
        cache_text = "hit: a warm start"
    elif cache == "miss":
        cache_text = "miss: a cold start"
    elif launch and state in ("preflight", "starting"):
        cache_text = "not known yet: no cache line in the log so far"
    else:
        cache_text = "—" if not launch else "no cache line in the log"
    if launch.get("kind") == "cold-warmup":
        cache_text += " (the warm-up start: it fills the cache, then the engine restarts warm)"
    elif launch.get("kind") == "warm":
        cache_text += " (the restart after the warm-up start)"
    return {"progress_text": text, "retry_text": retry, "cache_text": cache_text}


def memory_line(memory: dict[str, Any] | None) -> dict[str, str]:
    """Current MemAvailable and its headroom against the recipe's target, as the Now page says them."""
    if not memory or memory.get("available") is None:
        return {"memory_text": "no host sample yet", "headroom_text": "—"}
    text = f"{_gib(memory['available'])} of {_gib(memory.get('total'))}"
    age = memory.get("age_s")
    if isinstance(age, int | float) and age > STALE_SAMPLE_S:
        text += f" (the last sample is {_secs(age)} old)"
    target = memory.get("target")
    if not target:
        return {"memory_text": text, "headroom_text": "the recipe states no MemAvailable target"}
    headroom = float(memory["available"]) - float(target)
    side = "above" if headroom >= 0 else "BELOW"
    return {"memory_text": text,
            "headroom_text": f"{_gib(abs(headroom))} {side} the recipe's target of ≥ {_gib(target)}"}


def live_view(status: dict[str, Any], memory: dict[str, Any] | None = None) -> dict[str, Any]:
    """The fields the Now page updates live (console.js); nothing secret is in driver.status().
    `memory`: ConsoleData.host_now (the host watch's latest sample and the recipe's target)."""
    launch = status.get("launch") or {}
    diagnosis = status.get("last_diagnosis") or {}
    progress = status.get("progress")
    eta: dict[str, Any] = status.get("eta") or {}
    return {
        **state_line(status),
        **memory_line(memory),
        "state": status.get("state"),
        "recipe": status.get("recipe"),
        "phase": launch.get("phase"),
        "describe": launch.get("describe"),
        "progress": progress,
        "progress_pct": None if progress is None else round(progress * 100, 1),
        "elapsed_s": launch.get("elapsed_s"),
        "ready_budget_s": launch.get("ready_budget_s"),
        "ready_s": launch.get("ready_s"),
        "headroom_low": bool(memory and memory.get("target") and memory.get("available") is not None
                             and memory["available"] < memory["target"]),
        "launch_id": launch.get("id"),
        "cache": launch.get("cache"),
        # every start-up step in order; `done` once reached (log_phases.PhaseTracker.phase_list); with
        # history, each against its usual duration (appliance/observe/ready_eta.py)
        "phases": eta_phases(eta) if eta else [
            {"label": p.get("label") or p.get("phase"), "done": p.get("at") is not None, "current": False}
            for p in launch.get("phases", [])],
        # the expected ready time from earlier launches of this variant, and a likely-stall flag
        "eta_text": eta.get("text"),
        "stall": (eta.get("stall") or {}).get("text"),
        # elapsed against the usual ready time (the second bar; None without history)
        "eta_pct": _pct(eta.get("elapsed_s"), eta.get("median_s")),
        "diagnosis": diagnosis.get("summary"),
        # the gateway holding new requests across a planned switch ("" when not)
        "hold_text": status_line(status.get("hold")),
        # the other engine of a blue/green switch ("" with one engine)
        "blue_green_text": _blue_green_line(status.get("blue_green")),
        # the failed launch's last log lines while backing off or failed (status_view.FAILED_TAIL_LINES)
        "log_tail": "\n".join(status.get("failed_log_tail") or []),
        "hint": diagnosis.get("hint"),
    }


def _blue_green_line(bg: dict[str, Any] | None) -> str:
    if not bg:
        return ""
    if bg.get("old") == "serving":
        return f"blue/green: {bg.get('old_recipe')} serves while the new engine starts beside it"
    return f"blue/green: switched; {bg.get('old_recipe')} is being drained and stopped"


def plan_view(report: PlanReport, driver: Driver) -> dict[str, Any]:
    """What `POST /recipes/{name}/plan` answers, shaped for a page (secrets redacted)."""
    current = driver.view.launch
    spec = redact_spec(report.spec) if report.spec else None
    return {
        "recipe": report.recipe,
        "launchable": report.launchable,
        "refusals": report.refusals,
        "findings": report.findings,
        "admission": report.admission,
        "command": " ".join(spec.command()) if spec else None,
        "render_error": report.render_error,
        "cache_root": spec.cache_root if spec else None,
        "cache_empty": report.cache_empty,
        "warm_restart_flow": report.recipe.expect.warm_restart and bool(report.cache_empty),
        "would_replace": current.spec.recipe if current else None,
        "state": driver.view.state.value,
        "switch": driver.switch_plan(report.recipe.name, report.spec.spec_hash if report.spec else None),
    }


def _phase_label(name: str) -> str:
    try:
        return PHASE_LABELS[Phase(name)]
    except (ValueError, KeyError):
        return name.replace("_", " ")


def _phase_bars(record: LaunchRecord) -> list[charts.Bar]:
    """Time spent in each start-up phase: a phase lasts until the next one (the last until ready or
    the end). Repeated markers of one phase (a cache hit per graph) are one bar."""
    seen: list[tuple[str, float, str]] = []
    for p in record.phases:
        if seen and seen[-1][0] == p.name:
            continue
        seen.append((p.name, p.elapsed_s, p.detail))
    if not seen:
        return []
    end = record.ready_s
    if end is None and record.ended_at is not None and record.started_at is not None:
        end = record.ended_at - record.started_at
    if end is None:
        end = max(s for _, s, _ in seen)
    # A miss with nothing to reuse (a first start of the variant, a cache emptied on purpose) is what
    # was expected: drawn like any phase, not red as a miss that should have been a hit.
    expected = miss_expected(record.compile_cache)
    bars: list[charts.Bar] = []
    for i, (name, start, detail) in enumerate(seen):
        stop = seen[i + 1][1] if i + 1 < len(seen) else max(end, start)
        miss = "miss" in name
        color = ((charts.PALETTE[0] if expected else "#dc2626") if miss
                 else "#059669" if "hit" in name else charts.PALETTE[0])
        label = _phase_label(name) + (" (expected: nothing to reuse)" if miss and expected else "")
        bars.append(charts.Bar(label, start, stop, color, detail[:160]))
    return bars


# Why the compile cache missed, in words (controller/supervisor/compile_cache.py's reasons): what the
# Launches table says instead of the raw log line that proved it (kept as the tooltip).
MISS_WORDS = {
    "cold_first": "cold: the first start of this variant, nothing to reuse yet (expected)",
    "cache_emptied": "cold: the cache was emptied on purpose (expected)",
    "env": "missed: an environment variable the compile key covers changed",
    "flag": "missed: an engine flag the compile key covers changed",
    "version": "missed: the vLLM or torch version changed",
    "model": "missed: the model changed",
    "unknown": "missed: no recorded factor differs from the earlier launch",
}
EXPECTED_MISSES = frozenset({"cold_first", "cache_emptied"})


def miss_expected(compile_cache: dict[str, Any]) -> bool:
    return (compile_cache.get("miss") or {}).get("reason") in EXPECTED_MISSES


def cache_words(cache: str | None, compile_cache: dict[str, Any]) -> str | None:
    """The cache outcome of a launch in words: why it missed, or that the log proved a hit."""
    if cache == "hit":
        return "warm: the log shows the compiled artifacts loaded"
    if cache == "miss":
        reason = (compile_cache.get("miss") or {}).get("reason")
        return MISS_WORDS.get(str(reason), "cold: compiled from scratch")
    return None


def oom_markers(ooms: list[OomMark], engine_pids: set[int]) -> list[charts.Marker]:
    """OOM kills as chart markers: the engine's (a pid a launch record attributes to itself) red,
    any other process's grey and said to be another's, so a neighbour's kill is not read as ours."""
    out = []
    for m in ooms:
        ours = m.pid is not None and m.pid in engine_pids
        label = f"OOM kill {m.task or '?'}" + ("" if ours else " (not the engine)")
        out.append(charts.Marker(m.at, label, charts.OOM_ENGINE if ours else charts.OOM_OTHER, dashed=False))
    return out


def _oom_legend(markers: list[charts.Marker]) -> list[tuple[str, str]]:
    colors = {m.color for m in markers if not m.dashed}
    return [(name, c) for name, c in (("engine OOM kill", charts.OOM_ENGINE),
                                      ("another process's OOM kill", charts.OOM_OTHER),
                                      ("GPU event", charts.GPU_EVENT)) if c in colors]


def _memory_chart(points: list[HostPoint], title: str, x_range: tuple[float, float] | None,
                  markers: list[charts.Marker], target_bytes: float | None) -> Markup:
    series = [
        charts.Series("MemAvailable", [(p.at, p.mem_available_bytes) for p in points], "#2563eb", fold=min),
        charts.Series("swap used", [(p.at, p.swap_used_bytes) for p in points], "#d97706", fold=max),
    ]
    hlines = [charts.HLine(target_bytes, f"recipe target {_gib(target_bytes)}")] if target_bytes else []
    top = max((p.mem_total_bytes for p in points), default=None)
    return charts.line_chart(series, title=title, x_range=x_range, y_max=float(top) if top else None,
                             y_format=charts.gib_tick, y_unit=GIB, markers=markers, hlines=hlines,
                             marker_legend=_oom_legend(markers))


def _psi_chart(points: list[HostPoint], title: str, x_range: tuple[float, float] | None,
               markers: list[charts.Marker]) -> Markup:
    series = [
        charts.Series("PSI some avg10 %", [(p.at, p.psi_some_avg10) for p in points], "#7c3aed"),
        charts.Series("PSI full avg10 %", [(p.at, p.psi_full_avg10) for p in points], "#dc2626"),
    ]
    top = max([v for p in points for v in (p.psi_some_avg10, p.psi_full_avg10) if v is not None], default=0.0)
    return charts.line_chart(series, title=title, x_range=x_range, y_max=max(10.0, top * 1.2),
                             y_format=lambda v: f"{charts.tick_number(v)} %", markers=markers,
                             marker_legend=_oom_legend(markers))


class ConsoleData:
    def __init__(self, ctx: ApiContext, history: HostHistory) -> None:
        self.ctx = ctx
        self.history = history
        self._targets: dict[str, tuple[float, float | None]] = {}

    # -- Now

    def host_now(self, recipe_name: str | None) -> dict[str, Any]:
        """The host watch's latest sample and the recipe's MemAvailable target (bytes)."""
        points = self.history.points()
        last = points[-1] if points else None
        return {"available": last.mem_available_bytes if last else None,
                "total": last.mem_total_bytes if last else None,
                "age_s": time.time() - last.at if last else None,
                "target": self._cached_target(recipe_name) if recipe_name else None}

    def _cached_target(self, recipe_name: str) -> float | None:
        now = time.monotonic()
        hit = self._targets.get(recipe_name)
        if hit is not None and now - hit[0] < TARGET_TTL_S:
            return hit[1]
        target = self._target_bytes(recipe_name)
        self._targets[recipe_name] = (now, target)
        return target

    def expectations(self, recipe_name: str | None) -> dict[str, Any] | None:
        if not recipe_name:
            return None
        try:
            recipe = self.ctx.preflight.recipe(recipe_name)
        except (UnknownRecipe, Exception):  # noqa: BLE001 - a page must render with a broken recipe dir
            return None
        e = recipe.expect
        return {
            "name": recipe.name, "platform": recipe.platform.value, "tp": recipe.engine.tensor_parallel_size,
            "mode": recipe.engine.mode.value, "decode_ms_per_token": e.decode_ms_per_token,
            "ready_budget_s": e.ready_budget_s, "reproducibility": e.reproducibility.value,
            "min_mem_available_gib": e.min_mem_available_gib, "warm_restart": e.warm_restart,
            "notes": e.notes,
        }

    async def gateway(self) -> dict[str, Any]:
        """The gateway's upstream and in-flight count (its admin surface), or why it is unknown."""
        gw = self.ctx.driver.gateway
        if isinstance(gw, NoGateway):
            up = await gw.current()
            return {"attached": False, "upstream": up.url if up else None, "in_flight": None,
                    "note": "no gateway attached to this controller"}
        if isinstance(gw, control.ControlGateway):
            token = admin_token.read_gateway_token(self.ctx.home / "run")
            if token is None:
                return {"attached": True, "upstream": None, "in_flight": None,
                        "note": "no gateway control token on this host"}
            try:
                data = await asyncio.wait_for(control.get_upstream(gw.url, token), GATEWAY_TIMEOUT_S)
            except (TimeoutError, control.GatewayControlError, OSError) as exc:
                return {"attached": True, "upstream": None, "in_flight": None,
                        "note": f"the gateway at {gw.url} did not answer: {exc}"}
            view = data.get("upstream") or {}
            return {"attached": True, "url": gw.url, "upstream": view.get("url"),
                    "served_model": view.get("served_model"), "in_flight": data.get("in_flight"),
                    "queue_waiting": data.get("queue_waiting"), "note": None}
        up = await gw.current()
        return {"attached": True, "upstream": up.url if up else None, "in_flight": None, "note": None}

    # -- Recipes

    def recipe_rows(self) -> list[dict[str, Any]]:
        recipes = self.ctx.preflight.catalogue.load()
        facts = self.ctx.preflight.facts()
        rows = []
        for r in sorted(recipes.values(), key=lambda r: r.name):
            if r.abstract:
                continue
            admission = admit(r, facts)
            findings = lint(r)
            errors = sum(f.severity == "error" for f in findings)
            # A runtime this controller does not offer (a cluster recipe, no cluster) refuses it first.
            gap = self.ctx.preflight.runtime_check(r)
            # Why Apply is greyed out: what the preflight would refuse it for (runtime, admission, lint).
            refused = [gap.summary] if gap is not None else []
            refused += [f"{c.name}: {c.message}" for c in admission.checks if c.verdict == "refuse"]
            if errors:
                refused.append(f"{errors} lint error{'s' if errors != 1 else ''}")
            rows.append({
                "name": r.name, "description": r.description.strip().splitlines()[0] if r.description else "",
                "platform": r.platform.value, "tp": r.engine.tensor_parallel_size,
                "mode": r.engine.mode.value, "runtime": r.runtime.kind,
                "verdict": "refuse" if gap is not None else admission.verdict, "checks": admission.checks,
                # what the verdict cell says: "needs a cluster" rather than a host verdict that does not apply
                "verdict_label": gap.summary.split(":", 1)[0] if gap is not None else admission.verdict,
                "errors": errors,
                "warnings": sum(f.severity == "warning" for f in findings),
                "infos": sum(f.severity == "info" for f in findings),
                "apply_refused": "; ".join(refused) if refused else None,
                "default": r.name == self.ctx.default_recipe,
            })
        return rows

    def diff(self, a: str, b: str) -> dict[str, Any]:
        d: RecipeDiff = self.ctx.preflight.catalogue.diff(a, b)
        return {"changes": d.changes, "same_cache": d.same_compile_inputs, "cache_keys": d.keys}

    # -- Launches

    def launch_rows(self, limit: int = 100) -> list[dict[str, Any]]:
        rows = []
        for s in self.ctx.store.list_launches(limit):
            record = self.ctx.store.get_launch(s.id)
            evidence = self._cache_evidence(record) if record else None
            rows.append({"s": s, "evidence": evidence, "ooms": len(record.oom) if record else 0,
                         "cache_words": cache_words(s.cache, record.compile_cache) if record else None,
                         "miss_expected": miss_expected(record.compile_cache) if record else False,
                         "diagnosis": (record.diagnosis or {}).get("summary") if record else None})
        return rows

    @staticmethod
    def _cache_evidence(record: LaunchRecord) -> str | None:
        """The log line that proved the cache outcome (DOMAIN §4: a hit needs a hit marker and no miss)."""
        wanted = "compile_cache_miss" if record.cache == "miss" else "compile_cache_hit"
        for p in record.phases:
            if p.name == wanted:
                return p.detail
        return None

    def launch_view(self, launch_id: str) -> dict[str, Any] | None:
        record = self.ctx.store.get_launch(launch_id)
        if record is None:
            return None
        start = record.started_at or record.created_at
        end = record.ended_at or time.time()
        markers = [charts.Marker(start, "start", "#059669")]
        if record.ready_at:
            markers.append(charts.Marker(record.ready_at, "ready", "#2563eb"))
        if record.ended_at:
            markers.append(charts.Marker(record.ended_at, "end", "#6b7280"))
        # the launch's own events are the kills attributed to its engine
        markers += [charts.Marker(e.at, "OOM kill", charts.OOM_ENGINE, dashed=False)
                    for e in record.events if e.kind == "oom-kill"]
        # GPU kernel events attributed to the launch (controller/supervisor/gpu_health_watch.py)
        markers += [charts.Marker(e.at, "GPU event", charts.GPU_EVENT, dashed=False)
                    for e in record.events if e.kind == "gpu-event"]
        window = (start - MEMORY_PAD_S, end + MEMORY_PAD_S)
        points = self.history.points(*window)
        target = self._target_bytes(record.recipe)
        memory = _memory_chart(points, f"host memory during {launch_id}", window if points else None,
                               markers, target) if points else None
        return {
            "r": record, "evidence": self._cache_evidence(record),
            "cache_words": cache_words(record.cache, record.compile_cache),
            "waterfall": charts.waterfall(_phase_bars(record), title=f"start-up phases of {launch_id}"),
            "memory": memory, "samples": len(points),
        }

    def _target_bytes(self, recipe_name: str) -> float | None:
        try:
            recipe: Recipe = self.ctx.preflight.recipe(recipe_name)
        except Exception:  # noqa: BLE001 - a deleted or broken recipe only loses its target line
            return None
        gib = recipe.expect.min_mem_available_gib
        return gib * GIB if gib else None

    # -- Host memory

    def memory_view(self, window_s: float) -> dict[str, Any]:
        now = time.time()
        since = now - window_s
        points = self.history.points(since)
        markers: list[charts.Marker] = []
        engine_pids: set[int] = set()
        for s in self.ctx.store.list_launches(50):
            record = self.ctx.store.get_launch(s.id)
            if record is None:
                continue
            engine_pids |= {o["pid"] for o in record.oom if isinstance(o.get("pid"), int)}
            begin, end = record.started_at or record.created_at, record.ended_at
            if end is not None and end < since:
                continue
            if begin >= since:
                markers.append(charts.Marker(begin, f"start {record.recipe}", "#059669"))
            if record.ready_at and record.ready_at >= since:
                markers.append(charts.Marker(record.ready_at, "ready", "#2563eb"))
            if end is not None and end >= since:
                markers.append(charts.Marker(end, f"end ({record.status})", "#6b7280"))
        markers += oom_markers(self.history.ooms(since), engine_pids)
        recipe = self.ctx.driver.view.recipe
        target = self._target_bytes(recipe) if recipe else None
        # A controller younger than the window has no samples before it started: start the axis at
        # the first sample (or the earliest marker), so a short history is not a sliver at the edge.
        first = min([p.at for p in points[:1]] + [m.x for m in markers if m.x >= since], default=since)
        x_range = (max(since, first), now)
        last = points[-1] if points else None
        return {
            "memory": _memory_chart(points, "MemAvailable and swap used", x_range, markers, target),
            "psi": _psi_chart(points, "memory pressure (PSI)", x_range, markers),
            "last": last, "samples": len(points), "capacity": self.history.maxlen,
            "min_available": min((p.mem_available_bytes for p in points), default=None),
            "swap_peak": max((p.swap_used_bytes for p in points), default=None),
            "ooms": self.history.ooms(since), "target": target, "recipe": recipe,
        }
