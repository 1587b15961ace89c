"""The evaluation routes of the admin API and the evaluation store: auth, refusals, progress over
SSE, nothing half-written, and the stored results as Prometheus metrics.

The driver is test_api.py's rig (fake runtime/prober at the declared seams); the store is real SQLite.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import httpx
import pytest

from appliance.evaluation.fingerprint import Comparison, Fingerprint, check_declared
from appliance.evaluation.gate import decide
from controller.evaluation.store import EvalStore
from controller.metrics import ControllerMetrics
from tests.unit import test_api as _api
from tests.unit.test_api import AUTH, Rig
from tests.unit.test_gate import _result

# test_api.py's fixtures, shared
home, rig, client = _api.home, _api.rig, _api.client

BODY = {"baseline": "cpu-smollm2", "candidate": "cpu-smollm2-eager", "ready_timeout_s": 1}


async def test_compare_needs_the_admin_token(client: httpx.AsyncClient) -> None:
    assert (await client.post("/compare", json=BODY)).status_code == 401
    wrong = await client.post("/compare", json=BODY, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 403


@pytest.mark.parametrize(
    "body, field",
    [
        ({**BODY, "candidate": "cpu-smollm2"}, None),
        ({**BODY, "requests_per_tier": 3}, "requests_per_tier"),  # the first five at least (DOMAIN §7)
        ({**BODY, "force": True}, "force"),
        ({**BODY, "baseline": "../etc"}, "baseline"),
    ],
)
async def test_bad_compare_bodies_are_422(
    client: httpx.AsyncClient,
    body: dict[str, object],
    field: str | None,
) -> None:
    r = await client.post("/compare", json=body, headers=AUTH)
    assert r.status_code == 422
    if field:
        assert field in json.dumps(r.json()["detail"])


async def test_a_compare_whose_arm_never_gets_ready_fails_with_its_reason_and_stores_nothing(
    rig: Rig, client: httpx.AsyncClient
) -> None:
    started = await client.post("/compare", json=BODY, headers=AUTH)
    assert started.status_code == 202
    job = started.json()["id"]
    assert (await client.post("/compare", json=BODY, headers=AUTH)).status_code == 409  # one at a time
    events: list[tuple[str, dict[str, object]]] = []
    async with client.stream("GET", f"/compare/{job}/events") as resp:
        kind = ""
        async for line in resp.aiter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                events.append((kind, json.loads(line[6:])))
    phases = [data.get("phase") for kind, data in events if kind == "progress"]
    assert phases[0] == "switch" and phases[-1] == "failed"
    end = events[-1]
    assert end[0] == "end" and end[1]["state"] == "failed"
    assert "not ready within" in str(end[1]["error"]) and "nothing stored" in str(end[1]["error"])
    assert (await client.get(f"/compare/{job}")).json()["state"] == "failed"
    assert (await client.get("/benchmarks")).json() == []
    assert (await client.get("/comparisons")).json() == []
    assert rig.driver.machine.recipe == "cpu-smollm2"  # the switch really went to the supervisor


async def test_stored_results_are_listed_shown_and_exported_as_metrics(
    rig: Rig, client: httpx.AsyncClient
) -> None:
    evals = EvalStore(rig.store.path)
    base, cand = _result("cpu-smollm2"), _result("cpu-smollm2-eager", duration_s=(9, 9, 9))
    evals.add_comparison("cmp-1", [base], [cand], decide(base, cand))
    listed = (await client.get("/benchmarks")).json()
    assert {r["recipe"] for r in listed} == {"cpu-smollm2", "cpu-smollm2-eager"}
    assert all(r["comparison_id"] == "cmp-1" for r in listed)
    shown = (await client.get(f"/benchmarks/{base.id}")).json()
    assert len(shown["tiers"]) == 3 and shown["tiers"][0]["requests"][0]["text"] == "text 0"
    assert (await client.get("/benchmarks/nope")).status_code == 404
    assert (await client.get("/comparisons")).json()[0]["verdict"] == "accept"
    body = (await client.get("/metrics")).text
    assert f'appliance_bench_score{{recipe="cpu-smollm2-eager"}} {cand.score}' in body
    assert 'appliance_bench_p99_ttft_seconds{recipe="cpu-smollm2"} 0.' in body


def _fp(identical_restart: bool) -> Fingerprint:
    restart = Comparison(identical=identical_restart, differing={} if identical_restart else {2: 4})
    return Fingerprint(
        prompt_set="ps-v1",
        max_tokens=8,
        max_num_seqs=None,
        concurrency=4,
        serial_set_hash="s",
        concurrent_set_hash="c",
        stream_hashes=["h"],
        repeats=Comparison(identical=True),
        batch=Comparison(identical=True),
        restarts=restart,
        restart_reference="L1",
    )


def test_a_fingerprint_mismatch_is_a_metric(tmp_path: Path) -> None:
    evals = EvalStore(tmp_path / "db.sqlite3")
    fp = _fp(identical_restart=False)
    evals.add_fingerprint("fp-1", "L2", "b", "h1", "/c", "warm", fp, [[1, 2]], check_declared("bitwise", fp))
    metrics = ControllerMetrics()
    metrics.set_evaluation_source(evals.latest_by_recipe)
    body = metrics.render()[0].decode()
    assert 'appliance_reproducibility_mismatch{measured="varies-across-restarts",recipe="b"} 1.0' in body


def test_restart_reference_is_the_same_variant_and_root_from_another_launch(tmp_path: Path) -> None:
    evals = EvalStore(tmp_path / "db.sqlite3")
    fp = _fp(identical_restart=True)
    evals.add_fingerprint("fp-1", "L1", "r", "h1", "/root", "cold", fp, [[1, 2, 3]], None)
    evals.add_fingerprint("fp-2", "L9", "r", "OTHER", "/root", "cold", fp, [[9]], None)
    assert evals.restart_reference("r", "h1", "/root", "ps-v1", 8, "L2") == ("L1", [[1, 2, 3]])
    assert evals.restart_reference("r", "h1", "/root", "ps-v1", 8, "L1") is None  # not itself
    assert evals.restart_reference("r", "h1", "/elsewhere", "ps-v1", 8, "L2") is None
    assert evals.restart_reference("r", "h1", "/root", "ps-v1", 16, "L2") is None  # other stream length


def test_a_comparison_is_stored_whole_or_not_at_all(tmp_path: Path) -> None:
    evals = EvalStore(tmp_path / "db.sqlite3")
    base, cand = _result("a"), _result("b")
    evals.add_benchmark(cand)  # the candidate's id now exists: the compare's insert of it must fail
    with pytest.raises(sqlite3.IntegrityError):
        evals.add_comparison("cmp-x", [base], [cand], decide(base, cand))
    assert [r["id"] for r in evals.benchmarks()] == [cand.id]  # the baseline row was rolled back
    assert evals.comparisons() == []


def test_the_store_lives_beside_the_launch_records_without_touching_their_schema(tmp_path: Path) -> None:
    from controller.store import SCHEMA_VERSION, Store

    path = tmp_path / "appliance.sqlite3"
    launches = Store(path)
    EvalStore(path).add_benchmark(_result("a"))
    assert launches.schema_version() == SCHEMA_VERSION
    assert Store(path).schema_version() == SCHEMA_VERSION  # reopened: still the launch store's version
