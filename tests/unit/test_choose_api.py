"""`POST /choices`, `GET /choices[/{id}]` on the admin API: auth, the plan's shape over the shipped
recipes on the reference host's fixture tree, bad input as 422 with the reason, one at a time (409),
the record as JSON and Markdown. The driver is test_api.py's rig (fake runtime/prober at the
declared seams, so an arm never gets ready here: the gate fails its start, which the record says)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.unit import test_api as _api
from tests.unit.test_api import AUTH, Rig

home, rig, client = _api.home, _api.rig, _api.client

PLAN = {"recipes": "cpu-smollm2*", "platform": "cpu", "dry_run": True}


async def test_choices_need_the_admin_token(client: httpx.AsyncClient) -> None:
    assert (await client.post("/choices", json=PLAN)).status_code == 401
    wrong = await client.post("/choices", json=PLAN, headers={"Authorization": "Bearer no"})
    assert wrong.status_code == 403


async def test_the_plan_lists_every_recipe_of_the_platform_with_why(client: httpx.AsyncClient) -> None:
    r = await client.post("/choices", json=PLAN, headers=AUTH)
    assert r.status_code == 202, r.text
    plan = r.json()
    assert plan["state"] == "plan" and plan["platform"] == "cpu"
    lines = {x["recipe"]: x for x in plan["lines"]}
    # every launchable cpu recipe is a line; only the pattern's were planned
    assert {"cpu-smollm2", "cpu-smollm2-eager", "cpu-tp2"} <= set(lines)
    assert lines["cpu-tp2"]["status"] == "not-tried" and "pattern" in lines["cpu-tp2"]["why"]
    assert plan["baseline"] == "cpu-smollm2-eager" and lines["cpu-smollm2-eager"]["status"] == "baseline"
    assert lines["cpu-smollm2"]["status"] == "planned" and lines["cpu-smollm2"]["eta_s"] > 0
    assert "eager before compiled modes" in plan["rule"]
    assert (await client.get("/choices")).json() == []  # a plan claims nothing


@pytest.mark.parametrize(
    "body, words",
    [
        ({"recipes": "nothing-*"}, "matches no recipe of platform cpu"),
        ({"recipes": "cpu-smollm2*", "baseline": "cpu-no-such"}, "not among the recipes"),
        ({"recipes": "cpu-smollm2*", "budget": "5s"}, "too small for one arm"),
        ({"recipes": "cpu-smollm2*", "budget": "two hours"}, "say it like"),
    ],
)
async def test_bad_input_is_422_with_the_reason(client: httpx.AsyncClient, body: dict[str, object],
                                                words: str) -> None:
    r = await client.post("/choices", json={**body, "platform": "cpu"}, headers=AUTH)
    assert r.status_code == 422 and words in r.json()["detail"], r.text


async def test_bad_bodies_are_422(client: httpx.AsyncClient) -> None:
    for body in ({"recipes": "../x"}, {"force": True}, {"platform": "tpu"}):
        assert (await client.post("/choices", json=body, headers=AUTH)).status_code == 422


async def test_a_choice_runs_in_the_controller_one_at_a_time_and_leaves_a_record(
    rig: Rig, client: httpx.AsyncClient
) -> None:
    body = {"recipes": "cpu-smollm2,cpu-smollm2-eager", "platform": "cpu", "ready_timeout_s": 0.5,
            "fast": True}
    started = await client.post("/choices", json=body, headers=AUTH)
    assert started.status_code == 202, started.text
    cid = started.json()["id"]
    second = await client.post("/choices", json=body, headers=AUTH)
    assert second.status_code == 409 and cid in second.json()["detail"]
    compare = {"baseline": "cpu-smollm2", "candidate": "cpu-smollm2-eager"}
    assert (await client.post("/compare", json=compare, headers=AUTH)).status_code == 409
    for _ in range(400):
        record = (await client.get(f"/choices/{cid}")).json()
        if record["state"] != "running":
            break
        await asyncio.sleep(0.05)
    # the fake runtime never gets ready: the champion's start fails, said in the record
    assert record["state"] == "failed", record
    assert record["ended_why"].startswith("the champion cpu-smollm2-eager failed to start: ")
    lines = {x["recipe"]: x for x in record["lines"]}
    assert lines["cpu-smollm2"]["status"] == "error" and "not gated" in lines["cpu-smollm2"]["why"]
    assert record["fast"] is True
    listed = (await client.get("/choices")).json()
    assert [r["id"] for r in listed] == [cid]
    md = await client.get(f"/choices/{cid}?format=markdown")
    assert md.headers["content-type"].startswith("text/markdown") and "FAST MODE" in md.text
    assert "| cpu-smollm2 |" in md.text
    events = (await client.get(f"/choices/{cid}/events")).json()
    assert events["state"] == "failed" and events["events"][-1]["phase"] == "end"
    assert (await client.get("/choices/choice-nope")).status_code == 404


async def test_a_sweep_plan_admits_each_variant_and_runs_it_before_the_tournament(
    rig: Rig, client: httpx.AsyncClient
) -> None:
    body = {**PLAN, "recipes": "cpu-smollm2,cpu-smollm2-eager", "sweep": {"max_num_seqs": [4, 8]}}
    r = await client.post("/choices", json=body, headers=AUTH)
    assert r.status_code == 202, r.text
    plan = r.json()
    sweep = [(x["recipe"], x["status"], x["sweep_of"], x["point"])
             for x in plan["lines"] if x["stage"] == "sweep"]
    assert sweep == [
        ("cpu-smollm2-eager.sweep.mns4", "baseline", "cpu-smollm2-eager", {"max_num_seqs": 4}),
        ("cpu-smollm2-eager.sweep.mns8", "planned", "cpu-smollm2-eager", {"max_num_seqs": 8}),
        ("cpu-smollm2.sweep.mns4", "baseline", "cpu-smollm2", {"max_num_seqs": 4}),
        ("cpu-smollm2.sweep.mns8", "planned", "cpu-smollm2", {"max_num_seqs": 8}),
    ]
    variants = [x for x in plan["lines"] if x["stage"] == "sweep"]
    # each variant went through the same admission as a recipe: its numbers and its own spec hash
    assert all(x["admission"] in ("admit", "warn") and x["margin_gib"] is not None for x in variants)
    assert len({x["spec_hash"] for x in variants}) == 4
    assert plan["sweep"] == {"max_num_seqs": [4, 8]}
    generated = rig.preflight.generated_dir
    assert generated is not None and not generated.exists()  # a plan writes nothing
    started = await client.post("/choices", json={**body, "dry_run": False, "ready_timeout_s": 0.5},
                                headers=AUTH)
    assert started.status_code == 202, started.text
    assert sorted(p.name for p in generated.iterdir()) == [
        "cpu-smollm2-eager.sweep.mns4.yaml", "cpu-smollm2-eager.sweep.mns8.yaml",
        "cpu-smollm2.sweep.mns4.yaml", "cpu-smollm2.sweep.mns8.yaml"]
    # written, they are recipes the controller launches by name, with the spec hash the plan admitted
    planned = {x["recipe"]: x["spec_hash"] for x in variants}
    for name, spec_hash in planned.items():
        assert rig.preflight.plan(name)[2].spec_hash == spec_hash
    for _ in range(400):
        record = (await client.get(f"/choices/{started.json()['id']}")).json()
        if record["state"] != "running":
            break
        await asyncio.sleep(0.05)
    # the fake runtime never gets ready: the first sweep's champion fails to start, said in the record
    assert record["state"] == "failed"
    assert "cpu-smollm2-eager.sweep.mns4 failed to start" in record["ended_why"]
    # a later choice surveys the recipes as written, not an earlier sweep's variants
    later = (await client.post("/choices", json=PLAN, headers=AUTH)).json()
    assert not [x["recipe"] for x in later["lines"] if ".sweep." in x["recipe"]]


@pytest.mark.parametrize(
    "sweep, words",
    [
        ({"temperature": [0, 1]},
         "only max_num_seqs and max_num_batched_tokens may be swept (rule: sweep-field"),
        ({"max_num_seqs": []}, "no values (rule: sweep-empty)"),
        ({"max_num_seqs": [8, 8]}, "listed twice (rule: sweep-duplicate)"),
        ({"max_num_seqs": [-1]}, "out of range; each value is 1..1048576 (rule: sweep-value)"),
        ({"max_num_seqs": list(range(1, 10))}, "the cap is 8 (rule: sweep-too-large)"),
    ],
)
async def test_a_bad_sweep_is_422_naming_the_field_and_the_rule(
    client: httpx.AsyncClient, sweep: dict[str, list[int]], words: str
) -> None:
    r = await client.post("/choices", json={**PLAN, "sweep": sweep}, headers=AUTH)
    assert r.status_code == 422 and words in r.json()["detail"], r.text
    wrong_type = await client.post("/choices", json={**PLAN, "sweep": {"max_num_seqs": ["64"]}}, headers=AUTH)
    assert wrong_type.status_code == 422


async def test_promote_through_the_api_applies_the_champion_or_says_why_not(
    rig: Rig, client: httpx.AsyncClient
) -> None:
    from controller.evaluation.choice_store import ChoiceStore
    from tests.unit.test_console_choices import _record

    store = ChoiceStore(rig.store.path)
    for record in (_record("choice-ok"), _record("choice-full", verdict="accept-pending-full")):
        assert store.claim(record.model_copy(update={"state": "running"})) is None
        store.save(record)
    assert (await client.post("/choices/choice-ok/promote")).status_code == 401
    assert (await client.post("/choices/choice-nope/promote", headers=AUTH)).status_code == 404
    refused = await client.post("/choices/choice-full/promote", headers=AUTH)
    assert refused.status_code == 409 and "ACCEPT-PENDING-FULL" in refused.json()["detail"]
    done = await client.post("/choices/choice-ok/promote", headers=AUTH)
    assert done.status_code == 200, done.text
    assert (done.json()["promoted"], done.json()["promoted_via"]) == ("cpu-smollm2-eager", "the API")
    assert store.get("choice-full").promoted is None  # type: ignore[union-attr]


async def test_an_sla_is_in_the_plan_and_a_bad_one_is_422_naming_the_field(client: httpx.AsyncClient) -> None:
    r = await client.post("/choices", json={**PLAN, "sla": {"ttft_p99_ms": 2000, "tpot_p99_ms": 80}},
                          headers=AUTH)
    assert r.status_code == 202, r.text
    assert r.json()["settings"]["sla"] == {"ttft_p99_ms": 2000, "tpot_p99_ms": 80}  # a resume keeps it
    for sla, words in (({}, "at least one bound"), ({"ttft_p99_ms": 0}, "greater than 0"),
                       ({"ttft_p99_ms": "2000"}, "ttft_p99_ms"), ({"p50_ms": 10}, "p50_ms")):
        bad = await client.post("/choices", json={**PLAN, "sla": sla}, headers=AUTH)
        assert bad.status_code == 422 and words in bad.text, bad.text
