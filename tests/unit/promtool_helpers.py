"""One promtool check for the MemAvailable-below-recipe-target alert, fed from what the controller
exports (tests/unit/test_recipe_target.py drives the driver, test_service_metrics.py the whole service)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "monitoring" / "prometheus" / "rules" / "appliance.rules.yml"
TARGET = "appliance_launch_memory_available_target_bytes"
AVAILABLE = "appliance_host_memory_available_bytes"
ALERT = "ApplianceMemAvailableBelowRecipeTarget"
PROMTOOL = shutil.which("promtool")


def assert_mem_target_alert_fires(tmp_path: Path, metrics_text: str, recipe: str) -> None:
    """The target and MemAvailable series in `metrics_text` (a host at 2.35 GiB) make the alert
    fire for `recipe` after its `for:`, and not before."""
    series = []
    for family in text_string_to_metric_families(metrics_text):
        if family.name in (TARGET, AVAILABLE):
            for s in family.samples:
                labels = {**s.labels, "job": "appliance-controller", "instance": "127.0.0.1:8090"}
                body = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                series.append({"series": f"{s.name}{{{body}}}", "values": f"{s.value:.0f}x12"})
    assert len(series) == 2, series
    (tmp_path / "rules.yml").write_text(RULES.read_text())
    rule = next(r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
                if r.get("alert") == ALERT)
    test = {
        "rule_files": ["rules.yml"], "evaluation_interval": "5s",
        "tests": [{"interval": "5s", "input_series": series, "alert_rule_test": [
            {"eval_time": "10s", "alertname": ALERT, "exp_alerts": []},
            {"eval_time": "30s", "alertname": ALERT, "exp_alerts": [
                {"exp_labels": {"severity": "warning", "job": "appliance-controller",
                                "instance": "127.0.0.1:8090", "recipe": recipe},
                 "exp_annotations": {
                     "summary": f"MemAvailable 2.35GiB is under the target of recipe {recipe}",
                     "description": rule["annotations"]["description"],
                     "runbook": rule["annotations"]["runbook"]}}]},
        ]}],
    }
    (tmp_path / "t.yml").write_text(yaml.safe_dump(test))
    assert PROMTOOL is not None
    res = subprocess.run([PROMTOOL, "test", "rules", str(tmp_path / "t.yml")], capture_output=True,
                         text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
