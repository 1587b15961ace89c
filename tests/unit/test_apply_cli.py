"""`appliance apply | up | down` against a scripted controller (the CLI's API client is the seam):
what a refused, an unchanged and a started apply print and return; the parse-friendly answer line
of `up`; the key hint `up` prints; `down` leaves no gateway token behind."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from controller import admin_token
from controller.api_client import ApiError
from controller.cli import api_cmd, keys_cmd, lifecycle_cmd

REFUSAL = {"code": "admission_refused", "summary": "predicted peak 80 GiB > RAM + swap 40 GiB",
           "hint": "use a smaller recipe", "retryable": False}


class ScriptedClient:
    """Answers POST /apply with an apply id and GET /status from a script (last one repeats)."""

    base = "http://127.0.0.1:1"
    token = "t"

    def __init__(self, statuses: list[dict[str, Any]]) -> None:
        self.statuses = statuses
        self.posted: list[dict[str, Any] | None] = []

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        self.posted.append(body)
        return {"accepted": True, "state": "preflight", "recipe": (body or {}).get("recipe"), "apply_id": 7}

    def get(self, path: str) -> Any:
        if path == "/load":  # a controller older than the load sampler: status shows no load lines
            raise ApiError(404, "Not Found")
        assert path == "/status"
        return self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]


def status(state: str, recipe: str, outcome: str, failure: dict[str, Any] | None = None,
           token: int = 7) -> dict[str, Any]:
    return {"state": state, "recipe": recipe, "launch": {"engine_url": "http://127.0.0.1:8000"},
            "last_apply": {"token": token, "recipe": "big", "outcome": outcome, "failure": failure}}


@pytest.fixture
def app() -> typer.Typer:
    app = typer.Typer()
    lifecycle_cmd.register(app)
    api_cmd.register(app)
    keys_cmd.register(app)
    return app


def run(app: typer.Typer, monkeypatch: pytest.MonkeyPatch, client: ScriptedClient, *args: str) -> Any:
    monkeypatch.setattr(api_cmd, "_client", lambda api: client)
    follow = pytest.fail  # a refused or unchanged apply must not follow anything
    monkeypatch.setattr(api_cmd, "follow_outcome", lambda c, timeout_s=None: follow("followed"))
    return CliRunner().invoke(app, list(args))


def test_a_refused_apply_prints_the_refusal_and_exits_non_zero(
    app: typer.Typer, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = ScriptedClient([status("preflight", "big", "pending"),
                             status("ready", "cpu-smollm2", "refused", REFUSAL)])
    result = run(app, monkeypatch, client, "apply", "big", "--follow")
    assert result.exit_code == 1, result.output
    assert "REFUSED: big: predicted peak 80 GiB" in result.output and "use a smaller recipe" in result.output
    assert "keeps serving cpu-smollm2" in result.output
    assert "ready:" not in result.output


def test_an_apply_of_the_running_launch_is_a_no_op_that_says_so(
    app: typer.Typer, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = ScriptedClient([status("ready", "big", "unchanged")])
    result = run(app, monkeypatch, client, "apply", "big", "--follow")
    assert result.exit_code == 0, result.output
    assert "unchanged: big is already running" in result.output and "--force" in result.output
    assert client.posted[-1] == {"recipe": "big", "fresh_cache": False, "force": False}
    run(app, monkeypatch, ScriptedClient([status("ready", "big", "unchanged")]), "apply", "big", "--force")


def test_a_follow_that_ends_ready_on_another_recipe_is_not_success(monkeypatch: pytest.MonkeyPatch) -> None:
    """The race the verdict wait cannot see (another apply superseded ours): still never "ready: X"."""
    client = ScriptedClient([status("ready", "cpu-smollm2", "refused", REFUSAL)])
    with pytest.raises(typer.Exit) as exc:
        api_cmd.end_of_follow(client, "ready", "big")  # type: ignore[arg-type]
    assert exc.value.exit_code == 1



def test_a_blue_green_start_that_failed_beside_the_serving_engine_says_failed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    failure = {"summary": "the engine exited with code 1", "hint": "see the log tail"}
    client = ScriptedClient([status("ready", "cpu-smollm2", "failed", failure)])
    with pytest.raises(typer.Exit) as exc:
        api_cmd.end_of_follow(client, "ready", "big")  # type: ignore[arg-type]
    assert exc.value.exit_code == 1
    err = capsys.readouterr().err
    assert "FAILED: big: the engine exited with code 1" in err and "keeps serving cpu-smollm2" in err


def test_no_blue_green_asks_for_the_hold_path(app: typer.Typer, monkeypatch: pytest.MonkeyPatch) -> None:
    client = ScriptedClient([status("ready", "big", "unchanged")])
    run(app, monkeypatch, client, "apply", "big", "--no-blue-green")
    assert client.posted[-1] == {"recipe": "big", "fresh_cache": False, "force": False, "blue_green": False}

def test_up_prints_the_answer_as_json_and_the_key_hint_that_works(
    app: typer.Typer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ready = {"state": "ready", "recipe": "r", "launch": {"engine_url": "http://e", "served_model_name": "m"}}
    client = ScriptedClient([ready])
    answer = {"status": 200, "answer": "L'Étoile, \"la Marseillaise\"\nParis", "completion_tokens": 9}
    monkeypatch.setattr(lifecycle_cmd, "_gateway_completion", lambda url, key, body: answer)
    monkeypatch.setattr(lifecycle_cmd, "_first_key_once", lambda c: "k")
    lifecycle_cmd._print_where(client, "http://gw", None)  # type: ignore[arg-type]
    line = next(x for x in capsys.readouterr().out.splitlines() if "through the gateway:" in x)
    assert json.loads(line.split("through the gateway:", 1)[1]) == answer

    monkeypatch.setattr(lifecycle_cmd, "_first_key_once", lambda c: None)
    lifecycle_cmd._print_where(client, "http://gw", None)  # type: ignore[arg-type]
    hint = next(x for x in capsys.readouterr().out.splitlines() if "keys create" in x)
    suggested = hint.split("`")[1].split()  # appliance keys create --name NAME
    assert suggested[:3] == ["appliance", "keys", "create"]
    result = CliRunner().invoke(app, [*suggested[1:], "--keys", str(tmp_path / "keys.db")])
    assert result.exit_code == 0, result.output  # the command as suggested is accepted


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("APPLIANCE_HOME", str(tmp_path))
    monkeypatch.delenv(admin_token.TOKEN_ENV, raising=False)
    yield tmp_path


def test_down_removes_the_gateway_control_token(home: Path) -> None:
    admin_token.write_gateway_token(home / "run")
    token_file = home / "run" / admin_token.GATEWAY_TOKEN_FILE
    assert token_file.exists()
    lifecycle_cmd.down(keep_engine=False, grace=1.0)
    assert not token_file.exists()


def test_status_says_the_engine_exited_and_is_out_of_the_gateway(
    app: typer.Typer, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = {"state": "exited", "recipe": "r", "failures": 0, "max_failures": 5, "backoff_remaining_s": None,
         "last_diagnosis": None, "progress": None, "last_apply": None,
         "launch": {"id": "L1", "kind": "normal", "runtime": "process", "ref": "1", "engine_url": "http://e",
                    "served_model_name": "m", "ready_s": 3.0, "cache": "hit", "phases": [],
                    "exit": {"exit_code": 137, "signal": 9, "oom_killed": None}}}
    result = run(app, monkeypatch, ScriptedClient([s]), "status")
    assert result.exit_code == 0, result.output
    assert "state:      exited" in result.output
    assert "exit code 137, signal 9; out of the gateway" in result.output



def test_status_names_the_other_engine_of_a_blue_green_switch(
    app: typer.Typer, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = {**_starting(None), "blue_green": {"old_launch_id": "L1", "old_recipe": "cpu-smollm2",
                                           "old_url": "http://127.0.0.1:8000", "old": "serving"}}
    result = run(app, monkeypatch, ScriptedClient([s]), "status")
    assert result.exit_code == 0, result.output
    assert "blue/green: cpu-smollm2 (L1, http://127.0.0.1:8000) serves while this one starts" in result.output

ETA = {
    "start": "warm", "basis": "spec", "launches": 3, "median_s": 38.0, "min_s": 37.0, "max_s": 40.0,
    "elapsed_s": 105.0, "remaining_s": -67.0, "budget_s": 600,
    "text": "past the usual ready time of ~38 s by 67 s (warm; 37–40 s over 3 launches)",
    "phases": [
        {"phase": "weights_loading", "label": "loading weights", "status": "done", "took_s": 8.0,
         "usual_s": 8.0, "samples": 3},
        {"phase": "compile_started", "label": "torch.compile", "status": "current", "took_s": 95.0,
         "usual_s": 18.0, "samples": 3},
        {"phase": "kv_cache", "label": "KV cache sized", "status": "pending", "took_s": None, "usual_s": 7.0,
         "samples": 3},
        {"phase": "api_up", "label": "API up", "status": "pending", "took_s": None, "usual_s": None,
         "samples": 0},
    ],
    "stall": {"phase": "compile_started", "label": "torch.compile", "took_s": 95.0, "usual_s": 18.0,
              "text": "likely stalled: torch.compile 95 s, usually 18 s"},
}


def _starting(eta: dict[str, Any] | None) -> dict[str, Any]:
    return {"state": "starting", "recipe": "r", "failures": 0, "max_failures": 5, "backoff_remaining_s": None,
            "last_diagnosis": None, "progress": 0.175, "last_apply": None, "eta": eta,
            "launch": {"id": "L2", "kind": "normal", "runtime": "process", "ref": "1", "engine_url": "http://e",
                       "served_model_name": "m", "ready_s": None, "elapsed_s": 105.0, "ready_budget_s": 600,
                       "describe": "torch.compile", "cache": None,
                       "phases": [{"phase": "weights_loading", "label": "loading weights", "at": 1.0}]}}


def test_status_shows_the_eta_each_phase_against_its_history_and_a_likely_stall(
    app: typer.Typer, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run(app, monkeypatch, ScriptedClient([_starting(ETA)]), "status")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "expected:   past the usual ready time of ~38 s by 67 s (warm; 37–40 s over 3 launches)" in lines
    assert ("WARNING:    likely stalled: torch.compile 95 s, usually 18 s (a flag: the stall watch and the "
            "ready budget still decide)") in lines
    assert "  [x] loading weights              8 s  (usually 8 s)" in lines
    assert "  [>] torch.compile        95 s so far  (usually 18 s)" in lines
    assert "  [ ] KV cache sized                    (usually 7 s)" in lines
    assert "  [ ] API up" in lines
    # without history
    none = dict(ETA, text="no earlier launches of this variant: expected within the ready budget of 600 s",
                stall=None, phases=[])
    result = run(app, monkeypatch, ScriptedClient([_starting(none)]), "status")
    assert ("expected:   no earlier launches of this variant: expected within the ready budget of 600 s"
            in result.output.splitlines())
    # an older controller (no `eta`): the plain phase list
    result = run(app, monkeypatch, ScriptedClient([_starting(None)]), "status")
    assert "expected:" not in result.output and "  [x] loading weights" in result.output.splitlines()


def test_follow_lines_carry_the_eta_the_usual_phase_time_and_the_stall_flag() -> None:
    from controller.cli.startup_display import StartView

    lines: list[str] = []
    view = StartView(lines.append)
    view.status(_starting(ETA), heartbeat=True)
    assert lines[-1].endswith("starting: torch.compile · past the usual ready time of ~38 s by 67 s (warm; "
                              "37–40 s over 3 launches) · LIKELY STALLED: TORCH.COMPILE 95 S, USUALLY 18 S")
    view.event("phase", {"phase": "compile_started", "label": "torch.compile"}, _starting(ETA))
    assert lines[-1].endswith("torch.compile (usually ~18 s)")
    view.event("event", {"kind": "likely-stalled", "message": "torch.compile 95 s, usually 18 s"}, None)
    assert lines[-1].endswith("likely-stalled: torch.compile 95 s, usually 18 s")


def test_status_shows_the_failed_launch_s_log_tail(app: typer.Typer, monkeypatch: pytest.MonkeyPatch) -> None:
    s = {"state": "failed", "recipe": "r", "failures": 5, "max_failures": 5, "backoff_remaining_s": None,
         "last_diagnosis": {"code": "model_path_invalid", "summary": "the model path '/models/nope' is not",
                            "hint": "check model.path", "launch_id": "L1"},
         "failed_log_tail": ["INFO starting", "OSError: Repo id must be in the form 'repo_name'"],
         "progress": None, "last_apply": None, "launch": None}
    result = run(app, monkeypatch, ScriptedClient([s]), "status")
    assert result.exit_code == 0, result.output
    assert "log tail (2 lines of the failed launch):" in result.output
    assert "  | OSError: Repo id must be in the form 'repo_name'" in result.output


@pytest.mark.parametrize("gateway_url", ["http://gw", None])
def test_up_prints_the_console_url_with_or_without_a_gateway(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], gateway_url: str | None
) -> None:
    ready = {"state": "ready", "recipe": "r", "launch": {"engine_url": "http://e", "served_model_name": "m"}}
    client = ScriptedClient([ready])
    monkeypatch.setattr(lifecycle_cmd, "_first_key_once", lambda c: None)
    lifecycle_cmd._print_where(client, gateway_url, None)  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert f"{client.base}/console" in out and out.count("/console") == 1
