"""`appliance apply NAME --alongside`, `stop --model M`, `restart --model M` and `status` with several
engines, against a scripted controller (the CLI's API client is the seam)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from controller.api_client import ApiError
from controller.cli import api_cmd, lifecycle_cmd

ENGINES = [
    {"engine": "default", "primary": True, "model": "smollm2", "recipe": "cpu-smollm2", "state": "ready",
     "launch_id": "L1", "port": 8000, "ready_s": 36.2, "diagnosis": None},
    {"engine": "smollm2-b", "primary": False, "model": "smollm2-b", "recipe": "cpu-beside",
     "state": "starting", "launch_id": "L2", "port": 8001, "ready_s": None, "diagnosis": None},
]


# Why an engine fits beside the others, as the controller answers it (alongside_admission.judgement).
FITS = ("host RAM: MemAvailable now 9.00 GiB − predicted need 2.10 GiB = 6.90 GiB, ≥ the target 1.00 GiB; "
        "CPU cores beside engine 'smollm2' (recipe cpu-smollm2): cores 1 vs 0: disjoint")

class Controller:
    """Records every call; answers /status from a script of `engines` lists (the last one repeats)."""

    base = "http://127.0.0.1:1"
    token = "t"

    def __init__(self, engines: list[list[dict[str, Any]]] | None = None) -> None:
        self.engines = engines or [ENGINES]
        self.calls: list[tuple[str, dict[str, Any] | None]] = []

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        self.calls.append((path, body))
        model = (body or {}).get("model")
        if path == "/apply":
            model = "smollm2-b" if (body or {}).get("alongside") else None
        return {"accepted": True, "state": "preflight", "recipe": (body or {}).get("recipe", "cpu-beside"),
                "apply_id": 1, "model": model, "admitted": FITS}

    def get(self, path: str) -> Any:
        if path == "/load":
            raise ApiError(404, "Not Found")
        engines = self.engines.pop(0) if len(self.engines) > 1 else self.engines[0]
        return {"state": "ready", "recipe": "cpu-smollm2", "launch": None, "engines": engines}


@pytest.fixture
def app() -> typer.Typer:
    app = typer.Typer()
    api_cmd.register(app)
    return app


def run(app: typer.Typer, monkeypatch: pytest.MonkeyPatch, client: Controller, *args: str) -> Any:
    monkeypatch.setattr(api_cmd, "_client", lambda api: client)
    monkeypatch.setattr("controller.cli.api_cmd.time.sleep", lambda s: None)
    return CliRunner().invoke(app, list(args))


def test_apply_alongside_asks_for_it_and_says_which_model_it_serves(
    app: typer.Typer, monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = Controller()
    result = run(app, monkeypatch, client, "apply", "cpu-beside", "--alongside")
    assert result.exit_code == 0, result.output
    assert client.calls == [("/apply", {"recipe": "cpu-beside", "fresh_cache": False, "force": False,
                                        "alongside": True})]
    assert "accepted: cpu-beside beside the running engines, as model 'smollm2-b'" in result.output
    assert f"fits:     {FITS}" in result.output  # why it fits beside them, with the numbers
    # A plain apply does not send the field (an older controller refuses unknown ones).
    client = Controller()
    run(app, monkeypatch, client, "apply", "cpu-smollm2")
    assert "alongside" not in (client.calls[0][1] or {})


def test_apply_alongside_follow_ends_when_that_engine_is_ready_or_failed(
    app: typer.Typer, monkeypatch: pytest.MonkeyPatch,
) -> None:
    ready = [dict(ENGINES[0]), {**ENGINES[1], "state": "ready", "ready_s": 40.0}]
    result = run(app, monkeypatch, Controller([ENGINES, ready]), "apply", "cpu-beside", "--alongside", "-f")
    assert result.exit_code == 0, result.output
    assert "smollm2-b: starting" in result.output
    assert "ready: smollm2-b (cpu-beside, port 8001, in 40.0 s)" in result.output
    failed = [dict(ENGINES[0]), {**ENGINES[1], "state": "failed", "diagnosis": "port 8001 in use"}]
    result = run(app, monkeypatch, Controller([ENGINES, failed]), "apply", "cpu-beside", "--alongside", "-f")
    assert result.exit_code == 1 and "smollm2-b failed: port 8001 in use" in result.output


def test_stop_and_restart_name_the_model_and_leave_it_out_without_one(
    app: typer.Typer, monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = Controller()
    assert run(app, monkeypatch, client, "stop", "--model", "smollm2-b").exit_code == 0
    assert run(app, monkeypatch, client, "restart", "--model", "smollm2-b").exit_code == 0
    assert run(app, monkeypatch, client, "stop").exit_code == 0
    assert run(app, monkeypatch, client, "restart").exit_code == 0
    assert client.calls == [("/stop", {"model": "smollm2-b"}), ("/restart", {"model": "smollm2-b"}),
                            ("/stop", None), ("/restart", None)]
    result = run(app, monkeypatch, client, "stop", "--model", "smollm2-b", "--json")
    assert json.loads(result.output)["model"] == "smollm2-b"


def test_status_lists_every_engine_when_there_is_more_than_one(
    app: typer.Typer, monkeypatch: pytest.MonkeyPatch,
) -> None:
    result = run(app, monkeypatch, Controller(), "status")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[:3] == [
        "engines:    2",
        "  smollm2: ready  (recipe cpu-smollm2, port 8000, ready in 36.2 s, primary)",
        "  smollm2-b: starting  (recipe cpu-beside, port 8001)",
    ]
    # A primary that failed before it launched anything has no model: it is named by its engine slot.
    failed = {**ENGINES[0], "model": None, "state": "failed", "port": None, "ready_s": None,
              "diagnosis": "no launchable recipe"}
    result = run(app, monkeypatch, Controller([[failed, ENGINES[1]]]), "status")
    line = "  default: failed  (recipe cpu-smollm2, port None, primary) — no launchable recipe"
    assert line in result.output
    one = run(app, monkeypatch, Controller([[ENGINES[0]]]), "status")
    assert "engines:" not in one.output and one.output.startswith("state:")


def test_down_stops_the_engines_beside_the_primary_too() -> None:
    # `appliance down` stops through the API; an engine beside the primary left running would outlive
    # the controller (it stops only what `/stop` without a model names: the primary).
    client = Controller()
    lifecycle_cmd.stop_every_engine(client)
    assert client.calls == [("/stop", None), ("/stop", {"model": "smollm2-b"})]
    assert not lifecycle_cmd.every_engine_stopped({"state": "idle", "engines": ENGINES[1:]})
    assert not lifecycle_cmd.every_engine_stopped({"state": "ready", "engines": ENGINES[:1]})
    assert lifecycle_cmd.every_engine_stopped({"state": "idle", "engines": []})
