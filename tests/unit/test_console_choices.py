"""The console's Choices pages over real stored records: the list, one record with its table (admission
numbers, gate verdicts, links to the compare records, what was not tried and why) and its per-tier
chart from the stored runs, "Promote" behind a confirm page and the CSRF token (refused with the
reason for an ACCEPT-PENDING-FULL gate, recorded on the choice when accepted), and "Start a choice"
with the plan and its ETA to confirm. The rig is test_console.py's (the real controller app over
test_api.py's fakes); records go through the real choice store."""

from __future__ import annotations

import asyncio
import html
import re

import httpx

from appliance.evaluation.tournament import ChoiceRecord, Line
from controller.evaluation.choice_store import ChoiceStore
from tests.unit import test_console as _console
from tests.unit.test_api import Rig
from tests.unit.test_console import _form_token, login
from tests.unit.test_console_benchmarks import _store

home, rig, client = _console.home, _console.rig, _console.client


def _record(choice_id: str, verdict: str = "accept") -> ChoiceRecord:
    return ChoiceRecord(
        id=choice_id, state="done", platform="cpu", pattern="cpu-smollm2*", baseline="cpu-smollm2",
        champion="cpu-smollm2-eager", champion_verdict=verdict,
        champion_why="won its gate against cpu-smollm2 (accept, comparison cmp-1)", fast=True,
        started_at=1_700_000_000.0, ended_at=1_700_000_600.0, ended_why="every planned candidate was gated",
        serving_before="cpu-smollm2", eta_s=520.0,
        lines=[
            Line(recipe="cpu-smollm2", status="baseline", why="named with --baseline", mode="graph",
                 admission="admit", margin_gib=3.25, numbers={"margin_gib": 3.25, "peak_gib": 2.5}),
            Line(recipe="cpu-smollm2-eager", status="won", why="beat cpu-smollm2 (accept)", mode="eager",
                 admission="admit", margin_gib=4.5, against="cpu-smollm2", verdict=verdict,
                 comparison_id="cmp-1", reasons=["faster"], eta_s=260.0, took_s=250.0),
            Line(recipe="cpu-tp2", status="not-tried", why="not matched by the pattern 'cpu-smollm2*'"),
        ],
    )


def _save(rig: Rig, record: ChoiceRecord) -> None:
    store = ChoiceStore(rig.store.path)
    assert store.claim(record.model_copy(update={"state": "running"})) is None
    store.save(record)
    store.close()


async def test_the_list_and_one_choice_show_the_table_the_links_and_the_chart(
    client: httpx.AsyncClient, rig: Rig
) -> None:
    _store(rig)  # the benches and comparison cmp-1 the record points to
    _save(rig, _record("choice-a"))
    await login(client)
    listed = await client.get("/console/choices")
    assert listed.status_code == 200 and 'href="/console/choices/choice-a"' in listed.text
    assert "FAST MODE" in listed.text and 'id="nav-choices"' in listed.text
    page = await client.get("/console/choices/choice-a")
    assert page.status_code == 200
    text = page.text
    assert "Champion: cpu-smollm2-eager" in text and "won its gate against cpu-smollm2" in text
    assert 'href="/console/comparisons/cmp-1"' in text  # the evidence: the stored compare record
    row = re.search(r'<tr [^>]*id="tournament-cpu-smollm2">(.*?)</tr>', text, re.S)
    assert row and "3.25 GiB" in row.group(1) and "peak_gib: 2.5" in row.group(1)  # admission numbers
    assert "cpu-tp2 (not-tried): not matched by the pattern" in text
    chart = re.search(r'<div id="choice-chart">(.*?)</div>', text, re.S)
    assert chart and "<svg" in chart.group(1) and "cpu-smollm2-eager" in chart.group(1)
    assert 'id="promote"' in text
    assert (await client.get("/console/choices/choice-nope")).status_code == 404


async def test_promote_is_confirmed_needs_the_csrf_token_and_is_recorded(
    client: httpx.AsyncClient, rig: Rig
) -> None:
    _save(rig, _record("choice-b"))
    await login(client)
    confirm = await client.get("/console/choices/choice-b/promote")
    assert confirm.status_code == 200 and 'id="confirm-promote"' in confirm.text
    csrf = _form_token(confirm.text, "csrf")
    forged = await client.post("/console/choices/choice-b/promote", data={"csrf": "forged"})
    assert forged.status_code == 403
    assert ChoiceStore(rig.store.path).get("choice-b").promoted is None  # type: ignore[union-attr]
    done = await client.post("/console/choices/choice-b/promote", data={"csrf": csrf})
    assert done.status_code == 303 and done.headers["location"] == "/console/?notice=applied"
    record = ChoiceStore(rig.store.path).get("choice-b")
    assert record is not None
    assert (record.promoted, record.promoted_via) == ("cpu-smollm2-eager", "the console")
    await rig.step()
    assert rig.driver.status()["recipe"] == "cpu-smollm2-eager"  # the apply went to the supervisor
    page = await client.get("/console/choices/choice-b")
    assert 'id="promoted"' in page.text and "via the console" in page.text


async def test_a_champion_pending_the_full_run_is_not_promoted_and_says_why(
    client: httpx.AsyncClient, rig: Rig
) -> None:
    _save(rig, _record("choice-c", verdict="accept-pending-full"))
    await login(client)
    page = await client.get("/console/choices/choice-c")
    assert 'id="promote"' not in page.text and "ACCEPT-PENDING-FULL" in page.text
    confirm = await client.get("/console/choices/choice-c/promote")
    assert 'id="promote-form"' not in confirm.text and "needs the full run" in confirm.text
    # a valid token: what refuses is the rule, not the form
    csrf = _form_token((await client.get("/console/keys")).text, "csrf")
    refused = await client.post("/console/choices/choice-c/promote", data={"csrf": csrf})
    assert refused.status_code == 409 and "compare --full cpu-smollm2 cpu-smollm2-eager" in refused.text
    assert ChoiceStore(rig.store.path).get("choice-c").promoted is None  # type: ignore[union-attr]
    assert rig.driver.status()["recipe"] != "cpu-smollm2-eager"


async def test_a_choice_with_an_sla_shows_it_and_a_champion_over_it_is_not_promoted(
    client: httpx.AsyncClient, rig: Rig
) -> None:
    over = "P99 TTFT in 16-32K: 2400.0 ms > 2000 ms"
    record = _record("choice-s")
    record.settings = {"sla": {"ttft_p99_ms": 2000.0}}
    record.line("cpu-smollm2-eager").sla = [over]
    _save(rig, record)
    await login(client)
    page = await client.get("/console/choices/choice-s")
    assert 'id="sla"' in page.text and "P99 TTFT ≤ 2000 ms in every tier; the champion breaks it" in page.text
    assert f"over the SLA: {html.escape(over)}" in page.text  # the line's why says it (escaped: the >)
    assert 'id="promote"' not in page.text and "breaks the SLA asked for this choice" in page.text
    csrf = _form_token((await client.get("/console/keys")).text, "csrf")
    refused = await client.post("/console/choices/choice-s/promote", data={"csrf": csrf})
    assert refused.status_code == 409 and "breaks the SLA" in refused.text


async def test_start_a_choice_shows_the_plan_and_its_eta_then_starts_it_with_the_csrf_token(
    client: httpx.AsyncClient, rig: Rig
) -> None:
    await login(client)
    form = await client.get("/console/choices/new")
    assert form.status_code == 200 and 'id="choice-form"' in form.text
    assert 'id="confirm-start"' not in form.text
    query = {"plan": "1", "recipes": "cpu-smollm2,cpu-smollm2-eager", "platform": "cpu", "fast": "true",
             "sweep": "max_num_seqs=4,8"}
    planned = await client.get("/console/choices/new", params=query)
    assert planned.status_code == 200, planned.text
    assert 'id="plan-eta"' in planned.text and "Expected duration" in planned.text
    assert 'id="plan-cpu-smollm2-eager.sweep.mns8"' in planned.text  # the sweep's variants are in the plan
    assert (await client.get("/console/choices")).text.count("choice-row") == 0  # a plan claims nothing
    bad = await client.get("/console/choices/new", params={**query, "sweep": "temperature=0,1"})
    assert bad.status_code == 422 and "rule: sweep-field" in bad.text
    csrf = _form_token(planned.text, "csrf")
    fields = {k: v for k, v in query.items() if k != "plan"}
    assert (await client.post("/console/choices", data={**fields, "csrf": "forged"})).status_code == 403
    started = await client.post("/console/choices", data={**fields, "csrf": csrf})
    assert started.status_code == 303, started.text
    choice_id = started.headers["location"].rsplit("/", 1)[1]
    again = await client.post("/console/choices", data={**fields, "csrf": csrf})
    assert again.status_code == 409 and choice_id in again.text
    for _ in range(400):  # the fake runtime never gets ready: the choice ends, said on its page
        record = ChoiceStore(rig.store.path).get(choice_id)
        if record is not None and record.state != "running":
            break
        await asyncio.sleep(0.05)
    page = await client.get(f"/console/choices/{choice_id}")
    assert page.status_code == 200 and 'id="sweep-grid"' in page.text and "FAST MODE" in page.text


async def test_a_plan_whose_eta_is_over_the_budget_says_the_budget_may_stop_it(
    client: httpx.AsyncClient, rig: Rig
) -> None:
    await login(client)
    # No launch history: 2,100 s an arm; with the sweep three gates are planned, 6,300 s in all.
    query = {"plan": "1", "recipes": "cpu-smollm2,cpu-smollm2-eager", "platform": "cpu",
             "sweep": "max_num_seqs=4,8", "budget": "40m"}
    over = await client.get("/console/choices/new", params=query)
    assert over.status_code == 200, over.text
    note = re.search(r'<span id="budget-note">(.*?)</span>', over.text)
    assert note and note.group(1).startswith("a forecast over the budget: the budget is checked at each")
    assert over.text.count("status-planned") == 3 and "it may not fit" in over.text  # none cut
    within = await client.get("/console/choices/new", params={**query, "budget": "2h"})
    assert within.status_code == 200 and 'id="budget-note"' not in within.text


def test_the_plan_says_where_its_eta_comes_from() -> None:
    from appliance.evaluation.tournament import ArmCost, Entry, plan
    from controller.console.choice_views import eta_source

    def entry(name: str, mode: str) -> Entry:
        return Entry(recipe=name, mode=mode, spec_hash=f"h-{name}", admitted=True, admission="admit",
                     margin_gib=1.0)

    known = ArmCost(cold_ready_s=100, warm_ready_s=20, bench_s=60, from_history=True)
    guess = ArmCost(cold_ready_s=300, warm_ready_s=300, bench_s=600, from_history=False)
    entries = [entry("a", "eager"), entry("b", "graph"), entry("c", "graph")]

    def shown(costs: dict[str, ArmCost]) -> str:
        return eta_source(plan(choice_id="p", platform="cpu", entries=entries, pattern="*", baseline=None,
                               costs=costs, budget_s=None, started_at=0.0))

    assert shown({"a": known, "b": known, "c": known}).startswith("from this host's launch history")
    assert shown({"a": guess, "b": guess, "c": guess}).startswith("from the defaults (no launch")
    mixed = shown({"a": known, "b": known, "c": guess})
    assert mixed.startswith("1 of 2 arms from this host's launch history")
