"""The CLI's conventions across every command group: `--json` is a flag (shown as one) on every
command that answers something, `--version`, API errors in words (the HTTP status only picks the
exit code), "did you mean" for a mistyped recipe, and a `recipes show` that shows what is set."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner

from controller.api_client import ApiError
from controller.cli import api_cmd, keys_cmd, main, recipes_cmd
from controller.gateway.keystore import KeyStore
from tests.unit.recipe_helpers import HOSTS, RECIPES_DIR

if not main.app.registered_commands and not main.app.registered_groups:
    main._register()


def _commands(group: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    # Typer's own (vendored) click classes: walked by shape, not by type.
    commands = getattr(group, "commands", None)
    if commands is not None:
        for name, cmd in commands.items():
            yield from _commands(cmd, (*path, name))
    else:
        yield path, group


def _json_commands() -> dict[tuple[str, ...], Any]:
    root = typer.main.get_command(main.app)
    out = {}
    for path, cmd in _commands(root):
        for p in cmd.params:
            if "--json" in getattr(p, "opts", ()):
                out[path] = p
    return out


def test_every_json_option_is_a_flag_and_its_help_shows_no_value() -> None:
    found = _json_commands()
    # The commands that answer something all take --json, these included.
    assert {("apply",), ("restart",), ("stop",), ("logs",), ("keys", "revoke"), ("status",),
            ("launches",), ("recipes", "show"), ("plan",)} <= set(found), sorted(found)
    runner = CliRunner()
    for path, option in found.items():
        assert option.is_flag and not option.secondary_opts, path
        result = runner.invoke(main.app, [*path, "--help"], terminal_width=200)
        assert result.exit_code == 0, (path, result.output)
        line = next(x for x in result.output.splitlines() if x.lstrip("│ ").startswith("--json"))
        assert "<bool>" not in line and "TEXT" not in line and "BOOLEAN" not in line, (path, line)


def test_version_prints_the_installed_package_version() -> None:
    result = CliRunner().invoke(main.app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"appliance {metadata.version('llm-appliance')}"


# --- API errors in words -----------------------------------------------------------------------


def test_an_api_error_reads_as_its_detail_and_keeps_the_status() -> None:
    exc = ApiError(404, "no launch 'abc'")
    assert str(exc) == "no launch 'abc'" and exc.status == 404
    assert str(ApiError(503, "")) == "service unavailable"
    assert str(ApiError(None, "cannot reach the controller at http://x: refused")).startswith("cannot reach")


class _Raising:
    base = "http://127.0.0.1:1"
    token = "t"

    def __init__(self, status: int, detail: str, recipes: list[str] | None = None) -> None:
        self.status, self.detail, self.recipes = status, detail, recipes or []

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        raise ApiError(self.status, self.detail)

    def get(self, path: str) -> Any:
        if path == "/recipes":
            return [{"name": n} for n in self.recipes]
        raise ApiError(self.status, self.detail)


@pytest.fixture
def api_app(monkeypatch: pytest.MonkeyPatch) -> typer.Typer:
    app = typer.Typer()
    api_cmd.register(app)
    keys_cmd.register(app)
    return app


def test_an_api_error_prints_words_not_the_http_code_and_exits_by_status(
    api_app: typer.Typer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(api_cmd, "_client", lambda api: _Raising(409, "a start is already in progress"))
    result = CliRunner().invoke(api_app, ["restart"])
    assert result.exit_code == 1
    assert result.stderr.strip() == "error: a start is already in progress"
    monkeypatch.setattr(api_cmd, "_client", lambda api: _Raising(401, "invalid admin token"))
    result = CliRunner().invoke(api_app, ["stop"])
    assert result.exit_code == 2 and result.stderr.strip() == "error: invalid admin token"


def test_a_mistyped_recipe_on_apply_gets_the_near_names(
    api_app: typer.Typer, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = ["cpu-smollm2", "cpu-smollm2-eager", "gfx906-b-tp4-eager"]
    client = _Raising(404, "unknown recipe 'cpu-smolm2'", names)
    monkeypatch.setattr(api_cmd, "_client", lambda api: client)
    result = CliRunner().invoke(api_app, ["apply", "cpu-smolm2"])
    assert result.exit_code == 2
    assert "404" not in result.stderr
    assert "did you mean 'cpu-smollm2'" in result.stderr and "gfx906" not in result.stderr


class _KeysApi(BaseHTTPRequestHandler):
    def do_DELETE(self) -> None:
        body = json.dumps({"detail": "no key 'k-missing'"}).encode()
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_keys_through_the_api_print_the_detail_in_words(
    api_app: typer.Typer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("APPLIANCE_ADMIN_TOKEN", "t" * 32)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _KeysApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        result = CliRunner().invoke(api_app, ["keys", "revoke", "k-missing", "--api", url])
    finally:
        server.shutdown()
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: no key 'k-missing'"


# --- --json on the mutations ------------------------------------------------------------------


class _Accepting:
    base = "http://127.0.0.1:1"
    token = "t"

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return {"accepted": True, "state": "preflight", "recipe": "cpu-smollm2", "apply_id": None}

    def get(self, path: str) -> Any:
        if path == "/status":
            return {"state": "ready", "launch": {"id": "L1"}}
        return []

    def text(self, path: str) -> tuple[str, dict[str, str]]:
        offset = int(path.rsplit("=", 1)[1])
        return ("one\ntwo\n", {"x-next-offset": "8"}) if offset == 0 else ("", {"x-next-offset": "8"})


@pytest.mark.parametrize("args", [["apply", "cpu-smollm2"], ["restart"], ["stop"]])
def test_mutations_print_the_api_answer_as_json(
    api_app: typer.Typer, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    monkeypatch.setattr(api_cmd, "_client", lambda api: _Accepting())
    result = CliRunner().invoke(api_app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == _Accepting().post("/x")


def test_logs_json(api_app: typer.Typer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api_cmd, "_client", lambda api: _Accepting())
    result = CliRunner().invoke(api_app, ["logs", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"launch_id": "L1", "lines": ["one", "two"], "next_offset": 8}


def test_keys_revoke_json(api_app: typer.Typer, tmp_path: Path) -> None:
    db = tmp_path / "keys.sqlite3"
    record, _ = KeyStore(db).create("me", None, None)
    result = CliRunner().invoke(api_app, ["keys", "revoke", record.id, "--keys", str(db), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["id"] == record.id and out["revoked"] is not None


# --- recipes show / plan ------------------------------------------------------------------------


@pytest.fixture
def recipes_app(monkeypatch: pytest.MonkeyPatch) -> typer.Typer:
    monkeypatch.setenv("APPLIANCE_RECIPES", str(RECIPES_DIR))
    monkeypatch.setenv("APPLIANCE_HOME", "/var/lib/appliance")
    app = typer.Typer()
    recipes_cmd.register(app)
    return app


@pytest.mark.parametrize("args", [["recipes", "show", "cpu-smolm2"], ["plan", "cpu-smolm2"]])
def test_a_mistyped_recipe_gets_did_you_mean(recipes_app: typer.Typer, args: list[str]) -> None:
    result = CliRunner().invoke(recipes_app, args)
    assert result.exit_code == 2
    assert "(did you mean 'cpu-smollm2'" in result.stderr


def test_recipes_show_omits_unset_fields_unless_all(recipes_app: typer.Typer) -> None:
    short = CliRunner().invoke(recipes_app, ["recipes", "show", "cpu-smollm2"])
    assert short.exit_code == 0, short.output
    assert ": null" not in short.stdout and ": []" not in short.stdout and ": {}" not in short.stdout
    full = CliRunner().invoke(recipes_app, ["recipes", "show", "cpu-smollm2", "--all"])
    assert ": null" in full.stdout
    assert len(short.stdout.splitlines()) < len(full.stdout.splitlines()) - 20
    data = yaml.safe_load(short.stdout)
    assert data["engine"]["max_model_len"] == 2048 and data["engine"]["disable_custom_all_reduce"] is False


def test_recipes_show_says_what_the_rendered_launch_binds(recipes_app: typer.Typer) -> None:
    # The process runtime binds loopback whatever the recipe's engine.host (0.0.0.0 by default).
    data = json.loads(CliRunner().invoke(recipes_app, ["recipes", "show", "cpu-smollm2", "--json"]).stdout)
    assert data["engine"]["host"] == "127.0.0.1"
    assert data["launch"]["binds"] == "127.0.0.1:8000"
    for name in ("cpu-smollm2", "cpu-smollm2-docker"):
        shown = json.loads(CliRunner().invoke(recipes_app, ["recipes", "show", name, "--json"]).stdout)
        render = ["recipes", "render", name, "--json", "--host-root", str(HOSTS / "reference")]
        rendered = json.loads(CliRunner().invoke(recipes_app, render).stdout)
        argv = rendered["argv"]
        assert argv[argv.index("--host") + 1] == shown["engine"]["host"], name
        assert shown["launch"]["binds"] == f"{shown['engine']['host']}:{rendered['port']}", name


# --- issue 36 item 8: the rules, each checked across every command ------------------------------


def _all_commands() -> dict[tuple[str, ...], Any]:
    return dict(_commands(typer.main.get_command(main.app)))


def test_no_help_shows_a_type_beside_a_flag() -> None:
    # `--help <bool>` read as "takes a value"; every flag, --help included, now shows none
    runner = CliRunner()
    for path in [(), *_all_commands()]:
        result = runner.invoke(main.app, [*path, "--help"], terminal_width=200)
        assert result.exit_code == 0, (path, result.output)
        assert "<bool>" not in result.output, (path, result.output)
    # options that take a value keep their type
    assert "<str>" in runner.invoke(main.app, ["logs", "--help"], terminal_width=200).output


# Each command that takes a name or an id, with an unknown one. The API-backed ones get the API's 404.
UNKNOWN: dict[tuple[str, ...], list[str]] = {
    ("plan",): ["nope"],
    ("recipes", "show"): ["nope"],
    ("recipes", "render"): ["nope"],
    ("recipes", "lint"): ["nope"],
    ("recipes", "diff"): ["nope", "cpu-smollm2"],
    ("host", "plan"): ["nope"],
    ("host", "apply"): ["nope"],
    ("keys", "update"): ["0123456789ab", "--rpm", "5"],
    ("keys", "revoke"): ["0123456789ab"],
    ("apply",): ["nope"],
    ("launches",): ["nope"],
    ("logs",): ["--launch", "nope"],
    ("gpu", "reset-done"): ["7"],
    ("choices",): ["nope"],
}
# Arguments that are not a name the appliance keeps: files to read, and compare's two arms, which are
# checked by the controller only after the admin token (its unknown name is apply's 404 above).
NOT_NAMES = {("doctor",), ("compare",)}


class _NotFound:
    base = "http://127.0.0.1:1"
    token = "t"

    def get(self, path: str) -> Any:
        if path == "/status":
            return {"state": "idle", "launch": None}
        if path.startswith("/recipes"):
            return [{"name": "cpu-smollm2"}]
        raise ApiError(404, f"nothing at {path}")

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        raise ApiError(404, f"nothing at {path}")

    def text(self, path: str) -> tuple[str, dict[str, str]]:
        raise ApiError(404, f"nothing at {path}")


def test_every_unknown_name_or_id_exits_2(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from controller.cli import choose_cmd, gpu_cmd

    with_arguments = {p for p, cmd in _all_commands().items()
                      if any(x.param_type_name == "argument" for x in cmd.params)}
    assert with_arguments == set(UNKNOWN) - {("logs",)} | NOT_NAMES, "a new command takes a name: add it here"
    monkeypatch.setenv("APPLIANCE_RECIPES", str(RECIPES_DIR))
    monkeypatch.setenv("APPLIANCE_HOME", str(tmp_path))
    monkeypatch.setattr(api_cmd, "_client", lambda api: _NotFound())
    monkeypatch.setattr(gpu_cmd, "Client", lambda base: _NotFound(), raising=False)
    monkeypatch.setattr(choose_cmd, "Client", lambda base: _NotFound())
    KeyStore(tmp_path / "keys.sqlite3").create("someone", None, None)
    runner = CliRunner()
    for path, args in UNKNOWN.items():
        extra = ["--host-root", str(HOSTS / "reference")] if path[0] == "host" else []
        result = runner.invoke(main.app, [*path, *args, *extra])
        assert result.exit_code == 2, (path, result.output)
        assert "Traceback" not in result.output, path


def test_an_unknown_recipe_gets_the_near_names_not_the_whole_directory(recipes_app: typer.Typer) -> None:
    result = CliRunner().invoke(recipes_app, ["recipes", "show", "cpu-smolm2"])
    assert result.exit_code == 2
    assert "(did you mean 'cpu-smollm2'" in result.stderr
    assert "cuda-generic" not in result.stderr and "known:" not in result.stderr  # no 31-name dump
    assert "`appliance recipes list`" in result.stderr


def test_validation_errors_read_as_words_not_pydantic_json() -> None:
    from controller.api_client import detail_words

    raw = [{"type": "greater_than_equal", "loc": ["query", "limit"], "msg": "Input should be greater than "
            "or equal to 1", "input": "-3", "ctx": {"ge": 1}}]
    assert detail_words(raw) == "limit: Input should be greater than or equal to 1"
    assert detail_words("plain") == "plain"


@pytest.mark.parametrize("args", [["launches", "--limit", "-3"], ["benchmarks", "--limit", "0"],
                                  ["logs", "-n", "-5"]])
def test_a_count_below_its_floor_is_a_usage_error(args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api_cmd, "_client", lambda api: pytest.fail("asked the API"))
    result = CliRunner().invoke(main.app, args)
    assert result.exit_code == 2, result.output
    assert '"loc"' not in result.output and "Traceback" not in result.output


def test_a_refused_connection_says_to_start_the_controller(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        monkeypatch.setenv("APPLIANCE_ADMIN_TOKEN", "t" * 32)
        runner = CliRunner()
        for args in (["status"], ["launches"], ["stop"], ["logs"], ["gpu", "status"],
                     ["keys", "list"]):
            result = runner.invoke(main.app, [*args, "--api", url])
            assert result.exit_code == 1, (args, result.output)
            hint = "is the controller running? `appliance up` starts it"
            assert hint in result.stderr, (args, result.stderr)


def test_recipes_list_has_a_header_the_running_recipe_and_this_hosts_verdict(
    recipes_app: typer.Typer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(recipes_cmd, "_running_recipe", lambda: "cpu-smollm2")
    # The runtimes this host can start are asked of the real daemon/cluster: fixed here, so the verdicts
    # do not depend on whether this machine's Docker daemon is up (kubernetes: no cluster).
    monkeypatch.setattr(recipes_cmd, "_offered_runtimes", lambda: frozenset({"process", "docker"}))
    result = CliRunner().invoke(recipes_app, ["recipes", "list", "--host-root", str(HOSTS / "reference")])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["RECIPE", "PLATFORM", "RUNTIME", "TP", "MODE", "THIS", "HOST"]
    running = [x for x in lines[1:-1] if x.startswith("*")]
    assert len(running) == 1 and running[0].split()[1] == "cpu-smollm2" and lines[-1] == "* running now"
    # The verdict is the last column and may be words ("needs a cluster": a kubernetes recipe here).
    verdict = {x[2:].split()[0]: x[2:].split(maxsplit=5)[-1] for x in lines[1:-1]}
    assert verdict["cpu-smollm2"] == "admit" and "abstract" in verdict.values()
    assert set(verdict.values()) <= {"admit", "warn", "refuse", "abstract", "needs a cluster"}
    rows = json.loads(CliRunner().invoke(recipes_app, ["recipes", "list", "--json", "--host-root",
                                                        str(HOSTS / "reference")]).stdout)
    assert {r["name"]: r["running"] for r in rows}["cpu-smollm2"] is True
    monkeypatch.setattr(recipes_cmd, "_running_recipe", lambda: None)
    idle = CliRunner().invoke(recipes_app, ["recipes", "list", "--host-root", str(HOSTS / "reference")])
    assert not any(x.startswith("*") for x in idle.stdout.splitlines())


def test_benchmarks_headers_carry_units(tmp_path: Path) -> None:
    result = CliRunner().invoke(main.app, ["benchmarks", "--db", str(tmp_path / "e.sqlite3")])
    assert result.exit_code == 0, result.output
    header = result.stdout.splitlines()[0]
    for column in ("score tok/s", "p99 TTFT ms", "p99 TPOT ms", "decode ms"):
        assert column in header, header
