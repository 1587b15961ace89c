"""Bench, fingerprint and choose (the gate) against the real vLLM CPU engine, through a real controller.

One controller and one engine start are shared by the whole module (CPU is scarce), and the
scenarios run in order: a bench of the running eager recipe; a fingerprint, a restart and a second
fingerprint (across-restart evidence); `appliance choose` in fast mode over the eager baseline and a
candidate whose context is half the baseline's (so its long-tier requests fail mid-run → reject, the
gate stored whole, the host back on the baseline); a bench whose output length leaves no tier
(refused, nothing stored); and a bench with the engine stopped (refused, nothing stored). The gate
runs the whole protocol (appliance/evaluation/protocol.py) at its smallest: the smoke request on both
arms, one discarded warm-up request per tier, the baseline's accuracy, and no candidate accuracy (its
throughput steps fail). Request counts and output lengths are small; nothing asserts on the model's
words or on timings.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from controller.evaluation.choices import FAST_OUTPUT_TOKENS
from tests.integration.controller_harness import (
    REPO,
    START_LIVENESS_S,
    TOKEN,
    Controller,
    engine_recipe,
    free_port,
    recipe_dirs,
    require_engine,
    serving,
)

pytestmark = [pytest.mark.engine, pytest.mark.slow]
BASE, SHORT = "itest-eval-eager", "itest-eval-short"
SMALL = ["--requests", "5", "--concurrency", "5", "--output-tokens", "8", "--ignore-eos"]


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    require_engine()
    home, recipes = recipe_dirs(tmp_path_factory.mktemp("evaluation"), "cpu-smollm2", "cpu-smollm2-eager")
    engine_port = free_port()
    (recipes / f"{BASE}.yaml").write_text(engine_recipe(
        BASE, "cpu-smollm2-eager", engine_port,
        engine={"max_model_len": 1024}, expect={"reproducibility": "bitwise"},
    ))
    # Half the baseline's context: the baseline-planned 16-32K tier (508-1016 tokens) cannot fit.
    (recipes / f"{SHORT}.yaml").write_text(
        f"name: {SHORT}\nextends: {BASE}\nengine:\n  max_model_len: 512\n"
    )
    with serving(Controller(home, recipes, free_port(), engine_port, recipe=BASE)) as c:
        yield c


def _cli(c: Controller, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "APPLIANCE_HOME": str(c.home),
        "APPLIANCE_ADMIN_TOKEN": TOKEN,
        "APPLIANCE_RECIPES": str(c.recipes),
    }
    return subprocess.run(
        [sys.executable, "-m", "controller.cli.main", *args, "--api", c.url],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _rows(c: Controller, table: str) -> list[dict[str, Any]]:
    db = sqlite3.connect(c.home / "appliance.sqlite3")
    db.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in db.execute(f"SELECT * FROM {table} ORDER BY created_at")]
    except sqlite3.OperationalError:
        return []  # the table does not exist yet: nothing was ever stored
    finally:
        db.close()


@pytest.mark.timeout(3600)
def test_bench_measures_every_tier_prints_streams_and_stores_tied_to_the_launch(
    controller: Controller,
) -> None:
    launch = controller.wait_ready(START_LIVENESS_S)["launch"]
    out = controller.home / "b.json"
    r = _cli(controller, "bench", *SMALL, "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "4-8K: 5/5" in r.stderr and "16-32K: 5/5" in r.stderr  # progress, request by request
    assert "score 0.20·thr(4-8K)+0.50·thr(8-16K)+0.30·thr(16-32K)" in r.stdout
    assert "scaled ×" in r.stdout  # the 1024-token context: the rule is stated
    result = json.loads(out.read_text())
    assert result["launch_id"] == launch["id"] and result["recipe"] == BASE
    assert result["spec_hash"] and result["cache_root"]
    assert [t["tier"]["name"] for t in result["tiers"]] == ["4-8K", "8-16K", "16-32K"]
    for tier in result["tiers"]:
        assert len(tier["requests"]) == 5
        assert all(q["ok"] and q["output_tokens"] == 8 and q["ttft_ms"] > 0 for q in tier["requests"])
        lengths = [q["input_tokens"] for q in tier["requests"]]
        assert all(tier["tier"]["lo"] <= n <= tier["tier"]["hi"] for n in lengths)
    assert result["tiers"][2]["tier"]["hi"] + 8 <= 1024
    ss = result["single_stream"]
    assert (
        len(ss["decode_ms_samples"]) >= 5
        and len(ss["ttft_ms_by_input"]) == 2
        and ss["conc8_tokens_per_s"] > 0
    )
    stored = _rows(controller, "eval_benchmarks")
    assert [s["id"] for s in stored] == [result["id"]]
    assert stored[0]["failed"] == 0 and stored[0]["score"] > 0 and stored[0]["launch_id"] == launch["id"]


@pytest.mark.timeout(3600)
def test_fingerprint_then_restart_compares_the_streams_across_restarts(controller: Controller) -> None:
    first_launch = controller.wait_ready(START_LIVENESS_S)["launch"]["id"]
    r = _cli(
        controller, "fingerprint", "--max-tokens", "12", "--restart", "--json", "--ready-timeout", "1500"
    )
    assert r.returncode == 0, r.stderr
    runs = json.loads(r.stdout)
    assert len(runs) == 2
    one, two = runs
    assert one["launch_id"] == first_launch and two["launch_id"] != first_launch
    for run in runs:
        fp = run["fingerprint"]
        assert len(fp["serial_set_hash"]) == 64 and len(fp["stream_hashes"]) == 8
        assert run["measured"] in (
            "bitwise-reproducible",
            "varies-across-batch",
            "varies-across-restarts",
            "nondeterministic",
        )
        assert run["check"]["declared"] == "bitwise"
    assert one["fingerprint"]["restarts"] is None  # nothing earlier on this cache root in this home
    assert two["fingerprint"]["restart_reference"] == first_launch
    restarts = two["fingerprint"]["restarts"]
    assert restarts["identical"] == (
        one["fingerprint"]["serial_set_hash"] == two["fingerprint"]["serial_set_hash"]
    )
    # A mismatch with the declaration is recorded on the launch (`appliance launches ID`).
    events = [e["kind"] for e in controller.get(f"/launches/{two['launch_id']}")["events"]]
    assert ("reproducibility-mismatch" in events) == two["check"]["mismatch"]
    assert len(_rows(controller, "eval_fingerprints")) == 2


@pytest.mark.timeout(3600)
def test_choose_in_fast_mode_gates_a_candidate_failing_mid_run_stores_it_whole_and_returns(
    controller: Controller,
) -> None:
    """`appliance choose` in FAST MODE over the two recipes of this module (--recipes narrows it; the
    platform's others are lines of the record, not tried): the eager baseline, then the candidate
    whose context is half the baseline's — its long-tier requests fail mid-run, so its gate ends at the
    first five (no re-runs, no candidate accuracy run: the shortest real gate). The gate it runs is the
    compare protocol, stored whole (the comparison, both benches tied to it, the gate's steps); then the
    host is back on the recipe that was serving. One tournament carries what a separate `compare` run
    asserted here before (the same runner, an engine start and a whole baseline bench fewer: the CI
    machine ran out of time); `appliance compare`'s own CLI and API are unit-tested over the protocol."""
    controller.wait_ready(START_LIVENESS_S)
    before = len(_rows(controller, "eval_benchmarks"))
    choose = ("choose", "--recipes", "itest-eval-*", "--baseline", BASE, "--fast", "--platform", "cpu")
    plan = _cli(controller, *choose, "--plan")
    assert plan.returncode == 0, plan.stderr
    assert "FAST MODE" in plan.stdout and "expected duration" in plan.stdout

    # An SLA every answer of this engine holds (an hour): it is measured on each arm, never decides here.
    r = _cli(controller, *choose, "--sla", "ttft=3600000", "--yes", "--json", "--ready-timeout", "1500",
             timeout=3000)
    assert r.returncode == 0, r.stderr + r.stdout
    record = json.loads(r.stdout)
    assert record["fast"] is True and record["state"] == "done", record
    lines = {x["recipe"]: x for x in record["lines"]}
    assert lines[BASE]["status"] == "baseline"
    cand = lines[SHORT]
    # the candidate was gated against the baseline: a stored compare, a verdict, a loss (its long tier failed)
    assert (cand["status"], cand["against"], cand["verdict"]) == ("lost", BASE, "reject"), cand
    assert cand["comparison_id"] and cand["took_s"] is not None and cand["eta_s"] is not None
    # the bound, measured from each arm's runs: the baseline holds it; the candidate's failed tier has
    # nothing measured, which counts as a breach, never a pass
    assert record["settings"]["sla"] == {"ttft_p99_ms": 3600000.0, "tpot_p99_ms": None}
    assert lines[BASE]["sla"] == [] and any("16-32K: not measured" in b for b in cand["sla"]), cand
    # the other recipes of the platform are lines too, each with why it was not tried
    for name in ("cpu-smollm2", "cpu-smollm2-eager"):
        assert lines[name]["status"] == "not-tried" and "pattern" in lines[name]["why"]
    assert (record["champion"], record["champion_verdict"]) == (BASE, None)
    assert record["champion_why"].startswith("the baseline")
    # the host is back on the recipe that was serving (no --promote)
    assert record["serving_before"] == BASE and record["restored"] == BASE and record["promoted"] is None
    status = controller.status()
    assert (status["state"], status["recipe"]) == ("ready", BASE)

    # the gate, stored whole: one comparison, its steps, both arms' benches tied to it
    comparisons = _rows(controller, "eval_comparisons")
    assert [c["id"] for c in comparisons] == [cand["comparison_id"]] and comparisons[0]["verdict"] == "reject"
    steps = {s["name"]: s for s in json.loads(comparisons[0]["gate_json"])["steps"]}
    assert list(steps) == ["proof", "smoke", "first-five", "re-runs", "score", "accuracy"]
    assert steps["proof"]["status"] == "pass"  # declared markers: enforce_eager=True, the CPU KV cache
    assert steps["smoke"]["status"] == "pass", steps["smoke"]  # the 8-16K request fits the short context
    assert steps["first-five"]["status"] == "fail"
    assert steps["accuracy"]["status"] == "skipped" and "throughput" in steps["accuracy"]["reasons"][0]
    benches = _rows(controller, "eval_benchmarks")[before:]
    assert sorted(b["recipe"] for b in benches) == [BASE, SHORT]
    assert all(b["comparison_id"] == cand["comparison_id"] for b in benches)
    short = json.loads(next(b for b in benches if b["recipe"] == SHORT)["result_json"])
    failed_tiers = [t["tier"]["name"] for t in short["tiers"] if any(not q["ok"] for q in t["requests"])]
    assert failed_tiers == ["16-32K"]
    assert all(not q["ok"] for q in short["tiers"][-1]["requests"])  # the whole 16-32K tier, nothing earlier
    # each arm's run as the protocol stores it: the smoke checked against the log with the engine alive
    # after it, one discarded warm-up per tier, the fast mode's output limits; accuracy on the baseline
    # only (the candidate's throughput steps failed)
    base_run = json.loads(next(b for b in benches if b["recipe"] == BASE)["result_json"])
    for run in (base_run, short):
        assert run["smoke"]["log_checked"] and run["smoke"]["alive_after"] and run["smoke"]["request"]["ok"]
        assert [w["tier"] for w in run["warmup"]] == ["warmup:4-8K", "warmup:8-16K", "warmup:16-32K"]
        assert run["settings"]["output_limits"] == {"max_tokens": FAST_OUTPUT_TOKENS, "ignore_eos": False}
    assert sorted(i["kind"] for i in base_run["accuracy"]["items"]) == [
        "keyword_aggregation", "multihop_qa", "retrieval_multi_point", "summarization"]
    assert short["accuracy"] is None
    stored = {c["id"]: c for c in controller.get("/comparisons")}
    assert stored[cand["comparison_id"]]["verdict"] == "reject"

    md = _cli(controller, "choices", record["id"], "--markdown")
    assert md.returncode == 0 and "FAST MODE" in md.stdout and f"| {SHORT} |" in md.stdout
    listed = _cli(controller, "choices")
    assert record["id"] in listed.stdout and "FAST" in listed.stdout


@pytest.mark.timeout(1200)
def test_a_context_that_fits_no_tier_is_refused_and_nothing_is_stored(controller: Controller) -> None:
    controller.wait_ready(START_LIVENESS_S)
    before = len(_rows(controller, "eval_benchmarks"))
    r = _cli(controller, "bench", "--output-tokens", "1000")  # 1024-token context: 24 input tokens left
    assert r.returncode == 2
    assert "NoTierFits" in r.stderr and "no tier fits" in r.stderr and "nothing stored" in r.stderr
    assert len(_rows(controller, "eval_benchmarks")) == before


@pytest.mark.timeout(1200)
def test_an_engine_that_is_not_ready_is_refused_and_nothing_is_stored(controller: Controller) -> None:
    controller.post("/stop")
    controller.wait(lambda: controller.status()["state"] == "idle", 120, "idle")
    before = len(_rows(controller, "eval_benchmarks"))
    r = _cli(controller, "bench", *SMALL)
    assert r.returncode == 2
    assert "EngineNotReady" in r.stderr and "idle" in r.stderr
    r = _cli(controller, "bench", "--engine-url", f"http://127.0.0.1:{controller.engine_port}", *SMALL)
    assert r.returncode == 2 and "EngineNotReady" in r.stderr
    assert len(_rows(controller, "eval_benchmarks")) == before
