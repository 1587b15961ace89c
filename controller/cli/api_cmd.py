"""`appliance apply | status | logs | stop | restart | launches`: the commands that talk to the
controller's API (`--api`, $APPLIANCE_API, default http://127.0.0.1:8090); mutations need the admin
token in $APPLIANCE_ADMIN_TOKEN. `follow_outcome` / `end_of_follow` (a start phase by phase, then its
outcome) are shared with `up` (controller/cli/lifecycle_cmd.py).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from datetime import datetime
from typing import Annotated, Any
from urllib.parse import quote

import click
import typer

from appliance.observe.log_filter import LineFollower, LogFilter, SinceError, parse_since
from controller.api_client import ApiError, Client, api_url
from controller.catalogue import did_you_mean
from controller.cli.launch_view import LaunchLookupError, launch_lines, resolve_launch
from controller.cli.load_lines import load_lines
from controller.cli.options import JsonOpt
from controller.cli.startup_display import StartView, eta_phase_line, follow_start
from controller.gateway.hold.text import status_line
from controller.settings import (
    CONTROLLER_PORT,
)

ApiOpt = Annotated[str | None, typer.Option("--api", help="Controller API URL (default $APPLIANCE_API, else "
                                            "the one `appliance up` started for this APPLIANCE_HOME, else "
                                            f"http://127.0.0.1:{CONTROLLER_PORT}).")]
FollowOpt = Annotated[bool, typer.Option("--follow", "-f", help="Show the start phase by phase until "
                                         "ready or failed.")]



def register(app: typer.Typer) -> None:
    """Add this module's commands to the `appliance` app."""
    for name, fn in (("apply", apply), ("status", status), ("logs", logs), ("stop", stop),
                     ("restart", restart), ("launches", launches)):
        app.command(name)(fn)


def fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)



def follow_outcome(client: Client, timeout_s: float | None = None, *, err: bool = False) -> str | None:
    """`err`: the phase lines go to stderr (with --json, stdout holds only the JSON)."""
    def echo(line: str) -> None:
        typer.echo(line, err=err)

    view = StartView(echo)
    try:
        return asyncio.run(follow_start(client.base, view, lambda: client.get("/status"), timeout_s))
    except KeyboardInterrupt:
        echo("(stopped following; the controller carries on — `appliance status`)")
        return None


def _refusal(s: dict[str, Any], recipe: str, apply_id: int | None = None) -> dict[str, Any] | None:
    """The failure of this apply's preflight (admission, lint...), from `status.last_apply`."""
    last = s.get("last_apply") or {}
    # "failed": a blue/green start that failed beside the serving engine, which serves on.
    if last.get("recipe") != recipe or last.get("outcome") not in ("refused", "failed"):
        return None
    if apply_id is not None and last.get("token") != apply_id:
        return None
    failure: dict[str, Any] = last.get("failure") or {"summary": "refused (no reason given)"}
    return failure


def _refused(recipe: str, failure: dict[str, Any], serving: str | None, word: str = "REFUSED") -> typer.Exit:
    typer.echo(f"{word}: {recipe}: {failure.get('summary')}", err=True)
    if failure.get("hint"):
        typer.echo(f"  hint: {failure['hint']}", err=True)
    if serving:
        typer.echo(f"  (the engine keeps serving {serving})", err=True)
    return typer.Exit(1)


def end_of_follow(client: Client, outcome: str | None, recipe: str | None = None, *,
                  err: bool = False) -> None:
    """`recipe`: what was asked for. Ready with another recipe means this apply did not happen
    (a refused apply once printed "ready: <the old recipe>" and exited 0). `err`: the ready line
    goes to stderr (with --json)."""
    if outcome == "ready":
        s = client.get("/status")
        if recipe is not None and s.get("recipe") != recipe:
            failure = _refusal(s, recipe)
            if failure is not None:
                failed = (s.get("last_apply") or {}).get("outcome") == "failed"
                raise _refused(recipe, failure, s.get("recipe"), "FAILED" if failed else "REFUSED")
            typer.echo(f"NOT APPLIED: {recipe}; the engine serves {s.get('recipe')} "
                       "(another apply came in?)", err=True)
            raise typer.Exit(1)
        launch = s.get("launch") or {}
        typer.echo(f"ready: {s.get('recipe')} at {launch.get('engine_url')} in {launch.get('ready_s')} s "
                   f"(compile cache: {launch.get('cache')})", err=err)
        return
    s = client.get("/status")
    diag = s.get("last_diagnosis") or {}
    if outcome == "failed":
        typer.echo(f"FAILED: {diag.get('summary', 'no diagnosis')}", err=True)
        if diag.get("hint"):
            typer.echo(f"  hint: {diag['hint']}", err=True)
        raise typer.Exit(1)
    if outcome == "idle":
        typer.echo("the engine was stopped", err=True)
        raise typer.Exit(1)



# --------------------------------------------------------------------------------------------
# Commands against the API


def _client(api: str | None) -> Client:
    return Client(api_url(api))


def _call(fn: Any, *args: Any) -> Any:
    """`fn(*args)`; an API error becomes its detail in words on stderr (`str(ApiError)` carries no
    HTTP code) and an exit code from the status: 2 for a refused credential, an unknown name or bad
    input, 1 otherwise."""
    try:
        return fn(*args)
    except ApiError as exc:
        raise fail(str(exc), _exit_code(exc)) from exc


def _exit_code(exc: ApiError) -> int:
    return 2 if exc.status in (401, 403, 404, 422) else 1


def _echo_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2))


def _unknown_recipe(client: Client, recipe: str, exc: ApiError) -> typer.Exit:
    """A 404 from /apply: the controller does not know `recipe`; suggest the near names it serves."""
    try:
        names = [str(r["name"]) for r in client.get("/recipes")]
    except (ApiError, KeyError, TypeError):
        names = []
    return fail(f"{exc}{did_you_mean(recipe, names)}", _exit_code(exc))


def apply(
    recipe: Annotated[str, typer.Argument(help="Recipe name.")],
    follow: FollowOpt = False,
    fresh_cache: Annotated[bool, typer.Option(
        help="Empty the recipe's compile cache first (cold start).")] = False,
    force: Annotated[bool, typer.Option(
        "--force", help="Restart even when exactly this recipe's launch is already ready.")] = False,
    blue_green: Annotated[bool, typer.Option(
        "--blue-green/--no-blue-green",
        help="Start the new engine beside the serving one when it fits, then switch with no hold "
        "(default); --no-blue-green: drain, stop and start with the gateway holding requests.")] = True,
    alongside: Annotated[bool, typer.Option(
        "--alongside",
        help="Start it beside the running engines, as an engine of its own serving the recipe's model "
        "name (the gateway routes that name to it); refused when its name, port, RAM, cores or cards "
        "are taken, naming the engine in the way.")] = False,
    as_json: JsonOpt = False,
    api: ApiOpt = None,
) -> None:
    """Apply RECIPE: preflight, then blue/green when the new engine fits beside the serving one (start
    it, switch the gateway when it is ready, drain and stop the old one), else drain and stop the
    current engine and start the new one while the gateway holds new requests. With --alongside: start
    it beside the running engines, leaving them as they are.

    Says what the preflight decided: REFUSED (exit 1, the old engine keeps serving), unchanged (the
    same launch is already ready: nothing restarted unless --force), or started. With --json stdout
    is the API's answer (state, recipe, apply_id) as JSON; the rest goes to stderr, exit codes alike."""
    client = _client(api)
    try:
        body: dict[str, object] = {"recipe": recipe, "fresh_cache": fresh_cache, "force": force}
        if not blue_green:  # the default is left out: a controller before blue/green takes the body too
            body["blue_green"] = False
        if alongside:  # left out unless asked: an older controller refuses the field (422)
            body["alongside"] = True
        answer = client.post("/apply", body)
    except ApiError as exc:
        if exc.status == 404:
            raise _unknown_recipe(client, recipe, exc) from exc
        raise fail(str(exc), _exit_code(exc)) from exc
    if alongside:
        model = str(answer.get("model"))
        if as_json:
            _echo_json(answer)
        else:
            typer.echo(f"accepted: {recipe} beside the running engines, as model '{model}' "
                       f"(state {answer['state']})")
            if answer.get("admitted"):
                typer.echo(f"fits:     {answer['admitted']}")
        if follow:
            follow_engine(client, model, err=as_json)
        return
    if as_json:
        _echo_json(answer)
    else:
        typer.echo(f"accepted: {recipe} (state {answer['state']})")
        if answer.get("switch"):
            typer.echo(f"path:     {answer['switch']['path']}: {answer['switch']['why']}")
    verdict = _await_preflight(client, answer.get("apply_id"))
    if verdict is not None:
        s, outcome = verdict
        if outcome == "refused":
            raise _refused(recipe, _refusal(s, recipe) or {}, s.get("recipe") if s.get("launch") else None)
        if outcome == "unchanged":
            typer.echo(f"unchanged: {recipe} is already running with exactly this launch spec; nothing "
                       "restarted (`appliance apply --force` restarts it)", err=as_json)
            return
    if follow:
        if as_json:
            end_of_follow(client, follow_outcome(client, err=True), recipe, err=True)
        else:
            end_of_follow(client, follow_outcome(client), recipe)


def _await_preflight(client: Client, apply_id: int | None,
                     timeout_s: float = 300.0) -> tuple[dict[str, Any], str] | None:
    """Wait for this apply's preflight verdict (seconds: lint, admission, render). None when the
    controller does not say (an older one) or it takes longer than `timeout_s`."""
    if apply_id is None:
        return None
    deadline = time.monotonic() + timeout_s
    while True:
        s = _call(client.get, "/status")
        last = s.get("last_apply") or {}
        if last.get("token") != apply_id:
            return None  # another apply superseded ours: follow the state instead
        if last.get("outcome") != "pending":
            return s, str(last.get("outcome"))
        if time.monotonic() > deadline:
            typer.echo("the preflight is still running; `appliance status` tells how it ends")
            return None
        time.sleep(0.3)


# An engine's state that ends `follow_engine`: how it ended (ready), or that it did not.
_ENGINE_ENDS = {"ready": True, "failed": False, "idle": False}


def follow_engine(client: Client, model: str, *, err: bool = False, timeout_s: float | None = None,
                  poll_s: float = 1.0) -> None:
    """Follow one engine of `GET /status` → `engines` (by its model) until it is ready (return) or has
    failed, stopped or gone (exit 1, with its diagnosis)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    said: str | None = None
    while True:
        s = _call(client.get, "/status")
        entry = next((e for e in s.get("engines") or [] if e.get("model") == model), None)
        state = str(entry["state"]) if entry is not None else "gone"
        if state != said:
            typer.echo(f"{model}: {state}", err=err)
            said = state
        if entry is None:
            raise fail(f"engine '{model}' is not running any more (`appliance launches` shows its record)")
        if state in _ENGINE_ENDS:
            if _ENGINE_ENDS[state]:
                typer.echo(f"ready: {model} ({entry.get('recipe')}, port {entry.get('port')}, "
                           f"in {entry.get('ready_s')} s)", err=err)
                return
            raise fail(f"{model} {state}: {entry.get('diagnosis') or 'no diagnosis'}")
        if deadline is not None and time.monotonic() > deadline:
            raise fail(f"{model} is still {state}; `appliance status` tells how it ends")
        time.sleep(poll_s)


ModelOpt = Annotated[str | None, typer.Option(
    "--model", help="The engine serving this model (default: the primary engine).")]


def restart(
    follow: FollowOpt = False,
    blue_green: Annotated[bool, typer.Option(
        "--blue-green/--no-blue-green",
        help="Start the new engine beside the serving one when it fits (another card, or room on the "
        "same one), then switch with no hold (default); --no-blue-green: drain, stop and start with "
        "the gateway holding requests.")] = True,
    model: ModelOpt = None,
    as_json: JsonOpt = False,
    api: ApiOpt = None,
) -> None:
    """Restart the current recipe: blue/green when the new engine fits beside the serving one, else
    drain, stop, start under the hold (the answer's `switch` says which and why, with the numbers).
    With --model: the engine serving that model (drain, stop, start). With --json stdout is the API's
    answer."""
    client = _client(api)
    # Defaults are left out: a controller before blue/green restarts takes the bodyless call too.
    body: dict[str, object] = {**({} if blue_green else {"blue_green": False}),
                               **({"model": model} if model is not None else {})}
    answer = _call(client.post, "/restart", *((body,) if body else ()))
    if model is not None:
        if as_json:
            _echo_json(answer)
        else:
            typer.echo(f"restarting {model}: {answer['recipe']} (state {answer['state']})")
        if follow:
            follow_engine(client, model, err=as_json)
        return
    if as_json:
        _echo_json(answer)
    else:
        typer.echo(f"restarting {answer['recipe']} (state {answer['state']})")
        if answer.get("switch"):
            typer.echo(f"path:     {answer['switch']['path']}: {answer['switch']['why']}")
    if follow:
        if as_json:
            end_of_follow(client, follow_outcome(client, err=True), err=True)
        else:
            end_of_follow(client, follow_outcome(client))


def stop(model: ModelOpt = None, as_json: JsonOpt = False, api: ApiOpt = None) -> None:
    """Stop the engine (drain first) and stay idle; with --model, the engine serving that model (the
    others keep serving). With --json stdout is the API's answer."""
    answer = _call(_client(api).post, "/stop", *(({"model": model},) if model is not None else ()))
    if as_json:
        _echo_json(answer)
        return
    typer.echo(f"stopping{f' {model}' if model is not None else ''} (state {answer['state']})")


WatchOpt = Annotated[bool, typer.Option("--watch", "-w", metavar="",
                                         help="Redraw in place every --every seconds until Ctrl-C.")]
EveryOpt = Annotated[float, typer.Option("--every", min=1.0, max=3600.0, help="Seconds between redraws "
                                         "with --watch.")]


def status(as_json: JsonOpt = False, api: ApiOpt = None, watch: WatchOpt = False,
           every: EveryOpt = 2.0) -> None:
    """State, phase, progress through the ready budget, the ETA from earlier launches, last diagnosis,
    and the load now: req/s, output tokens/s, TTFT/TPOT, in flight, queued, KV cache, errors, uptime.
    With --json: the status with its `load`; with --watch and --json, one JSON line per redraw."""
    client = _client(api)
    while True:
        s = _call(client.get, "/status")
        s["load"] = _load(client)
        if as_json:
            typer.echo(json.dumps(s, indent=None if watch else 2))
        else:
            if watch:
                click.clear()  # in place: the terminal's screen is redrawn, not scrolled
            _print_status(s)
        if not watch:
            return
        try:
            time.sleep(every)
        except KeyboardInterrupt:
            return


def _load(client: Client) -> dict[str, Any] | None:
    """`GET /load`, or None from a controller that has none (older than the load sampler)."""
    try:
        load: dict[str, Any] = client.get("/load")
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise fail(str(exc), _exit_code(exc)) from exc
    return load


def engine_lines(engines: list[dict[str, Any]]) -> list[str]:
    """One line per engine, when there is more than one (the primary's details follow as always)."""
    if len(engines) < 2:
        return []
    lines = [f"engines:    {len(engines)}"]
    for e in engines:
        ready = f", ready in {e['ready_s']} s" if e.get("ready_s") is not None else ""
        why = f" — {e['diagnosis']}" if e.get("diagnosis") and e.get("state") != "ready" else ""
        name = e.get("model") or e.get("engine")
        lines.append(f"  {name}: {e.get('state')}  (recipe {e.get('recipe')}, port {e.get('port')}"
                     f"{ready}{', primary' if e.get('primary') else ''}){why}")
    return lines


def _print_status(s: dict[str, Any]) -> None:
    for line in engine_lines(s.get("engines") or []):
        typer.echo(line)
    typer.echo(f"state:      {s['state']}" + (f"  (recipe {s['recipe']})" if s.get("recipe") else ""))
    launch = s.get("launch")
    if launch:
        typer.echo(f"launch:     {launch['id']} ({launch['kind']}, {launch['runtime']} {launch['ref']})")
        typer.echo(f"engine:     {launch['engine_url']}  model '{launch['served_model_name']}'")
        if launch.get("ready_s") is not None:
            typer.echo(f"ready in:   {launch['ready_s']} s  (compile cache {launch['cache']})")
        elif launch.get("elapsed_s") is not None:
            pct = f"{s['progress'] * 100:.0f}%" if s.get("progress") is not None else "?"
            typer.echo(f"starting:   {launch['elapsed_s']} s of {launch['ready_budget_s']} s ({pct}); "
                       f"{launch['describe']}")
        if s.get("hold"):
            typer.echo(f"gateway:    {status_line(s['hold'])}")
        bg = s.get("blue_green")
        if bg:  # two engines: the old one still serves (the new one starts beside it), or is stopping
            doing = ("serves while this one starts beside it" if bg["old"] == "serving"
                     else "is being drained and stopped: the gateway routes to this one")
            typer.echo(f"blue/green: {bg['old_recipe']} ({bg['old_launch_id']}, {bg['old_url']}) {doing}")
        eta = s.get("eta")
        if eta:
            # The expected ready time from earlier launches of this variant (appliance/observe/ready_eta.py).
            typer.echo(f"expected:   {eta['text']}")
            if eta.get("stall"):
                typer.echo(f"WARNING:    {eta['stall']['text']} (a flag: the stall watch and the ready "
                           "budget still decide)")
            for p in eta.get("phases", []):
                typer.echo(eta_phase_line(p))
        else:
            for p in launch.get("phases", []):
                mark = "x" if p["at"] is not None else " "
                typer.echo(f"  [{mark}] {p['label']}")
        for line in compile_cache_lines(launch.get("compile_cache")):
            typer.echo(line)
    exited = (launch or {}).get("exit")
    if s["state"] == "exited" and exited:
        typer.echo(f"exited:     exit code {exited.get('exit_code')}, signal {exited.get('signal')}; out of "
                   "the gateway (clients get 503 + Retry-After), classifying the exit")
    last_apply = s.get("last_apply") or {}
    if last_apply.get("outcome") == "refused":
        failure = last_apply.get("failure") or {}
        typer.echo(f"last apply: {last_apply.get('recipe')} REFUSED: {failure.get('summary')}")
    if s.get("backoff_remaining_s") is not None:
        typer.echo(f"backoff:    retry in {s['backoff_remaining_s']} s "
                   f"(failure {s['failures']}/{s['max_failures']})")
    if s.get("store_problem"):
        typer.echo(f"STORE LOST: {s['store_problem']}; restart the controller (/healthz says 503)")
    diag = s.get("last_diagnosis")
    if diag:
        which = f" (launch {diag['launch_id']})" if diag.get("launch_id") else ""
        typer.echo(f"last failure{which}: [{diag.get('code')}] {diag.get('summary')}")
        if diag.get("hint"):
            typer.echo(f"  hint:     {diag['hint']}")
    tail = s.get("failed_log_tail")
    if tail:
        typer.echo(f"log tail ({len(tail)} lines of the failed launch):")
        for line in tail:
            typer.echo(f"  | {line}")
    if s.get("load") is not None:
        for line in load_lines(s["load"]):
            typer.echo(line)


def compile_cache_lines(cc: dict[str, Any] | None) -> list[str]:
    """Why the compile cache missed (compared with which launch), and bad cache roots.
    `cc`: a status's `launch.compile_cache` or a record's `compile_cache` (same keys where shared)."""
    if not cc:
        return []
    seen = cc.get("seen") or {}
    cache_hash = cc.get("cache_hash") or seen.get("cache_hash")
    aot = cc.get("aot_path") or seen.get("aot_path")
    out = []
    if cache_hash or aot:
        out.append(f"compile:    vLLM cache dir {cache_hash or '?'}" + (f", AOT {aot}" if aot else ""))
    miss = cc.get("miss")
    if miss:
        against = f" vs launch {miss['compared_with']}" if miss.get("compared_with") else ""
        out.append(f"cache miss: {miss['reason']}{against}: {'; '.join(miss.get('details') or [])}")
    out += [f"WARNING:    {w}" for w in cc.get("warnings") or []]
    return out


def launches(
    launch_id: Annotated[str | None, typer.Argument(
        help="Show this launch (a unique prefix of its ID is enough): phases, cache, memory, diagnosis; "
        "with --json the full record.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="How many (newest first).")] = 20,
    recipe: Annotated[str | None, typer.Option(help="Only this recipe.")] = None,
    as_json: JsonOpt = False,
    api: ApiOpt = None,
) -> None:
    """The launch records: what ran, how long the start took, cache hit/miss, how it ended."""
    client = _client(api)
    if launch_id:
        try:
            record = _call(resolve_launch, client.get, launch_id)
        except LaunchLookupError as exc:
            raise fail(str(exc), 2) from exc
        explained = compile_cache_lines(record.get("compile_cache"))
        if not as_json:
            typer.echo("\n".join(launch_lines(record, explained)))
            return
        typer.echo(json.dumps(record, indent=2))
        # Stdout stays the record as JSON (scripts read it); a reader also sees why the cache missed.
        for line in explained:
            typer.echo(line, err=True)
        return
    query = f"/launches?limit={limit}" + (f"&recipe={quote(recipe, safe='')}" if recipe else "")
    rows = _call(client.get, query)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    typer.echo(f"{'launch':44} {'kind':12} {'status':8} {'ready_s':>8} {'cache':6} {'exit':>5} diagnosis")
    for r in rows:
        ready = f"{r['ready_s']:.1f}" if r["ready_s"] is not None else "-"
        code = r["exit_code"] if r["exit_code"] is not None else "-"
        typer.echo(f"{r['id']:44} {r['kind']:12} {r['status']:8} {ready:>8} {r['cache'] or '-':6} "
                   f"{code!s:>5} {r['diagnosis_code'] or ''}")


def logs(
    launch_id: Annotated[str | None, typer.Option("--launch", help="Which launch (default: the current "
                                                  "or latest).")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines.")] = False,
    lines: Annotated[int, typer.Option(
        "--lines", "-n", "--tail", min=0, help="Lines of the existing log to show (the last N, after "
        "the filters).")] = 50,
    access: Annotated[bool, typer.Option(
        "--access", help="Show the HTTP access lines too (hidden by default: once Prometheus scrapes, "
        "most of the log is `GET /metrics` and `/health`).")] = False,
    since: Annotated[str | None, typer.Option(
        help="Only lines from this time on: a duration (30s, 10m, 2h, 1d) or a time in the log's own "
        "clock (HH:MM, MM-DD HH:MM).")] = None,
    grep: Annotated[str | None, typer.Option(
        help="Only lines matching this regular expression (Python syntax, case-sensitive).")] = None,
    as_json: JsonOpt = False,
    api: ApiOpt = None,
) -> None:
    """The engine's log (stdout+stderr), through the controller, without the HTTP access lines unless
    --access. With --json: one object {launch_id, lines, next_offset}; with --follow too, one more per
    new chunk (JSON Lines)."""
    keep = _log_filter(access, since, grep)
    client = _client(api)
    if launch_id is None:
        current = (_call(client.get, "/status").get("launch") or {}).get("id")
        latest = _call(client.get, "/launches?limit=1")
        launch_id = current or (latest[0]["id"] if latest else None)
    if launch_id is None:
        raise fail("no launch yet")
    offset = 0
    text = ""
    while True:  # read what is there (the API hands out at most 4 MiB per call)
        chunk, headers = _call(client.text, f"/launches/{launch_id}/log?offset={offset}")
        next_offset = int(headers.get("x-next-offset", offset))
        text += chunk
        if next_offset == offset or not chunk:
            break
        offset = next_offset
    follower = LineFollower(keep)
    if follow and text and not text.endswith("\n"):
        # the engine is mid-line: the follower finishes that line before filtering it
        text, _, follower.partial = text.rpartition("\n")
    kept = keep.lines(text.splitlines())
    shown = kept[-lines:] if lines > 0 else []
    if as_json:
        typer.echo(json.dumps({"launch_id": launch_id, "lines": shown, "next_offset": offset}))
    else:
        for line in shown:
            typer.echo(line)
    while follow:
        time.sleep(1.0)
        chunk, headers = _call(client.text, f"/launches/{launch_id}/log?offset={offset}")
        offset = int(headers.get("x-next-offset", offset))
        new = follower.feed(chunk) if chunk else []
        if new and as_json:
            typer.echo(json.dumps({"launch_id": launch_id, "lines": new, "next_offset": offset}))
        else:
            for line in new:
                typer.echo(line)


def _log_filter(access: bool, since: str | None, grep: str | None) -> LogFilter:
    """The `logs` options as a filter; a bad --since or --grep is a usage error (exit 2) in words."""
    try:
        when = parse_since(since, datetime.now()) if since is not None else None
    except SinceError as exc:
        raise fail(str(exc), 2) from exc
    try:
        pattern = re.compile(grep) if grep is not None else None
    except re.error as exc:
        raise fail(f"--grep {grep!r} is not a regular expression: {exc}", 2) from exc
    return LogFilter(access=access, since=when, grep=pattern)
