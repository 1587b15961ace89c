"""Engine logs a reader can read (issue 36 item 5): the HTTP access lines hidden unless asked,
`--since`, `--grep`, `--tail` as `-n`, and a negative count refused (it used to print nothing, exit 0)."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from appliance.observe.log_filter import LineFollower, LogFilter, SinceError, is_access_line, parse_since
from controller.cli import api_cmd

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "engine_logs"
NOW = datetime(2026, 12, 1, 10, 40, 0)

# What an engine log looks like once Prometheus scrapes it: vLLM's stamped lines among access lines.
LOG = """\
Triton is installed, but doesn't include CPU backend. Disabling Triton.
(APIServer pid=686) INFO 12-01 10:34:51 [api_server.py:677] Starting vLLM server on http://127.0.0.1:8000
INFO:     127.0.0.1:44874 - "GET /health HTTP/1.1" 200 OK
(APIServer pid=686) INFO:     127.0.0.1:33808 - "GET /metrics HTTP/1.1" 200 OK
INFO:     Application startup complete.
(APIServer pid=686) INFO 12-01 10:38:02 [loggers.py:123] Engine 000: Avg prompt throughput: 1.0 tokens/s
INFO:     [::1]:50412 - "POST /v1/chat/completions HTTP/1.1" 200 OK
(APIServer pid=686) WARNING 12-01 10:39:30 [api_server.py:1] a warning
  continued on the next line
"""


def test_access_lines_are_uvicorns_request_lines_and_nothing_else() -> None:
    access = [x for x in LOG.splitlines() if is_access_line(x)]
    assert access == [LOG.splitlines()[i] for i in (2, 3, 6)]
    # every access line in the recorded logs (the CPU and the H200 runs) is one, every vLLM line is not
    logs = sorted(FIXTURES.rglob("*.log"))
    recorded = [x for f in logs for x in f.read_text(errors="replace").splitlines()]
    found = [x for x in recorded if is_access_line(x)]
    assert any("GET /metrics HTTP/1.1" in x for x in found) and any("GET /health" in x for x in found)
    assert all('HTTP/1.1" ' in x for x in found)
    assert not any(re.search(r" \d\d-\d\d \d\d:\d\d:\d\d \[", x) for x in found)


def test_the_default_filter_hides_access_lines_and_access_true_keeps_them() -> None:
    lines = LOG.splitlines()
    hidden = LogFilter().lines(lines)
    assert len(hidden) == len(lines) - 3 and not any(" - \"GET " in x for x in hidden)
    assert LogFilter(access=True).lines(lines) == lines


def test_grep_and_since() -> None:
    lines = LOG.splitlines()
    assert LogFilter(grep=re.compile("WARNING|throughput")).lines(lines) == [lines[5], lines[7]]
    since = LogFilter(since=parse_since("3m", NOW)).lines(lines)  # 10:37:00: the last two stamps
    assert since == [lines[5], lines[7], lines[8]]  # the continuation goes with its stamped line
    # before the first stamp: the lines ahead of it go with it
    assert LogFilter(since=parse_since("10:30", NOW)).lines(lines) == LogFilter().lines(lines)
    assert LogFilter(since=parse_since("12-01 10:39:30", NOW)).lines(lines) == lines[7:]
    assert LogFilter(since=parse_since("1d", NOW)).lines(["no stamp at all"]) == ["no stamp at all"]


def test_since_across_the_new_year() -> None:
    # stamps have no year: a December line read in January is last year's
    f = LogFilter(since=parse_since("2d", datetime(2027, 1, 1, 0, 30)))
    assert f.lines(["INFO 12-31 23:00:00 [x] old year", "INFO 12-29 23:00:00 [x] too old"]) == [
        "INFO 12-31 23:00:00 [x] old year"]


@pytest.mark.parametrize("bad", ["yesterday", "10", "-5m", "25:00", "13-01 10:00"])
def test_a_since_that_is_not_a_time_is_refused_in_words(bad: str) -> None:
    with pytest.raises(SinceError, match="duration"):
        parse_since(bad, NOW)


def test_the_follower_filters_whole_lines_across_chunks() -> None:
    follower = LineFollower(LogFilter())
    assert follower.feed('INFO:     127.0.0.1:1 - "GET /met') == []
    assert follower.feed('rics HTTP/1.1" 200 OK\n(APIServer pid=1) INFO 12-01 10:00:00 [x] kept\npart') == [
        "(APIServer pid=1) INFO 12-01 10:00:00 [x] kept"]
    assert follower.feed("ial\n") == ["partial"]


# --- `appliance logs` ------------------------------------------------------------------------------


class _LogClient:
    base = "http://127.0.0.1:1"
    token = "t"

    def get(self, path: str) -> Any:
        return {"state": "ready", "launch": {"id": "L1"}} if path == "/status" else []

    def text(self, path: str) -> tuple[str, dict[str, str]]:
        offset = int(path.rsplit("=", 1)[1])
        end = str(len(LOG.encode()))
        return (LOG, {"x-next-offset": end}) if offset == 0 else ("", {"x-next-offset": end})


@pytest.fixture
def logs_app(monkeypatch: pytest.MonkeyPatch) -> typer.Typer:
    monkeypatch.setattr(api_cmd, "_client", lambda api: _LogClient())
    app = typer.Typer()
    api_cmd.register(app)
    return app


def _logs(app: typer.Typer, *args: str) -> Any:
    return CliRunner().invoke(app, ["logs", *args])


def test_logs_hides_access_lines_unless_access(logs_app: typer.Typer) -> None:
    plain = _logs(logs_app)
    assert plain.exit_code == 0, plain.output
    assert "GET /metrics" not in plain.stdout and "GET /health" not in plain.stdout
    assert "Starting vLLM server" in plain.stdout
    full = _logs(logs_app, "--access")
    assert full.stdout.splitlines() == LOG.splitlines()


def test_logs_tail_is_n_and_grep_filters_before_the_tail(logs_app: typer.Typer) -> None:
    assert _logs(logs_app, "--tail", "2").stdout == _logs(logs_app, "-n", "2").stdout
    assert _logs(logs_app, "--tail", "2").stdout.splitlines() == LOG.splitlines()[-2:]
    out = _logs(logs_app, "--grep", "INFO 12-01", "-n", "1", "--json")
    assert json.loads(out.stdout)["lines"] == [LOG.splitlines()[5]]


@pytest.mark.parametrize("args", [["-n", "-5"], ["--tail", "-1"], ["--since", "soon"], ["--grep", "("]])
def test_logs_refuses_bad_options_with_exit_2(logs_app: typer.Typer, args: list[str]) -> None:
    result = _logs(logs_app, *args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
