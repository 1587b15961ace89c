"""Every Grafana panel query, run by a real Prometheus (Debian's 2.42) against real exporters.

The controller's registry (`controller/metrics.py`) and the gateway's (`GatewayMetrics`) are served
on loopback with values set through their public functions while a background thread keeps
counters moving; Prometheus scrapes them every second with the real alert rules loaded. Each query
of each dashboard must parse (the HTTP API reports errors) and return data whenever the metrics it
names exist — and for these two registries every named metric must exist (a typo fails).

The engine-serving dashboard runs against the REAL CPU vLLM engine with a few completions sent
through it; that test skips with the reason when the engine env is not installed.
Everything started here is stopped by PID.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, start_http_server

from appliance.observe.gpu_events import GpuEvent, parse_gpu_line, xid_label
from appliance.observe.gpu_health import ReplayQueries, assess, card_from_queries
from appliance.observe.kmsg import SeqGap, oom_events, parse_stream
from bench.engine_cpu import launch_spec, prepare_cache_dirs
from controller.gateway.metrics import GatewayMetrics
from controller.metrics import ControllerMetrics
from controller.settings import paths
from controller.watch.gpu import GpuReader
from controller.watch.procreader import ProcReader
from controller.watch.sampler import HostSampler, Watermarks
from tests.integration.prometheus_harness import PROMETHEUS, Prometheus, get_json, static_jobs
from tests.integration.prometheus_harness import free_port as _free_port

# The controller metrics this test exports (one registry of its own, as the controller builds).
metrics = ControllerMetrics()

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "monitoring" / "grafana" / "dashboards"
RULES = ROOT / "monitoring" / "prometheus" / "rules" / "appliance.rules.yml"
FIX = ROOT / "tests" / "fixtures"
MODEL_DIR = paths().models / "smollm2-135m-instruct"
SERVED = "smollm2"
ENGINE_READY_BUDGET_S = 600  # cold start ≈ 90 s alone (MEASURED.md); the machine is shared

# Grafana's macros, as the panels would get them with a 1 s scrape interval.
MACROS = {"$__rate_interval": "15s", "$__interval": "5s", "$__range": "5m"}

pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (scripts/setup-system.sh)"),
]


def _exprs(dashboard: str) -> list[tuple[str, str]]:
    doc = json.loads((DASHBOARDS / dashboard).read_text())
    # row panels have no targets
    out = [(f"{p['title']} [{t['refId']}]", t["expr"]) for p in doc["panels"] for t in p.get("targets", [])]
    out += [(f"annotation {a['name']}", a["expr"]) for a in doc["annotations"]["list"] if "expr" in a]
    return out


def _expand(expr: str) -> str:
    for macro, value in MACROS.items():
        expr = expr.replace(macro, value)
    return expr


_METRIC = re.compile(r"\b((?:appliance_|vllm:)[A-Za-z0-9_:]+)\b(?!\s*(?:=|!=|=~|!~))")


def _check_dashboard(prom: Prometheus, dashboard: str, *, all_metrics_must_exist: bool) -> list[str]:
    """Run every query; return the labels of queries that had data. Fails on parse errors, on
    missing data where the named series exist, and (optionally) on names that do not exist."""
    problems: list[str] = []
    with_data: list[str] = []
    for where, raw in _exprs(dashboard):
        expr = _expand(raw)
        assert "$" not in expr, f"{dashboard} {where}: unexpanded variable in {expr}"
        res = prom.query(expr)
        if res.get("status") != "success":
            problems.append(f"{where}: does not parse/evaluate: {res.get('error')} :: {expr}")
            continue
        names = set(_METRIC.findall(expr))
        missing = {n for n in names if not prom.query(f'count({{__name__="{n}"}})')["data"]["result"]}
        if missing:
            if all_metrics_must_exist:
                problems.append(f"{where}: no such series {sorted(missing)}")
            continue
        if res["data"]["result"]:
            with_data.append(where)
        else:
            problems.append(f"{where}: no data although {sorted(names)} exist :: {expr}")
    assert not problems, f"{dashboard}:\n" + "\n".join(problems)
    return with_data


# --- controller + gateway exporters ---------------------------------------------------------------


class Traffic:
    """Keeps the exporters' counters and histograms moving so rate()-based panels have data."""

    def __init__(self, gw: GatewayMetrics) -> None:
        self.gw = gw
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        i = 0
        while not self.stop.wait(0.1):
            i += 1
            route = "/v1/chat/completions"
            self.gw.count_request(route, 200, "k1")
            prompt, completion, ok, failed, quota_refused = self.gw.usage.children("k1")
            prompt.inc(30)
            completion.inc(12)
            ok.inc()
            if i % 10 == 0:
                failed.inc()
                quota_refused.inc()
                self.gw.count_request(route, 503, "none")
                self.gw.upstream_errors.labels("connect").inc()
            duration, ttft, itl = self.gw.route_histograms(route)
            duration.observe(0.4 + (i % 5) / 10)
            ttft.observe(0.05 + (i % 3) / 100)
            itl.observe(0.01 + (i % 4) / 1000)
            if i % 20 == 0:
                metrics.record_cgroup_oom_kills(1)
                metrics.record_restart("recipe-c", "oom")


def _serve(registry: CollectorRegistry) -> tuple[Any, threading.Thread, str]:
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    return server, thread, f"127.0.0.1:{server.server_port}"


def _set_controller_values() -> None:
    # Host values from the recipe-C-like fixture host: it has swap, PSI and an engine tree.
    sample = HostSampler(ProcReader(FIX / "procfs" / "tp4_graph_host" / "proc")).sample([1000])
    # GPU panels: the real amdgpu sysfs reader over the gfx906 fixture host (no GPU in CI).
    gpus = GpuReader(FIX / "hosts" / "gfx906-gpumem", nvml=False).sample()
    assert gpus, "the gfx906 fixture host should show its cards"
    metrics.observe_gpus(gpus)
    # GPU health panels: the H200 recorded through the watch's own NVML seam, replayed (healthy, idle:
    # throttle reason gpu_idle), assessed as the watch does.
    rec = json.loads((FIX / "gpu_health" / "h200-2026-12-01-recorder" / "nvml-queries.json").read_text())
    card = card_from_queries(0, ReplayQueries(rec, sample=len(rec["samples"]) - 1))
    metrics.gpu_health.observe([card], assess(card))
    # the event series exist at 0 before the events come (increase() needs a sample before them)
    for gpu_event in _xid_events():
        metrics.gpu_health.events.labels(str(gpu_event.card) if gpu_event.card is not None else "unknown",
                                         gpu_event.kind.value, xid_label(gpu_event), gpu_event.side.value,
                                         "true" if gpu_event.fatal else "false")
    now = time.time()
    metrics.begin_launch("recipe-c", "warm", ready_budget_s=600, min_mem_available_bytes=int(2.35 * 2**30),
                         started_at=now - 240)
    metrics.set_engine_state("starting")
    for phase, at in (("weights_loading", 5.0), ("compile_cache_hit", 30.0), ("kv_cache", 90.0),
                      ("graph_capture", 120.0), ("api_up", 230.0)):
        metrics.set_engine_phase("recipe-c", phase, at)
    metrics.record_compile_cache("recipe-c", "warm", "hit")
    metrics.record_ready("recipe-c", "warm", 230.0)
    metrics.record_ready("recipe-c", "cold", 352.0)  # DOMAIN §2: recipe C 352 s cold, 230 s warm
    metrics.set_engine_state("ready")
    metrics.observe_host(sample)
    marks = Watermarks("l1")
    marks.update(sample, phase="graph_capture")
    metrics.observe_watermarks("recipe-c", marks)


def _record_ooms() -> None:
    for name in ("global_oom_5.15_cgroup2_tp4_graph.txt", "memcg_v1_kernel_6.18_docker.txt"):
        for event in oom_events(parse_stream((FIX / "kmsg" / name).read_text())):
            metrics.record_oom_event(event)
    metrics.record_kmsg_gap(SeqGap(expected=10, got=13))
    # kernel GPU events from the documented Xid lines (a fatal 79, an application-side 31, …): after
    # the first scrapes, like the OOM kills, so that increase() sees them
    for gpu_event in _xid_events():
        metrics.gpu_health.record_event(gpu_event, time.time())


def _xid_events() -> list[GpuEvent]:
    lines = (FIX / "gpu_health" / "kmsg" / "nvidia_xid.txt").read_text().splitlines()
    return [e for e in map(parse_gpu_line, lines) if e is not None]


@pytest.fixture(scope="module")
def exporters() -> Iterator[dict[str, str]]:
    gw = GatewayMetrics()
    gw.in_flight.set(2)
    gw.in_flight_streams.set(1)
    gw.upstream_ready.set(1)
    gw.keys_loaded.set(3)
    gw.usage.pending.set(1)
    gw.switches.inc()
    _set_controller_values()
    c_server, c_thread, c_addr = _serve(metrics.registry)
    g_server, g_thread, g_addr = _serve(gw.registry)
    traffic = Traffic(gw)
    traffic.thread.start()
    try:
        yield {"appliance-controller": c_addr, "appliance-gateway": g_addr}
    finally:
        traffic.stop.set()
        traffic.thread.join(5)
        for server, thread in ((c_server, c_thread), (g_server, g_thread)):
            server.shutdown()
            thread.join(5)


@pytest.fixture(scope="module")
def prom_appliance(
    exporters: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Prometheus]:
    prom = Prometheus(tmp_path_factory.mktemp("prom-appliance"), static_jobs(exporters), RULES)
    try:
        prom.wait_targets_up(set(exporters))
        time.sleep(3)  # a few scrapes of the untouched state
        _record_ooms()  # after the first scrapes, so increase() over [1m] sees the kills
        time.sleep(5)
        yield prom
    finally:
        prom.stop()


@pytest.mark.parametrize("dashboard", ["host-memory.json", "engine-startup.json", "gateway.json"])
def test_appliance_dashboards_return_data(prom_appliance: Prometheus, dashboard: str) -> None:
    with_data = _check_dashboard(prom_appliance, dashboard, all_metrics_must_exist=True)
    assert len(with_data) == len(_exprs(dashboard))


def test_engine_serving_queries_parse_without_an_engine(prom_appliance: Prometheus) -> None:
    # No engine target here: every query must still be valid PromQL.
    for where, raw in _exprs("engine-serving.json"):
        res = prom_appliance.query(_expand(raw))
        assert res.get("status") == "success", (where, res.get("error"))


def test_alert_rules_load_and_evaluate_healthy(prom_appliance: Prometheus) -> None:
    res = get_json(prom_appliance.url + "/api/v1/rules")
    rules = [r for g in res["data"]["groups"] for r in g["rules"]]
    assert len(rules) >= 10
    bad = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not bad, bad
    firing = {a["labels"]["alertname"] for r in rules for a in r.get("alerts", [])}
    # The OOM kills recorded above must light both OOM alerts (global and cgroup separately).
    assert {"ApplianceGlobalOomKill", "ApplianceCgroupOomKill"} <= firing, firing


# --- the real engine ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    python = paths().engine_python
    if not python.exists():
        pytest.skip(f"engine env absent ({python}); run `appliance engine setup`")
    if not (MODEL_DIR / "config.json").exists():
        pytest.skip(f"model absent ({MODEL_DIR}); run `appliance engine setup`")
    port = _free_port()
    # The default recipe as rendered, on a cache root of its own kept between runs (the next run
    # starts warm); the directories exist before the start (a missing TMPDIR falls back to /tmp).
    spec = launch_spec(paths().cache / "tests" / "dashboards", port=port)
    assert spec.served_model_name == SERVED
    prepare_cache_dirs(spec)
    env = {**os.environ, **spec.env}
    log_path = tmp_path_factory.mktemp("engine") / "engine.log"
    log = log_path.open("wb")
    proc = subprocess.Popen(
        spec.command(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ENGINE_READY_BUDGET_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"engine exited with {proc.returncode}: {log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"engine not ready in {ENGINE_READY_BUDGET_S} s: {log_path.read_text()[-3000:]}")
            time.sleep(1)
        yield f"127.0.0.1:{port}"
    finally:
        # The engine forks its EngineCore into the session we created: signal that group, by id.
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        except ProcessLookupError:
            pass
        log.close()


def _complete(addr: str, prompt: str) -> None:
    body = json.dumps({
        "model": SERVED, "max_tokens": 16, "temperature": 0,
        "messages": [{"role": "user", "content": prompt}],
    }).encode()
    req = urllib.request.Request(f"http://{addr}/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        assert resp.status == 200


@pytest.mark.engine
@pytest.mark.slow
def test_engine_serving_dashboard_against_the_real_engine(
    engine: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    prom = Prometheus(tmp_path_factory.mktemp("prom-engine"), static_jobs({"vllm-engine": engine}), RULES)
    try:
        prom.wait_targets_up({"vllm-engine"})
        time.sleep(2)
        # The same prompt twice: the second hits the prefix cache, so the hit-ratio panel has data.
        for prompt in ("What is the capital of France?", "What is the capital of France?", "Name a color."):
            _complete(engine, prompt)
        time.sleep(4)  # several scrapes inside the 15 s rate window
        with_data = _check_dashboard(prom, "engine-serving.json", all_metrics_must_exist=True)
        assert len(with_data) == len(_exprs("engine-serving.json"))
    finally:
        prom.stop()
