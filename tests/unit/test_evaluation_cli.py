"""`appliance bench | compare | fingerprint`: refusals are clear, exit 2, and store nothing."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from controller.cli.main import _register, app
from controller.evaluation.store import EvalStore

_register()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when the block ends: nothing listens there


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("APPLIANCE_HOME", str(tmp_path))
    monkeypatch.delenv("APPLIANCE_ADMIN_TOKEN", raising=False)
    return tmp_path


def _stored(home: Path) -> list[dict[str, object]]:
    return EvalStore(home / "appliance.sqlite3").benchmarks()


def test_bench_without_a_reachable_controller_is_refused(env: Path) -> None:
    r = CliRunner().invoke(app, ["bench", "--api", f"http://127.0.0.1:{_closed_port()}"])
    assert r.exit_code == 2
    assert "cannot reach the controller" in r.output and "--engine-url" in r.output
    assert _stored(env) == []


def test_bench_of_an_engine_that_does_not_answer_is_refused_and_stores_nothing(env: Path) -> None:
    r = CliRunner().invoke(app, ["bench", "--engine-url", f"http://127.0.0.1:{_closed_port()}"])
    assert r.exit_code == 2
    assert "EngineNotReady" in r.output and "nothing stored" in r.output
    assert _stored(env) == []


def test_fewer_than_the_first_five_requests_is_refused(env: Path) -> None:
    r = CliRunner().invoke(app, ["bench", "--requests", "3", "--engine-url", "http://127.0.0.1:1"])
    assert r.exit_code == 2 and "first 5" in r.output


def test_compare_needs_the_admin_token(env: Path) -> None:
    r = CliRunner().invoke(app, ["compare", "a", "b", "--api", f"http://127.0.0.1:{_closed_port()}"])
    assert r.exit_code == 2 and "APPLIANCE_ADMIN_TOKEN" in r.output
