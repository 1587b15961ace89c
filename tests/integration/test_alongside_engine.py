"""Two REAL CPU engines on one host behind one gateway (controller/supervisor/engine_set.py): the
bundled model under two served names, the second recipe's worker bound to the last core (disjoint
from the first's, `beside_cores`), each engine on its own free port. Apply A, apply B alongside: both
answer through the gateway by their model names (and an unknown name is a 404); a controller restart
adopts both, each by its own driver, without restarting either; stop --model B leaves A serving and
B's name answers 404. Waits are liveness bounds, never speed assertions.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from bench.hold_bench import GatewayProcess, beside_cores, beside_interpreter, engine_pid, gateway_process
from tests.integration.controller_harness import (
    ENGINE,
    START_LIVENESS_S,
    Controller,
    engine_recipe,
    free_port,
    recipe_dirs,
    require_engine,
    serving,
)

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(2400)]
A = "itest-along-a"
B = "itest-along-b"
B_MODEL = "smollm2-b"


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[Controller, GatewayProcess, Path]]:
    require_engine()
    home, recipes = recipe_dirs(tmp_path, "cpu-smollm2", "cpu-smollm2-eager")
    a_port, b_port = free_port(), free_port()
    (recipes / f"{A}.yaml").write_text(engine_recipe(A, "cpu-smollm2", a_port))
    (recipes / f"{B}.yaml").write_text(engine_recipe(
        # eager: B's wrapper interpreter and core binding are in its compile key, so a compiled B
        # compiled cold on every run (minutes on the CI machine); two engines by name are the subject
        B, "cpu-smollm2-eager", b_port, model={"served_name": B_MODEL}, env=beside_cores(),
        runtime=beside_interpreter(tmp_path, str(ENGINE.engine_python))))
    with gateway_process(home, free_port(), free_port()) as gw:
        c = Controller(home, recipes, free_port(), a_port, recipe=A,
                       extra_args=("--gateway-url", gw.control_url))
        with serving(c):
            try:
                yield c, gw, home
            finally:
                # The harness stops the primary; the engine beside it is stopped here, through the API.
                if c.proc is not None and _engine(c, B_MODEL) is not None:
                    c.post("/stop", {"model": B_MODEL})
                    c.wait(lambda: _engine(c, B_MODEL) is None, 120, "engine B to stop")


def _engine(c: Controller, model: str) -> dict[str, Any] | None:
    return next((e for e in c.status().get("engines") or [] if e["model"] == model), None)


def _ask(gw: GatewayProcess, model: str) -> tuple[int, dict[str, Any]]:
    body = {"model": model, "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "user", "content": "Hi."}]}
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {gw.key}"}
    req = urllib.request.Request(f"{gw.url}/v1/chat/completions", data=json.dumps(body).encode(),
                                 method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _b_ready(c: Controller) -> bool:
    entry = _engine(c, B_MODEL)
    assert entry is not None, "engine B left the set\n" + c.report()
    assert entry["state"] != "failed", f"engine B failed: {entry['diagnosis']}\n" + c.report()
    return bool(entry["state"] == "ready")


def test_two_engines_side_by_side_through_the_gateway_adopted_and_stopped_one_by_one(
    stack: tuple[Controller, GatewayProcess, Path],
) -> None:
    c, gw, home = stack
    a_launch = c.wait_ready()["launch"]["id"]
    answer = c.post("/apply", {"recipe": B, "alongside": True})
    assert answer["model"] == B_MODEL
    c.wait(lambda: _b_ready(c), START_LIVENESS_S, "engine B to be ready beside A")
    b_entry = _engine(c, B_MODEL)
    assert b_entry is not None
    b_launch = b_entry["launch_id"]

    # Each name goes to its own engine (vLLM answers with the served name it was asked for).
    for model in ("smollm2", B_MODEL):
        status, body = _ask(gw, model)
        assert status == 200 and body["model"] == model, (model, status, body)
    status, body = _ask(gw, "gpt-4o")
    assert status == 404 and body["error"]["code"] == "model_not_found", body
    engines = [(e["model"], e["state"]) for e in c.status()["engines"]]
    assert engines == [("smollm2", "ready"), (B_MODEL, "ready")]
    targets = json.loads((home / "prometheus" / "engines.json").read_text())
    assert sorted(g["labels"]["launch"] for g in targets) == sorted([a_launch, b_launch])

    # A controller restart: both engines keep running and come back under their own drivers.
    c.stop()
    c.start()
    c.wait(lambda: [(e["model"], e["launch_id"], e["state"]) for e in c.status()["engines"]]
           == [("smollm2", a_launch, "ready"), (B_MODEL, b_launch, "ready")],
           START_LIVENESS_S, "both engines adopted and ready")
    for model in ("smollm2", B_MODEL):
        status, body = _ask(gw, model)
        assert status == 200 and body["model"] == model, (model, status, body)

    # stop --model B: B ends, A keeps serving, B's name is no longer served.
    b_pid = engine_pid(home, b_launch)
    c.post("/stop", {"model": B_MODEL})
    c.wait(lambda: _engine(c, B_MODEL) is None, 300, "engine B to stop and leave the set")
    assert c.status()["state"] == "ready" and c.status()["launch"]["id"] == a_launch
    status, body = _ask(gw, "smollm2")
    assert status == 200 and body["model"] == "smollm2"
    status, body = _ask(gw, B_MODEL)
    assert status == 404, body
    assert c.get(f"/launches/{b_launch}")["status"] == "stopped"
    assert not psutil.pid_exists(b_pid) or psutil.Process(b_pid).status() == psutil.STATUS_ZOMBIE
