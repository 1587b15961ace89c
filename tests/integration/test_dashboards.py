"""Every Grafana panel query, run by a real Prometheus (Debian's 2.42) against real exporters.

The controller's registry (`controller/metrics.py`) and the gateway's (`GatewayMetrics`) are served
on loopback with values set through their public functions while a background thread keeps
counters moving; Prometheus scrapes them every second with the real alert rules loaded. Each query
of each dashboard must parse (the HTTP API reports errors) and return data whenever the metrics it
names exist — and for these two registries every named metric must exist (a typo fails).

Then every dashboard (engine-serving and the Overview included) against a RUNNING appliance: the
gateway, the controller and the real CPU engine, with traffic, scraped as prometheus.yml does (the
engine found through the controller's file_sd list). Each query must return series where the
system's state says it must and none where it says there is nothing; the panel-by-panel table is
printed. It skips with the reason when the engine is not installed. Everything started here is
stopped by PID.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, start_http_server

from appliance.observe.gpu_events import GpuEvent, parse_gpu_line, xid_label
from appliance.observe.gpu_health import ReplayQueries, assess, card_from_queries
from appliance.observe.kmsg import SeqGap, oom_events, parse_stream
from bench.hold_bench import GatewayProcess, gateway_process
from controller.gateway.metrics import GatewayMetrics
from controller.metrics import ControllerMetrics
from controller.watch.gpu import GpuReader
from controller.watch.procreader import ProcReader
from controller.watch.sampler import HostSampler, Watermarks
from tests.integration.controller_harness import (
    Controller,
    engine_recipe,
    recipe_dirs,
    require_engine,
    serving,
)
from tests.integration.prometheus_harness import (
    PROMETHEUS,
    Prometheus,
    free_port,
    get_json,
    static_jobs,
    until,
)
from tests.unit.dashboard_helpers import query_panels

# The controller metrics this test exports (one registry of its own, as the controller builds).
metrics = ControllerMetrics()

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "monitoring" / "grafana" / "dashboards"
RULES = ROOT / "monitoring" / "prometheus" / "rules" / "appliance.rules.yml"
FIX = ROOT / "tests" / "fixtures"

# Grafana's macros, as the panels would get them with a 1 s scrape interval.
MACROS = {"$__rate_interval": "15s", "$__interval": "5s", "$__range": "5m"}

pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (scripts/setup-system.sh)"),
]


def _exprs(dashboard: str) -> list[tuple[str, str]]:
    doc = json.loads((DASHBOARDS / dashboard).read_text())
    # every panel, those folded into a collapsed row included (rows themselves query nothing)
    out = [(f"{p['title']} [{t['refId']}]", t["expr"])
           for p in query_panels(doc) for t in p.get("targets", [])]
    out += [(f"annotation {a['name']}", a["expr"]) for a in doc["annotations"]["list"] if "expr" in a]
    return out


def _expand(expr: str) -> str:
    for macro, value in MACROS.items():
        expr = expr.replace(macro, value)
    return expr


_METRIC = re.compile(r"\b((?:appliance_|vllm:)[A-Za-z0-9_:]+)\b(?!\s*(?:=|!=|=~|!~))")


def _check_dashboard(prom: Prometheus, dashboard: str, *, all_metrics_must_exist: bool,
                     empty: frozenset[str] = frozenset()) -> list[str]:
    """Run every query; return the labels of queries that had data. Fails on parse errors, on
    missing data where the named series exist, and (optionally) on names that do not exist. The
    queries named in `empty` must return nothing (the exporters' state says so)."""
    problems: list[str] = []
    with_data: list[str] = []
    for where, raw in _exprs(dashboard):
        expr = _expand(raw)
        assert "$" not in expr, f"{dashboard} {where}: unexpanded variable in {expr}"
        res = prom.query(expr)
        if res.get("status") != "success":
            problems.append(f"{where}: does not parse/evaluate: {res.get('error')} :: {expr}")
            continue
        if where in empty:
            if res["data"]["result"]:
                problems.append(f"{where}: data although it must be empty :: {expr}")
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
    gw.model_ready.labels("smollm2").set(1)  # the one engine, by its served name
    gw.keys_loaded.set(3)
    gw.key_info.source = lambda: {"k1": "team-a batch"}  # the key Traffic sends as
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
    empty = EMPTY_WHILE_READY if dashboard == "engine-startup.json" else frozenset()
    with_data = _check_dashboard(prom_appliance, dashboard, all_metrics_must_exist=True, empty=empty)
    assert len(with_data) == len(_exprs(dashboard)) - len(empty)


# The exporters' engine is ready (`_set_controller_values`): the elapsed-time line ended at ready
# (it kept counting past the budget of a long-ready engine before).
EMPTY_WHILE_READY = frozenset({"Elapsed vs ready budget (current launch) [A]"})


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



# --- the running appliance ------------------------------------------------------------------------
#
# One appliance start for every dashboard: the gateway process, the controller (`appliance serve`,
# controller_harness) with the REAL CPU engine (the eager recipe: no compile on a busy machine), a
# client sending completions through the gateway (streaming and not) while the queries run, and a
# real Prometheus scraping the controller, the gateway's control listener and the engine the
# controller lists for it (file_sd, controller/supervisor/scrape_targets.py), with the alert rules.
# Every panel query of every dashboard must return series where this system's state says it must,
# and none where it says there is nothing (no GPU card, no OOM kill, no benchmark). The table of
# panel | query | series | expected is printed.


class Client:
    """Completions through the gateway, one at a time, alternately streaming, until stopped."""

    def __init__(self, url: str, key: str) -> None:
        self.url, self.key = url, key
        self.ok = 0
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def one(self, stream: bool, prompt: str) -> None:
        body = json.dumps({"model": "smollm2", "max_tokens": 8, "temperature": 0, "stream": stream,
                           "messages": [{"role": "user", "content": prompt}]}).encode()
        req = urllib.request.Request(f"{self.url}/v1/chat/completions", data=body, headers={
            "Content-Type": "application/json", "Authorization": f"Bearer {self.key}"})
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                resp.read()
                self.ok += 1
        except OSError as exc:
            self.errors.append(repr(exc))

    def run(self) -> None:
        i = 0
        # The same prompt again and again: the prefix cache is asked, so its panel has a ratio.
        while not self.stop.wait(0.2):
            self.one(i % 2 == 1, "What is the capital of France?")
            i += 1


@dataclass
class Appliance:
    controller: Controller
    gateway: GatewayProcess
    prom: Prometheus
    client: Client
    gpus: int


APPLIANCE_RECIPE = "itest-dash-smollm2"


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    require_engine()
    base = tmp_path_factory.mktemp("dash-appliance")
    home, recipes = recipe_dirs(base, "cpu-smollm2", "cpu-smollm2-eager")
    engine_port = free_port()
    (recipes / f"{APPLIANCE_RECIPE}.yaml").write_text(
        engine_recipe(APPLIANCE_RECIPE, "cpu-smollm2-eager", engine_port))
    with gateway_process(home, free_port(), free_port()) as gw:
        c = Controller(home, recipes, free_port(), engine_port, recipe=APPLIANCE_RECIPE,
                       extra_args=("--gateway-url", gw.control_url))
        with serving(c):
            c.wait_ready()
            scrape = static_jobs({"appliance-controller": f"127.0.0.1:{c.port}",
                                  "appliance-gateway": f"127.0.0.1:{gw.control_port}"}) + (
                "\n  - job_name: vllm-engine\n    metrics_path: /metrics\n    file_sd_configs:\n"
                f"      - files: ['{home / 'prometheus'}/*.json']\n        refresh_interval: 1s\n")
            prom = Prometheus(base / "prom", scrape, RULES)
            client = Client(gw.url, gw.key)
            client.thread.start()
            try:
                prom.wait_targets_up({"appliance-controller", "appliance-gateway", "vllm-engine"}, 60)
                yield Appliance(c, gw, prom, client, len(GpuReader().sample()))
            finally:
                client.stop.set()
                client.thread.join(130)
                prom.stop()


def _must_be_empty(expr: str, a: Appliance) -> str | None:
    """Why this query must return nothing on this running appliance (None: it must return series)."""
    if "appliance_gpu_" in expr and a.gpus == 0:
        return "none: no GPU card on this host"
    if "appliance_bench_" in expr or "appliance_reproducibility_" in expr:
        return "none: no benchmark ran"
    if "appliance_oom_victim_kills_total" in expr or (expr.startswith("increase(") and expr.endswith("> 0")):
        return "none: no such event on a healthy appliance"  # OOM victims, the event annotations
    if 'appliance_engine_state{state="starting"} == 1' in expr and a.controller.status()["state"] == "ready":
        return "none: the engine is ready (the line ended at ready)"
    no_swap = not a.prom.series("appliance_host_swap_total_bytes > 0")
    if "(appliance_host_swap_total_bytes > 0)" in expr and no_swap:
        return "none: no swap on this host"
    return None


def _series_after_traffic(a: Appliance) -> None:
    """Bounded waits until Prometheus has what the rate() and quantile panels need."""
    def seen(expr: str) -> Callable[[], bool | None]:
        return lambda: True if a.prom.series(expr) else None

    for expr in ('sum(rate(appliance_gateway_ttft_seconds_count[15s])) > 0',
                 "sum(rate(vllm:request_success_total[15s])) > 0",
                 "sum(rate(vllm:prefix_cache_queries_total[15s])) > 0",
                 "appliance_engine_process_rss_bytes"):
        until(f"Prometheus to see {expr}", seen(expr), 240, 1.0)


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_every_panel_query_against_the_running_appliance(appliance: Appliance) -> None:
    a = appliance
    _series_after_traffic(a)
    assert a.client.ok > 0, a.client.errors[-3:]
    rows: list[tuple[str, str, str, int, str]] = []
    problems: list[str] = []
    for dashboard in sorted(p.name for p in DASHBOARDS.glob("*.json")):
        for where, raw in _exprs(dashboard):
            expr = _expand(raw)
            res = a.prom.query(expr)
            if res.get("status") != "success":
                problems.append(f"{dashboard} {where}: {res.get('error')} :: {expr}")
                rows.append((dashboard, where, raw, -1, "parse"))
                continue
            n = len(res["data"]["result"])
            why_empty = _must_be_empty(expr, a)
            expected = why_empty or "series"
            rows.append((dashboard, where, raw, n, expected))
            if why_empty is None and n == 0:
                problems.append(f"{dashboard} {where}: no series :: {expr}")
            if why_empty is not None and n > 0:
                problems.append(f"{dashboard} {where}: {n} series where {why_empty} :: {expr}")
    width = max(len(f"{d} {w}") for d, w, *_ in rows)
    print(f"\n{'panel':<{width}} | series | expected | query")
    for d, w, raw, n, expected in rows:
        print(f"{d + ' ' + w:<{width}} | {n:>6} | {expected} | {' '.join(raw.split())}")
    print(f"[dashboards] {len(rows)} queries, {a.client.ok} completions through the gateway, "
          f"{a.gpus} GPU card(s) on this host")
    assert not problems, "\n".join(problems)
    # The per-key panels name the key (GatewayProcess created it as "hold-bench") through key_info.
    by_key = next(e for w, e in _exprs("gateway.json") if w == "Tokens per second by key [A]")
    named = a.prom.series(_expand(by_key))
    assert {s["metric"].get("name") for s in named} == {"hold-bench"}, named
    # The alert rules load and evaluate on the live appliance; nothing fires on a healthy one.
    rules = [r for g in get_json(a.prom.url + "/api/v1/rules")["data"]["groups"] for r in g["rules"]]
    assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]
    firing = [al["labels"]["alertname"] for r in rules for al in r.get("alerts", [])
              if al["state"] == "firing"]
    assert firing == [], firing
