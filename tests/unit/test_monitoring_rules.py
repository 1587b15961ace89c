"""monitoring/: Prometheus config and alert rules checked by the real promtool, and every metric name
the rules and dashboards use checked against the registries that export them."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from controller import metrics
from controller.gateway.metrics import GatewayMetrics
from controller.metrics import ControllerMetrics
from controller.supervisor.machine import State
from tests.unit.dashboard_helpers import all_panels, query_panels

MON = Path(__file__).resolve().parents[2] / "monitoring"
PROM = MON / "prometheus"
RULES = PROM / "rules" / "appliance.rules.yml"
RULE_TESTS = PROM / "tests" / "appliance.rules.test.yml"
DASHBOARDS = sorted((MON / "grafana" / "dashboards").glob("*.json"))
PROMTOOL = shutil.which("promtool")

needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian package `prometheus`; scripts/setup-system.sh)"
)


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60, check=False)


@needs_promtool
def test_promtool_check_config() -> None:
    res = promtool("check", "config", str(PROM / "prometheus.yml"))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 rule files found" in res.stdout


@needs_promtool
def test_promtool_check_rules() -> None:
    res = promtool("check", "rules", str(RULES))
    assert res.returncode == 0, res.stdout + res.stderr


@needs_promtool
def test_promtool_test_rules() -> None:
    res = promtool("test", "rules", str(RULE_TESTS))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


@needs_promtool
def test_promtool_test_rules_fail_for_a_state_the_supervisor_never_sets(tmp_path: Path) -> None:
    # The engine-failed alert once selected state="fatal", which the supervisor never exports (its
    # terminal state is "failed"): the rule tests must catch that rule.
    (tmp_path / "rules").mkdir()
    (tmp_path / "tests").mkdir()
    text = RULES.read_text()
    assert 'appliance_engine_state{state="failed"}' in text
    (tmp_path / "rules" / RULES.name).write_text(text.replace('state="failed"', 'state="fatal"'))
    (tmp_path / "tests" / RULE_TESTS.name).write_text(RULE_TESTS.read_text())
    res = promtool("test", "rules", str(tmp_path / "tests" / RULE_TESTS.name))
    assert res.returncode != 0
    assert "ApplianceEngineFatal" in res.stdout + res.stderr


@needs_promtool
def test_promtool_test_rules_can_fail(tmp_path: Path) -> None:
    # The same tests against rules with the swap threshold moved must fail: the tests pin behaviour.
    (tmp_path / "rules").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "rules" / RULES.name).write_text(RULES.read_text().replace("> 0.9", "> 0.95"))
    (tmp_path / "tests" / RULE_TESTS.name).write_text(RULE_TESTS.read_text())
    res = promtool("test", "rules", str(tmp_path / "tests" / RULE_TESTS.name))
    assert res.returncode != 0
    assert "ApplianceSwapAlmostFull" in res.stdout + res.stderr


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def test_every_alert_has_runbook_text_and_severity() -> None:
    alerts = [r for r in _rules() if "alert" in r]
    assert {a["alert"] for a in alerts} >= {
        "ApplianceMemAvailableBelowRecipeTarget", "ApplianceGlobalOomKill", "ApplianceCgroupOomKill",
        "ApplianceEngineNotReadyPastBudget", "ApplianceSwapAlmostFull",
        "ApplianceWarmRestartMissedCompileCache", "ApplianceGatewayErrorRatioHigh",
    }
    for a in alerts:
        assert a["labels"]["severity"] in ("warning", "critical"), a["alert"]
        for key in ("summary", "description", "runbook"):
            assert len(a["annotations"].get(key, "")) > 20, (a["alert"], key)


def test_every_alert_has_firing_and_quiet_cases() -> None:
    doc = yaml.safe_load(RULE_TESTS.read_text())
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in doc["tests"]:
        for t in case.get("alert_rule_test", []):
            (firing if t.get("exp_alerts") else quiet).add(t["alertname"])
    names = {r["alert"] for r in _rules() if "alert" in r}
    assert names <= firing, names - firing
    assert names <= quiet, names - quiet


# --- metric names ---------------------------------------------------------------------------------


def _exported_names(registry: CollectorRegistry) -> set[str]:
    names: set[str] = set()
    for family in registry.collect():
        if family.type == "counter":
            names |= {family.name + "_total", family.name + "_created"}
        elif family.type == "histogram":
            names |= {family.name + s for s in ("_bucket", "_sum", "_count", "_created")}
        else:
            names.add(family.name)
        names |= {s.name for s in family.samples}
    return names


def _appliance_names(expr: str) -> Iterator[str]:
    # Metric names, not label names: an identifier followed by `=`/`!=`/`=~` inside braces is a label.
    for m in re.finditer(r"\b(appliance_[a-z0-9_]+)\b(?!\s*(?:=|!=|=~|!~))", expr):
        yield m.group(1)


def _dashboard_exprs() -> Iterator[tuple[str, str]]:
    for path in DASHBOARDS:
        doc = json.loads(path.read_text())
        for panel in query_panels(doc):
            for target in panel.get("targets", []):
                yield f"{path.name}:{panel['title']}", target["expr"]
        for ann in doc["annotations"]["list"]:
            if "expr" in ann:
                yield f"{path.name}:annotation {ann['name']}", ann["expr"]


def test_rules_and_dashboards_use_only_exported_appliance_metrics() -> None:
    exported = _exported_names(ControllerMetrics().registry) | _exported_names(GatewayMetrics().registry)
    used: list[tuple[str, str]] = [(r.get("alert", r.get("record", "?")), r["expr"]) for r in _rules()]
    used += list(_dashboard_exprs())
    unknown = {
        (where, name) for where, expr in used for name in _appliance_names(expr) if name not in exported
    }
    assert not unknown, sorted(unknown)


# `state` label matchers (=, !=, =~, !~) in PromQL, also inside JSON strings where quotes are \".
_STATE_MATCHER = re.compile(r'(?<![A-Za-z0-9_])state\s*(=~|!~|!=|=)\s*\\?"((?:[^"\\]|\\(?!"))*)\\?"')
MONITORING_FILES = sorted(p for ext in ("yml", "yaml", "json") for p in MON.rglob(f"*.{ext}"))


def _state_values(text: str) -> Iterator[str]:
    """Every state name a `state` matcher selects; a regex matcher is read as an alternation of names."""
    for m in _STATE_MATCHER.finditer(text):
        op, value = m.group(1), m.group(2)
        yield from (value.split("|") if op in ("=~", "!~") else [value])


def test_state_matcher_finds_states_in_rules_tests_and_dashboards() -> None:
    # The checker itself: it must see the old broken rule, JSON-escaped quotes and regex alternations.
    assert list(_state_values('appliance_engine_state{state="fatal"} == 1')) == ["fatal"]
    assert list(_state_values('"expr": "appliance_engine_state{state=\\"stopped\\"}"')) == ["stopped"]
    assert list(_state_values('x{job="a", state=~"ready|draining"}')) == ["ready", "draining"]
    assert list(_state_values("state: failed  {{state}}  estate=\"x\"")) == []


def test_every_state_label_in_monitoring_is_a_real_supervisor_state() -> None:
    # Rules, rule tests and dashboards select supervisor states by name; a name the State enum does
    # not have matches nothing and the alert or panel is silently dead (state="fatal" was).
    real = {s.value for s in State}
    used = {(str(path.relative_to(MON)), value)
            for path in MONITORING_FILES for value in _state_values(path.read_text())}
    assert ("prometheus/rules/appliance.rules.yml", "failed") in used  # the check is not vacuous
    unknown = sorted((where, value) for where, value in used if value not in real)
    assert not unknown, f"not a controller.supervisor.machine.State value: {unknown}"
    # And the controller exports exactly these states (present at 0 from start-up).
    assert set(metrics.ENGINE_STATES) == real
    assert tuple(s.value for s in State) == metrics.ENGINE_STATES  # metrics names them; in State's order
    body = ControllerMetrics().render()[0].decode()
    exported = {m.group(1) for m in re.finditer(r'^appliance_engine_state\{state="([^"]+)"\}', body, re.M)}
    assert exported >= real


def test_dashboards_are_well_formed() -> None:
    assert {p.name for p in DASHBOARDS} == {
        "host-memory.json", "engine-startup.json", "engine-serving.json", "gateway.json", "evaluation.json",
        "overview.json"}
    uids = set()
    for path in DASHBOARDS:
        doc = json.loads(path.read_text())
        assert doc["uid"] not in uids
        uids.add(doc["uid"])
        ids = [p["id"] for p in all_panels(doc)]
        assert len(ids) == len(set(ids)), path.name
        for panel in query_panels(doc):  # a row groups panels; it queries nothing
            assert panel["targets"], (path.name, panel["title"])
            assert panel["datasource"]["uid"] == "${datasource}"
            grid = panel["gridPos"]
            assert grid["x"] + grid["w"] <= 24, (path.name, panel["title"])


def test_host_memory_dashboard_has_oom_annotations_for_both_constraints() -> None:
    doc = json.loads((MON / "grafana" / "dashboards" / "host-memory.json").read_text())
    exprs = [a.get("expr", "") for a in doc["annotations"]["list"]]
    assert any('constraint="global"' in e for e in exprs)
    assert any('constraint="cgroup"' in e for e in exprs)


VLLM_METRICS = Path(__file__).resolve().parents[1] / "fixtures" / "engine_logs" / "vllm_metrics.txt"


def test_dashboard_vllm_names_exist_in_the_real_engines_metrics_text() -> None:
    # The engine's /metrics saved from the real CPU engine (vLLM 0.32); the integration test
    # tests/integration/test_dashboards.py checks the same names against a running engine.
    if not VLLM_METRICS.exists():
        pytest.skip(f"{VLLM_METRICS} not saved yet")
    exported = {line.split("{")[0].split(" ")[0] for line in VLLM_METRICS.read_text().splitlines()
                if line.startswith("vllm:")}
    used = {m.group(1) for _, expr in _dashboard_exprs()
            for m in re.finditer(r"\b(vllm:[a-z0-9_:]+)\b", expr)}
    assert used, "no vllm metrics in the dashboards?"
    assert used <= exported, sorted(used - exported)


# --- scrape targets, recipe targets, runbooks ----------------------------------------------------


def test_every_scrape_job_has_a_target_down_alert() -> None:
    jobs = {c["job_name"] for c in yaml.safe_load((PROM / "prometheus.yml").read_text())["scrape_configs"]}
    assert jobs == {"appliance-controller", "appliance-gateway", "vllm-engine"}
    exprs = [" ".join(r["expr"].split()) for r in _rules() if "alert" in r]
    for job in jobs:
        assert any(f'up{{job="{job}"}} == 0' in e for e in exprs), job


def test_memory_stat_panels_compare_against_the_running_recipes_target() -> None:
    # A fixed byte threshold is one host's value (recipe C's 2.35 GiB on the reference host); the
    # colours follow the running recipe's target gauge instead, as the alert does.
    doc = json.loads((MON / "grafana" / "dashboards" / "host-memory.json").read_text())
    memory_stats = [p for p in doc["panels"] if p["type"] == "stat"
                    and any("memory_available" in t["expr"] for t in p["targets"])]
    assert len(memory_stats) == 2
    for panel in memory_stats:
        assert all("appliance_launch_memory_available_target_bytes" in t["expr"] for t in panel["targets"])
        steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
        assert [s["value"] for s in steps] == [None, 0], panel["title"]
    target_alert = next(r for r in _rules() if r.get("alert") == "ApplianceMemAvailableBelowRecipeTarget")
    assert "appliance_launch_memory_available_target_bytes" in target_alert["expr"]
    assert not re.search(r"\d{6,}", target_alert["expr"])


def _cli_commands() -> set[str]:
    import typer

    from controller.cli import main

    if not main.app.registered_commands and not main.app.registered_groups:
        main._register()
    return set(getattr(typer.main.get_command(main.app), "commands", {}))


def test_runbooks_name_commands_that_exist() -> None:
    commands = _cli_commands()
    for rule in _rules():
        runbook = rule.get("annotations", {}).get("runbook", "")
        for name in re.findall(r"`appliance ([a-z-]+)", runbook):
            assert name in commands, (rule.get("alert"), name)
    fatal = next(r for r in _rules() if r.get("alert") == "ApplianceEngineFatal")["annotations"]["runbook"]
    # `appliance engine status` is the engine install check, not where a failed launch is explained.
    assert "appliance engine status" not in fatal
    for command in ("`appliance status`", "`appliance launches ID`", "`appliance doctor`"):
        assert command in fatal


# --- dashboards without false signals -------------------------------------------------------------


def _docs() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in DASHBOARDS}


def test_gpu_panels_sit_in_collapsed_rows() -> None:
    # A CPU host has no appliance_gpu_* series: open GPU panels are a screen of "No data".
    for name, doc in _docs().items():
        for panel in doc["panels"]:  # the top level: what Grafana draws open
            exprs = [t["expr"] for t in panel.get("targets", [])]
            assert not any("appliance_gpu_" in e for e in exprs), (name, panel["title"])
        for row in (p for p in doc["panels"] if p["type"] == "row" and p.get("panels")):
            assert row["collapsed"] is True, (name, row["title"])
    gpu = [p["title"] for doc in _docs().values() for p in query_panels(doc)
           if any("appliance_gpu_" in t["expr"] for t in p["targets"])]
    assert len(gpu) == 11, gpu  # all of them still there, only folded away


# Gauges that are only ever 0 or 1: a stat of one of them says what the number means.
ZERO_ONE = ("appliance_gateway_upstream_ready", 'up{job="vllm-engine"}', "appliance_gpu_row_remap_pending")


def test_zero_one_stats_have_value_mappings() -> None:
    seen = []
    for name, doc in _docs().items():
        for panel in query_panels(doc):
            if panel["type"] not in ("stat", "gauge"):
                continue
            if any(any(m in t["expr"] for m in ZERO_ONE) for t in panel["targets"]):
                seen.append(panel["title"])
                mappings = panel["fieldConfig"]["defaults"].get("mappings") or []
                texts = {o for m in mappings for o in m.get("options", {})}
                assert {"0", "1"} <= texts, (name, panel["title"])
    assert len(seen) >= 4, seen


def test_counts_and_ratios_that_are_zero_on_a_healthy_system_say_zero() -> None:
    # A series that appears only with the first event (a 5xx, a restart) leaves "No data" on a healthy
    # system unless the query falls back to 0.
    docs = _docs()
    by_title = {(n, p["title"]): p for n, d in docs.items() for p in query_panels(d)}
    for key in (("gateway.json", "5xx error ratio"), ("engine-startup.json", "Restarts (range)"),
                ("overview.json", "5xx ratio"), ("overview.json", "Restarts (24 h)")):
        assert all(t["expr"].rstrip().endswith("or vector(0)") for t in by_title[key]["targets"]), key


def test_elapsed_against_the_ready_budget_stops_at_ready() -> None:
    doc = _docs()["engine-startup.json"]
    panel = next(p for p in query_panels(doc) if p["title"].startswith("Elapsed vs ready budget"))
    elapsed = next(t["expr"] for t in panel["targets"] if "time()" in t["expr"])
    assert 'and on() (appliance_engine_state{state="starting"} == 1)' in elapsed


# Exported series that no dashboard shows, each with why.
NOT_ON_A_DASHBOARD = {
    "appliance_gpu_health_blind_facts": "a diagnosis detail: the GPU health verdict sums it up",
    "appliance_gpu_kernel_event_fatal_timestamp_seconds": "the fatal-event alert; the events panel",
    "appliance_oom_last_kill_timestamp_seconds": "the OOM annotations and kill panels show the same events",
    "appliance_choice_candidates": "a choice's record (`appliance choose`), one run at a time",
    "appliance_choice_duration_seconds": "a choice's record (`appliance choose`)",
    "appliance_choice_running": "a choice's record (`appliance choose`)",
    "appliance_bench_last_timestamp_seconds": "the evaluation dashboard shows the bench results themselves",
    "appliance_gateway_upstream_retries": "a detail of the gateway's pool (upstream errors are shown)",
    "appliance_gateway_gc_frozen_objects": "a start-up constant of the gateway process",
    "appliance_gateway_gc_pause_seconds": "a gateway benchmark's concern (bench/), not an operator's",
    "appliance_choice_runs": "a choice's record (`appliance choose`); alerted on",
    "appliance_gateway_usage_store_errors": "alerted on (ApplianceGatewayUsageStoreFailing), with the fix",
    "appliance_gpu_health_finding": "alerted on by finding; the GPU health verdict panel sums them up",
    "appliance_gpu_lost": "alerted on (ApplianceGpuLost); the GPU health verdict panel says refuse",
    "appliance_kmsg_lost_records": "alerted on (ApplianceKernelLogRecordsLost)",
}


def test_every_exported_series_is_on_a_dashboard_or_named_with_why() -> None:
    registries = (ControllerMetrics().registry, GatewayMetrics().registry)
    families = {m.name for r in registries for m in r.collect()}
    text = "\n".join(t["expr"] for d in _docs().values() for p in query_panels(d) for t in p["targets"])
    shown = {f for f in families if re.search(re.escape(f) + r"(_total|_bucket|_sum|_count)?\b", text)}
    missing = sorted(families - shown - set(NOT_ON_A_DASHBOARD))
    assert not missing, missing
    assert not sorted(set(NOT_ON_A_DASHBOARD) & shown), "shown now: drop it from NOT_ON_A_DASHBOARD"


def test_key_legends_name_the_key_through_the_info_metric() -> None:
    doc = _docs()["gateway.json"]
    by_key = [t for p in query_panels(doc) for t in p["targets"] if "by (key_id" in t["expr"]]
    assert by_key
    for t in by_key:
        assert "group_left(name) appliance_gateway_key_info" in t["expr"], t["expr"]
        assert "{{name}}" in t["legendFormat"], t

