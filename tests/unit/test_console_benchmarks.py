"""The console's Benchmarks pages over real stored results.

Results are built with the real models (appliance/evaluation/bench_result.py, the real tier plan for a short
context, the real gate's verdict) and stored through the real EvalStore in the rig's database; the
pages are fetched from the real controller app (test_console.py's rig and log-in).
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import httpx
import pytest

from appliance.evaluation.bench_result import (
    BenchResult,
    ProofResult,
    RequestRecord,
    SingleStream,
    TierResult,
)
from appliance.evaluation.bench_tiers import SEED_TIERS, Tier, plan_tiers
from appliance.evaluation.gate import Verdict, decide
from controller.console import charts
from controller.evaluation.store import EvalStore
from controller.runtime.base import Provenance
from tests.unit import test_console as _console
from tests.unit.supervisor_helpers import make_spec
from tests.unit.test_api import Rig
from tests.unit.test_console import login

home, rig, client = _console.home, _console.rig, _console.client

T0 = 1_700_000_000.0
OUT = 64  # output tokens per request
EVIL = "<b>evil</b>"


def _tier(tier: Tier, duration_s: float, ttft_base: float, failed: int = 0) -> TierResult:
    requests = [
        RequestRecord(
            tier=tier.name, index=k, input_tokens=tier.lo + k,
            output_tokens=0 if k < failed else OUT,
            ttft_ms=None if k < failed else ttft_base + 10 * k,
            tpot_ms=None if k < failed else 20.0,
            latency_ms=None if k < failed else ttft_base + 10 * k + 20.0 * (OUT - 1),
            text="" if k < failed else f"text {k}",
            ok=k >= failed, error="HTTP 500" if k < failed else None,
        )
        for k in range(5)
    ]
    return TierResult(tier=tier, requests=requests, duration_s=duration_s, concurrency=5)


def _bench(
    bench_id: str, recipe: str, finished: float, *, durations: tuple[float, float, float] = (10, 20, 40),
    failed_in_middle: int = 0, tiers: tuple[Tier, ...] = SEED_TIERS,
    tier_rule: str = "seed tiers as they are",
    single: SingleStream | None = None, proof: ProofResult | None = None,
) -> BenchResult:
    return BenchResult(
        id=bench_id, launch_id=f"L-{bench_id}", recipe=recipe, spec_hash="0" * 16, cache_vintage="warm",
        cache_root="/var/lib/appliance/cache/x", engine_url="http://127.0.0.1:1", prompt_set="ps-v1",
        tier_rule=tier_rule, output_tokens=OUT, ignore_eos=True,
        tiers=[_tier(t, durations[i], 100.0 * (i + 1), failed_in_middle if i == 1 else 0)
               for i, t in enumerate(tiers)],
        single_stream=single, proof=proof or ProofResult(), started_at=finished - 60, finished_at=finished,
    )


def _store(rig: Rig) -> dict[str, BenchResult]:
    evals = EvalStore(rig.store.path)
    old = _bench("b-old", "cpu-smollm2", T0, durations=(100, 100, 100))
    evals.add_benchmark(old)
    base = _bench("b-base", "cpu-smollm2", T0 + 10, durations=(8, 16, 32))
    cand = _bench("b-cand", "cpu-smollm2-eager", T0 + 20, failed_in_middle=1)
    gate = decide(base, cand)
    assert gate.verdict == Verdict.REJECT  # a failed request rejects (DOMAIN §7)
    evals.add_comparison("cmp-1", [base], [cand], gate)
    plan = plan_tiers(2048, OUT)  # the CPU recipe's context: every tier scaled by one factor
    assert plan.scaled
    scaled = _bench(
        "b-scaled", EVIL, T0 + 30, tiers=plan.tiers, tier_rule=plan.describe(),
        single=SingleStream(decode_ms_samples=[30, 31, 29, 32, 30],
                            ttft_ms_by_input={3800: 250.0, 8192: 700.0}, conc8_tokens_per_s=41.5),
        proof=ProofResult(markers={"TRITON_ATTN selected.": True, "fused kernel selected.": False},
                          checksums={"/opt/vllm/attn.py": True}),
    )
    evals.add_benchmark(scaled)
    evals.close()
    return {"old": old, "base": base, "cand": cand, "scaled": scaled}


def _row(html: str, row_id: str) -> str:
    found = re.search(rf'<tr [^>]*id="{re.escape(row_id)}">(.*?)</tr>', html, re.S)
    assert found, f"no row {row_id}"
    return found.group(1)


def _cells(row: str, cls: str) -> list[str]:
    return re.findall(rf'<td class="{cls}">([^<]*)</td>', row)


async def test_the_pages_need_a_login_like_every_console_page(client: httpx.AsyncClient) -> None:
    for path in ("/console/benchmarks", "/console/benchmarks/b-base"):
        r = await client.get(path)
        assert r.status_code == 303, path
        assert r.headers["location"] == "/console/login?next=" + path


async def test_no_benchmark_yet_says_how_to_make_one(client: httpx.AsyncClient) -> None:
    await login(client)
    r = await client.get("/console/benchmarks")
    assert r.status_code == 200
    assert 'id="no-benchmarks"' in r.text
    assert "<code>appliance bench</code>" in r.text and "<code>appliance compare A B</code>" in r.text
    assert "<svg" not in r.text and 'id="nav-benchmarks"' in r.text


async def test_comparisons_and_benches_are_listed_newest_first_with_the_verdict(
    rig: Rig, client: httpx.AsyncClient
) -> None:
    results = _store(rig)
    await login(client)
    r = await client.get("/console/benchmarks")
    assert r.status_code == 200
    html = r.text
    assert 'id="no-benchmarks"' not in html
    # the comparison: both recipes, the reject and its reason, links to each arm's bench
    cmp_row = _row(html, "cmp-1")
    assert "cpu-smollm2" in cmp_row and "cpu-smollm2-eager" in cmp_row
    assert '<span class="verdict verdict-reject">reject</span>' in cmp_row
    assert "candidate cpu-smollm2-eager failed 1 request(s)" in cmp_row
    assert 'href="/console/benchmarks/b-base"' in cmp_row and 'href="/console/benchmarks/b-cand"' in cmp_row
    # benches, newest first
    order = re.findall(r'<tr class="bench-row" id="bench-([^"]+)">', html)
    assert order == ["b-scaled", "b-cand", "b-base", "b-old"]
    cand = _row(html, "bench-b-cand")
    # 5 × 64 tokens over 10 / 20 / 40 s, one request of the middle tier failed: 320/10, 256/20, 320/40
    assert _cells(cand, "tier-thr") == ["32.00", "12.80", "8.00"]
    assert _cells(cand, "score") == [f"{results['cand'].score:.2f}"] == ["15.20"]
    assert '<td class="failed"><span class="verdict verdict-reject">1</span></td>' in cand
    assert 'href="/console/launches/L-b-cand"' in cand and 'href="#cmp-1"' in cand
    assert _cells(_row(html, "bench-b-base"), "tier-thr") == ["40.00", "20.00", "10.00"]
    assert '<td class="failed">0</td>' in _row(html, "bench-b-base")
    assert "tiers scaled" in _row(html, "bench-b-scaled")
    # a recipe name with markup is text, everywhere (table and chart)
    assert EVIL not in html and "&lt;b&gt;evil&lt;/b&gt;" in html


async def test_the_chart_has_one_group_per_tier_and_one_bar_per_recipe_from_its_latest_bench(
    rig: Rig, client: httpx.AsyncClient
) -> None:
    _store(rig)
    await login(client)
    html = (await client.get("/console/benchmarks")).text
    chart = re.search(r'<div id="bench-chart">(.*?)</div>', html, re.S)
    assert chart and chart.group(1).startswith("<svg")
    svg = chart.group(1)
    groups = svg.split('<g class="bar-group">')[1:]
    assert len(groups) == 3
    for group in groups:
        assert group.split("</g>")[0].count('class="gbar"') == 3  # cpu-smollm2, -eager, the scaled one
    assert "cpu-smollm2-eager · 8-16K: 12.8" in svg
    assert "cpu-smollm2 · 8-16K: 20.0" in svg  # b-base (the latest), not b-old's 3.2
    assert "cpu-smollm2 · 8-16K: 3.2" not in svg
    assert "&lt;b&gt;evil&lt;/b&gt;" in svg and EVIL not in svg


async def test_one_bench_shows_its_tiers_single_stream_scaling_rule_proof_and_requests(
    rig: Rig, client: httpx.AsyncClient
) -> None:
    results = _store(rig)
    await login(client)
    r = await client.get("/console/benchmarks/b-scaled")
    assert r.status_code == 200
    html = r.text
    scaled = results["scaled"]
    first = scaled.tiers[0].tier
    tier = _row(html, "tier-4-8K")
    assert f"{first.lo}–{first.hi}" in tier and "(seed 4096–8192)" in tier
    assert "120.0 ms" in tier  # median TTFT of 100, 110, 120, 130, 140
    assert _cells(tier, "tier-thr") == ["32.00"]
    assert "Tiers scaled:" in html and "scaled ×" in html and "max_model_len 2048" in html
    assert "every seed tier bound x usable/32768" in html
    single = re.search(r'<dl class="facts" id="single-stream">(.*?)</dl>', html, re.S)
    assert single
    assert "30.0 ms/token (5 samples)" in single.group(1)
    assert "TTFT at 3800 input tokens</dt><dd>250.0 ms" in single.group(1)
    assert "41.50 tok/s" in single.group(1)
    proof = re.search(r'<div id="proof">(.*?)</div>', html, re.S)
    assert proof and "not proven" in proof.group(1) and "log marker not seen" in proof.group(1)
    assert "fused kernel selected." in proof.group(1) and "/opt/vllm/attn.py" in proof.group(1)
    assert EVIL not in html and "&lt;b&gt;evil&lt;/b&gt;" in html
    ttft = re.search(r'<div id="ttft-chart">(.*?)</div>', html, re.S)
    assert ttft and ttft.group(1).count('class="strip"') == 3 and ttft.group(1).count('class="dot"') == 15


async def test_a_bench_with_a_failed_request_shows_it_and_an_unknown_id_is_404(
    rig: Rig, client: httpx.AsyncClient
) -> None:
    _store(rig)
    await login(client)
    html = (await client.get("/console/benchmarks/b-cand")).text
    assert "8-16K request 0: HTTP 500" in html
    ttft = re.search(r'<div id="ttft-chart">(.*?)</div>', html, re.S)
    assert ttft and ttft.group(1).count('class="dot"') == 14
    assert ttft.group(1).count('class="dot-failed"') == 1
    assert 'href="/console/comparisons/cmp-1"' in html
    assert 'id="single-stream">Not measured' in html and "nothing to prove" in html
    r = await client.get("/console/benchmarks/nope")
    assert r.status_code == 404
    assert 'id="problem-title">Unknown benchmark' in r.text and 'href="/console/benchmarks"' in r.text


async def test_a_launch_page_links_to_its_benchmarks(rig: Rig, client: httpx.AsyncClient) -> None:
    _store(rig)
    rig.store.create_launch("L-b-base", make_spec("cpu-smollm2"), "normal", Provenance(), T0)
    rig.store.create_launch("L-none", make_spec("cpu-smollm2"), "normal", Provenance(), T0)
    await login(client)
    section = re.search(r'<section class="card" id="launch-benches">(.*?)</section>',
                        (await client.get("/console/launches/L-b-base")).text, re.S)
    assert section and 'href="/console/benchmarks/b-base"' in section.group(1)
    assert "b-cand" not in section.group(1)
    none = (await client.get("/console/launches/L-none")).text
    assert "<code>appliance bench</code> measures the ready engine" in none


def test_grouped_bars_escape_labels_and_skip_missing_values() -> None:
    svg = charts.grouped_bars([charts.BarGroup("<t>", [1.0, None])], ["a&b", "c"], title="<x>")
    assert "<t>" not in svg and "&lt;t&gt;" in svg and "a&amp;b" in svg and "&lt;x&gt;" in svg
    assert svg.count('class="gbar"') == 1 and "—" in svg
    assert "nothing measured yet" in charts.grouped_bars([], [], title="empty")


def test_strip_chart_draws_failures_as_crosses() -> None:
    strip = charts.Strip("tier <1>", [charts.Dot(5.0, "ok <a>"), charts.Dot(None, "failed")])
    svg = charts.strip_chart([strip], title="t")
    assert svg.count('class="dot"') == 1 and svg.count('class="dot-failed"') == 1
    assert "tier &lt;1&gt;" in svg and "ok &lt;a&gt;" in svg
    assert "no requests recorded" in charts.strip_chart([], title="t")


def test_the_shared_store_filters_by_launch_and_comparison(tmp_path: Path) -> None:
    evals = EvalStore(tmp_path / "db.sqlite3")
    a, b = _bench("a", "r1", T0), _bench("b", "r2", T0 + 1)
    evals.add_benchmark(a)
    evals.add_comparison("cmp-x", [b], [_bench("c", "r3", T0 + 2)], decide(b, _bench("c", "r3", T0 + 2)))
    assert [r["id"] for r in evals.benchmarks(launch_id="L-a")] == ["a"]
    assert [r["id"] for r in evals.benchmarks(comparison_id="cmp-x")] == ["c", "b"]
    assert [r["id"] for r in evals.benchmarks(recipe="r2", comparison_id="cmp-x")] == ["b"]
    assert len(evals.benchmarks()) == 3


def test_axis_ends_on_round_steps_at_or_above_the_largest_value() -> None:
    for value, top in [(43.2, 60.0), (40.0, 40.0), (357.0, 400.0), (1680.0, 2000.0), (0.3, 0.32), (0.0, 1.0)]:
        assert charts.nice_top(value) == pytest.approx(top)
        assert charts.nice_top(value) >= value


async def test_a_stored_row_this_version_cannot_read_is_a_page_not_a_traceback(
    rig: Rig, client: httpx.AsyncClient
) -> None:
    _store(rig)
    with sqlite3.connect(rig.store.path) as db:
        db.execute("UPDATE eval_benchmarks SET result_json = '{\"id\": \"b-old\"}' WHERE id = 'b-old'")
    await login(client)
    listed = await client.get("/console/benchmarks")
    assert listed.status_code == 200
    old = _row(listed.text, "bench-b-old")
    assert "unreadable" in old and _cells(old, "tier-thr") == ["—", "—", "—"]
    assert _cells(old, "score") == ["3.20"]  # the row's own columns still show
    r = await client.get("/console/benchmarks/b-old")
    assert r.status_code == 500 and 'id="problem-title">Benchmark unreadable' in r.text


def test_create_app_opens_one_evaluation_store_for_the_api_and_the_console(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[Path] = []
    real_init = EvalStore.__init__

    def counting_init(self: EvalStore, path: Path) -> None:
        opened.append(path)
        real_init(self, path)

    monkeypatch.setattr(EvalStore, "__init__", counting_init)
    rig = Rig(home)
    assert opened == [rig.store.path]


async def test_a_comparison_page_shows_both_arms_per_tier_and_per_gate_step_with_differing_texts_and_flips(
    rig: Rig, client: httpx.AsyncClient
) -> None:
    from appliance.evaluation.accuracy import AccuracyResult, ItemResult, Kind
    from appliance.evaluation.protocol import gate as protocol_gate

    def acc(score: float) -> AccuracyResult:
        return AccuracyResult(context_tokens=700, items=[
            ItemResult(kind=Kind.RETRIEVAL, index=0, score=score, output=f"codes <b>{score}</b>")])

    base = _bench("b-pb", "cpu-smollm2", T0 + 10, durations=(8, 16, 32)).model_copy(
        update={"accuracy": acc(1.0)})
    cand = _bench("b-pc", "cpu-smollm2-eager", T0 + 20, durations=(4, 8, 16)).model_copy(
        update={"accuracy": acc(0.0), "proof": ProofResult(markers={"CPU KV cache size:": True})})
    cand.tiers[0].requests[0].text = "a different <text>"
    g = protocol_gate([base], [cand])
    assert g.verdict == Verdict.REJECT  # faster, but the accuracy veto
    evals = EvalStore(rig.store.path)
    evals.add_comparison("cmp-p", [base], [cand], g)
    evals.close()
    await login(client)
    listing = (await client.get("/console/benchmarks")).text
    assert 'href="/console/comparisons/cmp-p"' in listing
    r = await client.get("/console/comparisons/cmp-p")
    assert r.status_code == 200
    html = r.text
    assert '<span class="verdict verdict-reject" id="comparison-verdict">reject</span>' in html
    assert re.findall(r'<tr class="step-row" id="step-([^"]+)">', html) == [
        "proof", "smoke", "first-five", "re-runs", "score", "accuracy"]
    assert "accuracy drop in retrieval_multi_point" in _row(html, "step-accuracy")
    assert _cells(_row(html, "tier-4-8K-baseline"), "tier-thr") == ["40.00"]
    assert _cells(_row(html, "tier-4-8K-candidate"), "tier-thr") == ["80.00"]
    assert "a different &lt;text&gt;" in html  # the differing text, escaped
    assert "codes &lt;b&gt;1.0&lt;/b&gt;" in html  # the flipped accuracy item, both outputs
    assert (await client.get("/console/comparisons/cmp-nope")).status_code == 404
