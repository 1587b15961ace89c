"""The console's GPU health panel on the Now and Host memory pages, and GPU events on a launch's page,
over the real app (test_api.py's rig) with the GPU health link fed the replayed H200 recording."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from appliance.observe.gpu_health import ReplayQueries
from appliance.observe.kmsg import parse_record
from controller import admin_token
from controller.console.gpu_views import gpu_health_view
from controller.runtime.base import Provenance
from controller.supervisor.gpu_health_watch import GpuHealthLink
from controller.watch.gpu_health import HealthReader
from tests.unit.supervisor_helpers import make_handle, make_spec
from tests.unit.test_api import TOKEN, Rig
from tests.unit.test_console import login
from tests.unit.test_gpu_health import h200_recording


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv(admin_token.HASH_ENV, raising=False)
    monkeypatch.setenv("APPLIANCE_HOME", str(tmp_path))
    admin_token.write_hash(tmp_path, TOKEN)
    return tmp_path


@pytest.fixture
def rig(home: Path) -> Rig:
    rig = Rig(home)
    hot = ReplayQueries(h200_recording(), {0: {"throttle_reasons": 0x40}})
    link = GpuHealthLink(HealthReader(home, nvml=hot))
    link.on_cards(link.reader.sample())
    rec = parse_record("3,7,1,-;NVRM: Xid (PCI:0000:00:06): 94, pid=11, name=python3, Contained ECC error.")
    assert rec is not None
    link.on_record(rec)
    rig.preflight.gpu = link
    return rig


@pytest.fixture
async def client(rig: Rig) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=rig.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        yield c


async def test_now_and_host_pages_show_each_card_its_findings_and_the_events(
    client: httpx.AsyncClient,
) -> None:
    await login(client)
    for path in ("/console/", "/console/memory"):
        page = (await client.get(path)).text
        assert 'id="gpu-health"' in page and 'id="gpu-0"' in page, path
        assert "GPU 0 NVIDIA H200 (nvidia)" in page and "verdict-warn" in page
        assert "clocks held back by hw_thermal_slowdown" in page
        assert "GPU 0: Xid 94: contained memory error" in page


async def test_a_launchs_gpu_events_are_on_its_page_and_chart(rig: Rig, client: httpx.AsyncClient) -> None:
    now = time.time()
    rig.store.create_launch("L1", make_spec("cpu-smollm2"), "normal", Provenance(), now - 100)
    rig.store.set_handle("L1", make_handle("L1", "cpu-smollm2", started_at=now - 100), now - 100)
    rig.store.add_event("gpu-event", "GPU 0: Xid 79: GPU has fallen off the bus", now - 40, "L1")
    await login(client)
    page = (await client.get("/console/launches/L1")).text
    assert 'id="gpu-events"' in page and "Xid 79: GPU has fallen off the bus" in page


def test_without_a_watch_the_panel_says_so() -> None:
    view = gpu_health_view(None)
    assert not view["watched"] and view["blind"] == "the GPU health watch is not running"
