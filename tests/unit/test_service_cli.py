"""The pieces of `appliance up/down`: the start display, PID-file daemons, the admin token."""

from __future__ import annotations

import http.server
import json
import sys
import threading
from pathlib import Path

import pytest
import typer

from controller import admin_token
from controller.api_client import Client
from controller.cli import api_cmd, lifecycle_cmd
from controller.cli.startup_display import StartView
from controller.daemons import Daemon


def test_the_start_view_ends_on_ready_failed_or_a_stop() -> None:
    lines: list[str] = []
    view = StartView(lines.append)
    view.status({"state": "idle"})
    assert view.outcome is None  # idle before anything started is not the end
    view.event("state", {"state": "preflight"}, None)
    status = {"state": "starting", "progress": 0.25, "launch": {"ready_budget_s": 600, "describe": "x"}}
    view.event("phase", {"label": "weights loaded", "describe": "weights loaded · cache unknown"}, status)
    assert "25% of 600 s" in lines[-1] and "weights loaded" in lines[-1]
    view.event("state", {"state": "backoff"}, None)
    assert view.outcome is None
    view.event("state", {"state": "ready"}, None)
    assert view.outcome == "ready"
    failed = StartView(lines.append)
    failed.status({"state": "failed"})
    assert failed.outcome == "failed"
    stopped = StartView(lines.append)
    stopped.event("state", {"state": "starting"}, None)
    stopped.event("state", {"state": "idle"}, None)
    assert stopped.outcome == "idle"


def test_a_daemon_is_started_found_again_and_stopped_by_pid(tmp_path: Path) -> None:
    d = Daemon("sleeper", tmp_path / "run", tmp_path / "logs")
    assert d.process() is None
    proc = d.start([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"], {})
    again = Daemon("sleeper", tmp_path / "run", tmp_path / "logs").process()
    assert again is not None and again.pid == proc.pid
    assert d.stop(grace_s=10)
    assert not proc.is_running() or proc.status() == "zombie"
    assert d.process() is None and not d.pid_file.exists()
    assert d.stop() is False


def test_a_pid_file_pointing_at_someone_elses_process_is_not_ours(tmp_path: Path) -> None:
    import json
    import os

    d = Daemon("controller", tmp_path / "run", tmp_path / "logs")
    d.run_dir.mkdir(parents=True)
    # Our own PID, but with another command line and start time: a reused PID.
    fake = {"pid": os.getpid(), "create_time": 1.0, "argv": ["appliance", "serve"]}
    d.pid_file.write_text(json.dumps(fake))
    assert d.process() is None
    assert d.stop() is False  # and nothing was signalled


@pytest.mark.parametrize("text", ["4242\n", "[4242]", "null", '"4242"'])
def test_a_pid_file_without_an_identity_is_not_ours_and_down_does_not_crash(
    tmp_path: Path, text: str,
) -> None:
    """`appliance down` once crashed (TypeError) on a pid file holding a bare number."""
    d = Daemon("controller", tmp_path / "run", tmp_path / "logs")
    d.run_dir.mkdir(parents=True)
    d.pid_file.write_text(text)
    assert d.process() is None
    assert d.stop() is False  # nothing was signalled: a bare PID proves nothing about whose it is


def test_up_creates_a_token_once_and_stores_only_its_hash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv(admin_token.HASH_ENV, raising=False)
    monkeypatch.delenv(admin_token.TOKEN_ENV, raising=False)
    token = lifecycle_cmd._ensure_token(tmp_path)
    assert token is not None
    out = capsys.readouterr().out
    assert token in out
    stored = admin_token.hash_file(tmp_path).read_text()
    assert token not in stored and admin_token.matches(token, stored.strip())
    assert oct(admin_token.hash_file(tmp_path).stat().st_mode & 0o777) == "0o600"
    # Second run: not shown again; known only if the operator exported it.
    assert lifecycle_cmd._ensure_token(tmp_path) is None
    assert token not in capsys.readouterr().out
    monkeypatch.setenv(admin_token.TOKEN_ENV, token)
    assert lifecycle_cmd._ensure_token(tmp_path) == token
    monkeypatch.setenv(admin_token.TOKEN_ENV, "wrong")
    assert lifecycle_cmd._ensure_token(tmp_path) is None


def test_a_malformed_configured_hash_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(admin_token.HASH_ENV, "not-a-hash")
    with pytest.raises(typer.Exit):
        lifecycle_cmd._ensure_token(tmp_path)


def test_a_fresh_daemon_whose_cmdline_reads_empty_is_still_ours(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: right after exec /proc/PID/cmdline can read empty (5 of 30 starts under load);
    PID + create time identify the process, so `up` must not start a second one."""
    import psutil

    d = Daemon("sleeper", tmp_path / "run", tmp_path / "logs")
    proc = d.start([sys.executable, "-c", "import time; time.sleep(60)"], {})
    try:
        monkeypatch.setattr(psutil.Process, "cmdline", lambda self: [])
        again = d.process()
        assert again is not None and again.pid == proc.pid
    finally:
        monkeypatch.undo()
        assert d.stop(grace_s=10)


def test_a_controller_whose_supervision_stalled_is_still_alive_for_up_and_down() -> None:
    # GET /healthz answers 503 when the supervision loop stalls; `up` read any error as "no
    # controller here" and would have started a second one on the same port.
    class Stalled(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"ok": false, "state": "ready", "problem": "the supervision loop last came round"}'
            self.send_response(503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Stalled)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert Client(f"http://127.0.0.1:{server.server_port}", timeout_s=5).alive()
    finally:
        server.shutdown()
        server.server_close()
    # Nothing listening: not alive.
    assert not Client(f"http://127.0.0.1:{server.server_port}", timeout_s=5).alive()


def test_the_clients_header_names_are_case_insensitive_so_logs_follow_advances(tmp_path: Path) -> None:
    """uvicorn sends `x-next-offset`; the client looked up `X-Next-Offset`."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from controller.api_client import Client

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            assert self.headers["Authorization"] == "Bearer adm_t"  # the log is admin-only
            body = b"line\n"
            self.send_response(200)
            self.send_header("x-next-offset", "5")  # as uvicorn writes it
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = Client(f"http://127.0.0.1:{server.server_address[1]}", token="adm_t")
        text, headers = client.text("/launches/L1/log?offset=0")
        assert text == "line\n" and headers["x-next-offset"] == "5"
    finally:
        server.shutdown()
        server.server_close()


def test_the_printed_curl_works_as_pasted(tmp_path: Path) -> None:
    """`$KEY` once sat inside single quotes, so the pasted command sent it literally."""
    import subprocess

    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "it's here?"}]})
    lines = lifecycle_cmd.try_it_lines("http://127.0.0.1:8080", "$KEY", body)
    command = "\n".join(line.strip() for line in lines).replace("curl -s", "printf '%s\\n'", 1)
    out = subprocess.run(["bash", "-c", command], env={"KEY": "sk-app-xyz", "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert "Authorization: Bearer sk-app-xyz" in out and body in out


# ---- issue 23 item 12: `up --port` is remembered; every command of this home finds it ----------


class _FakeController:
    """A controller API on a free port answering /healthz and /status (a ready engine)."""

    def __init__(self) -> None:
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status = {"state": "ready", "recipe": "cpu-smollm2", "launch": None, "failures": 0}
                body = json.dumps({"ok": True} if self.path == "/healthz" else status).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_up_remembers_its_port_and_status_finds_it_without_appliance_api(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from controller.api_client import API_ENV, DEFAULT_API, api_url, remembered_api

    app = typer.Typer()
    lifecycle_cmd.register(app)
    api_cmd.register(app)
    monkeypatch.setenv("APPLIANCE_HOME", str(tmp_path))
    monkeypatch.delenv(API_ENV, raising=False)
    monkeypatch.delenv(admin_token.HASH_ENV, raising=False)
    monkeypatch.delenv(admin_token.TOKEN_ENV, raising=False)
    monkeypatch.setattr(lifecycle_cmd, "_ensure_engine", lambda recipe: None)
    assert api_url() == DEFAULT_API  # nothing remembered yet
    fake = _FakeController()  # a controller already answering on the port `up --port` names
    try:
        runner = CliRunner()
        up = runner.invoke(app, ["up", "--port", str(fake.port), "--no-gateway", "--no-follow"])
        assert up.exit_code == 0, up.output
        url = f"http://127.0.0.1:{fake.port}"
        assert f"export {API_ENV}={url}" in up.output
        assert remembered_api(tmp_path) == url
        assert api_url() == url and api_url("http://x:1") == "http://x:1"
        status = runner.invoke(app, ["status"])  # no --api, no $APPLIANCE_API
        assert status.exit_code == 0, status.output
        assert "state:      ready" in status.output
        monkeypatch.setenv(API_ENV, "http://127.0.0.1:1")  # the variable still wins
        assert api_url() == "http://127.0.0.1:1"
        monkeypatch.delenv(API_ENV)
        down = runner.invoke(app, ["down", "--keep-engine"])
        assert down.exit_code == 0, down.output
        assert remembered_api(tmp_path) is None and api_url() == DEFAULT_API
    finally:
        fake.close()


@pytest.mark.parametrize(
    ("extra", "control_port"), [((), 18081), (("--gateway-control-port", "19999"), 19999)]
)
def test_up_points_the_controller_at_the_gateways_control_listener(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: tuple[str, ...], control_port: int) -> None:
    """`up` starts the gateway with a control listener on 127.0.0.1 (the gateway port + 1 unless
    given) and hands the controller that address as its `--gateway-url`: its admin calls never
    meet the client port's per-address cap. Before: `--gateway-url` was the client port."""
    import psutil
    from typer.testing import CliRunner

    started: dict[str, list[str]] = {}
    asked: list[int] = []

    def fake_start(self: Daemon, argv: list[str], env: dict[str, str]) -> psutil.Process:
        started[self.name] = argv
        return psutil.Process()

    def gateway_alive(port: int) -> bool:
        asked.append(port)
        return True

    monkeypatch.setenv("APPLIANCE_HOME", str(tmp_path))
    monkeypatch.delenv(admin_token.HASH_ENV, raising=False)
    monkeypatch.delenv(admin_token.TOKEN_ENV, raising=False)
    monkeypatch.setattr(Daemon, "start", fake_start)
    monkeypatch.setattr(Daemon, "process", lambda self: None)
    monkeypatch.setattr(Client, "alive", lambda self: "controller" in started)
    monkeypatch.setattr(lifecycle_cmd, "_gateway_alive", gateway_alive)
    monkeypatch.setattr(lifecycle_cmd, "_ensure_engine", lambda recipe: None)
    monkeypatch.setattr(lifecycle_cmd, "_print_where", lambda *args: None)
    app = typer.Typer()
    lifecycle_cmd.register(app)
    api_cmd.register(app)
    up = CliRunner().invoke(app, ["up", "--port", "18090", "--gateway-port", "18080", "--no-follow", *extra])
    assert up.exit_code == 0, up.output
    gateway, controller = started["gateway"], started["controller"]
    assert gateway[gateway.index("--listen") + 1] == "0.0.0.0:18080"
    assert gateway[gateway.index("--control-listen") + 1] == f"127.0.0.1:{control_port}"
    assert controller[controller.index("--gateway-url") + 1] == f"http://127.0.0.1:{control_port}"
    assert set(asked) == {18080, control_port}  # `up` waits for both listeners
