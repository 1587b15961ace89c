"""The GPU health watch wired into the whole service: a kernel Xid record read by the service's own
kmsg follower (its source faked at the declared KmsgSource seam) reaches the GPU health link, the
controller's /metrics, and makes the fatal-event alert fire in promtool."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from controller.service import ServiceConfig, build
from controller.supervisor import host_memory_watch
from controller.supervisor.driver import DriverConfig
from controller.supervisor.preflight import Preflight
from tests.unit.model_helpers import seed_model
from tests.unit.supervisor_helpers import FakeClock, FakeRuntime
from tests.unit.test_kmsg import FakeSource

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "monitoring" / "prometheus" / "rules" / "appliance.rules.yml"
ALERT = "ApplianceGpuFatalKernelEvent"
PROMTOOL = shutil.which("promtool")
XID_79 = b"3,2201,9000000,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n"


async def test_an_xid_from_kmsg_reaches_metrics_and_fires_the_alert(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed_model(tmp_path / "home")
    cfg = ServiceConfig(home=tmp_path / "home", recipes_dir=REPO / "recipes", docker=False,
                        watch_host=False, watch_kmsg=False,
                        driver=DriverConfig(oom_settle_s=0, watch_exits=False))
    svc = build(cfg, runtimes={"process": FakeRuntime(FakeClock())})
    preflight = svc.driver.preflight
    assert isinstance(preflight, Preflight) and preflight.gpu is svc.gpu_health
    source = FakeSource([XID_79])
    monkeypatch.setattr(host_memory_watch, "DevKmsg", lambda path: source)
    stop = asyncio.Event()
    task = asyncio.create_task(svc.watch.run_kmsg(stop))
    await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert [e.xid for e in svc.gpu_health.recent_events] == [79]
    transport = httpx.ASGITransport(app=svc.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        text = (await client.get("/metrics")).text
    series = [s for f in text_string_to_metric_families(text) if f.name == "appliance_gpu_kernel_events"
              for s in f.samples if s.name.endswith("_total")]
    assert [(s.labels, s.value) for s in series] == [
        ({"gpu": "unknown", "kind": "xid", "xid": "79", "side": "hardware", "fatal": "true"}, 1.0)]
    svc.store.close()
    if PROMTOOL is None:
        pytest.skip("promtool not installed")
    labels = {**series[0].labels, "job": "appliance-controller", "instance": "127.0.0.1:8090"}
    body = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    (tmp_path / "rules.yml").write_text(RULES.read_text())
    rule = next(r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
                if r.get("alert") == ALERT)
    annotations = {**rule["annotations"], "summary": "Fatal GPU kernel event on GPU unknown (xid 79)"}
    test = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": f"appliance_gpu_kernel_events_total{{{body}}}", "values": "0 1x15"}],
        "alert_rule_test": [
            {"eval_time": "0m", "alertname": ALERT, "exp_alerts": []},
            {"eval_time": "2m", "alertname": ALERT, "exp_alerts": [{
                "exp_labels": {"severity": "critical", **labels}, "exp_annotations": annotations}]}]}]}
    (tmp_path / "t.yml").write_text(yaml.safe_dump(test))
    res = subprocess.run([PROMTOOL, "test", "rules", str(tmp_path / "t.yml")], capture_output=True,
                         text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
