"""GET /gpu and POST /gpu/{index}/reset (controller/api/gpu.py) over a health link fed the replayed
H200, and `appliance gpu status | reset-done` (controller/cli/gpu_cmd.py) over that API's answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import typer
from fastapi import FastAPI
from typer.testing import CliRunner

from appliance.observe.gpu_health import ReplayQueries
from appliance.observe.kmsg import parse_record
from controller import admin_token
from controller.api.app import AdminGuard
from controller.api.gpu import gpu_router, gpu_status
from controller.cli import gpu_cmd
from controller.supervisor.gpu_health_watch import GpuHealthLink
from controller.watch.gpu_health import HealthReader
from tests.unit.test_api import TOKEN
from tests.unit.test_gpu_health import h200_recording


@pytest.fixture
def link(tmp_path: Path) -> GpuHealthLink:
    link = GpuHealthLink(HealthReader(tmp_path, nvml=ReplayQueries(h200_recording())))
    link.on_cards(link.reader.sample())
    rec = parse_record("3,9,1,-;NVRM: Xid (PCI:0000:00:06): 79, GPU has fallen off the bus.")
    assert rec is not None
    link.on_record(rec)
    link.on_cards(link.reader.sample())
    return link


@pytest.fixture
def app(tmp_path: Path, link: GpuHealthLink, monkeypatch: pytest.MonkeyPatch) -> FastAPI:
    monkeypatch.delenv(admin_token.HASH_ENV, raising=False)
    admin_token.write_hash(tmp_path, TOKEN)
    app = FastAPI()
    app.include_router(gpu_router(AdminGuard(tmp_path), link))
    return app


async def test_status_then_a_reset_acknowledged_lifts_the_refusal(app: FastAPI, link: GpuHealthLink) -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        status = (await c.get("/gpu")).json()
        (card,) = status["cards"]
        assert card["verdict"] == "refuse" and card["findings"][0]["check"] == "fatal-event"
        assert status["events"][0]["describe"].startswith("GPU 0: Xid 79")
        assert (await c.post("/gpu/0/reset")).status_code in (401, 403)  # the admin token is needed
        auth = {"Authorization": f"Bearer {TOKEN}"}
        missing = await c.post("/gpu/7/reset", headers=auth)
        assert missing.status_code == 404 and "index: no GPU 7" in missing.json()["detail"]
        assert (await c.post("/gpu/-1/reset", headers=auth)).status_code == 422
        done = await c.post("/gpu/0/reset", headers=auth)
        assert done.json() == {"gpu": 0, "cleared_fatal_events": 1}
        assert (await c.get("/gpu")).json()["cards"][0]["verdict"] == "admit"
    assert link.findings(frozenset({0})) == []


class FakeClient:
    def __init__(self, link: GpuHealthLink) -> None:
        self.link = link

    def __call__(self, base: str) -> FakeClient:
        return self

    def get(self, path: str) -> Any:
        assert path == "/gpu"
        return gpu_status(self.link)

    def post(self, path: str, body: Any = None) -> Any:
        assert path == "/gpu/0/reset"
        return {"gpu": 0, "cleared_fatal_events": self.link.acknowledge_reset(0)}


def test_the_cli_prints_cards_findings_and_events(
    link: GpuHealthLink, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gpu_cmd, "Client", FakeClient(link))
    app = typer.Typer()
    gpu_cmd.register(app)
    runner = CliRunner()
    out = runner.invoke(app, ["gpu", "status"])
    assert out.exit_code == 0, out.output
    assert out.output.startswith("refuse GPU 0 NVIDIA H200 (nvidia): ")
    assert "Xid 79: GPU has fallen off the bus since the card was last reset" in out.output
    assert "event: GPU 0: Xid 79" in out.output
    done = runner.invoke(app, ["gpu", "reset-done", "0"])
    assert done.exit_code == 0 and "1 fatal event(s) cleared" in done.output
    assert runner.invoke(app, ["gpu", "status", "--json"]).output.count('"verdict": "admit"') == 1
