"""`appliance bench | compare | fingerprint | benchmarks`: choosing a recipe on evidence (DOMAIN §7).

They find the engine through the controller (`--api`, $APPLIANCE_API), measure it with one client
(controller/evaluation/client.py), print a table and progress as they go, write JSON, and store
the result in the launch store's database ($APPLIANCE_HOME) tied to the launch. `compare` switches
recipes through the controller and needs the admin token ($APPLIANCE_ADMIN_TOKEN).
Exit codes: 0 a result (whatever the verdict), 2 no result (engine not ready, no tier fits, an arm
never became ready) — and then nothing is stored.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any, TypeVar
from urllib.parse import quote

import typer
from pydantic import ValidationError

from appliance.evaluation.bench_result import BenchResult, goodput_summary
from appliance.evaluation.bench_tiers import FULL_REQUESTS, NoTierFits
from appliance.evaluation.protocol import Thresholds
from controller.api_client import ApiError, Client, api_url
from controller.cli.options import JsonOpt
from controller.evaluation.bench import BenchParams, LaunchInfo, run_bench
from controller.evaluation.client import ClientError, EngineNotReady
from controller.evaluation.compare import CompareError, CompareOptions, CompareOutcome, compare
from controller.evaluation.controls import describe_http, http_control
from controller.evaluation.fingerprint import FingerprintRun, measure
from controller.evaluation.store import EvalStore
from controller.settings import paths
from controller.store import Store

T = TypeVar("T")
FAST_OUTPUT_TOKENS = 64  # the old default cap, kept as the named fast mode
ApiOpt = Annotated[str | None, typer.Option("--api", help="Controller API URL (default $APPLIANCE_API).")]
KeyOpt = Annotated[
    str | None,
    typer.Option(
        "--key", envvar="APPLIANCE_BENCH_KEY", help="Gateway key, when --engine-url is the gateway."
    ),
]
RequestsOpt = Annotated[int, typer.Option("--requests", help="Requests per tier (the first five at least).")]
ConcOpt = Annotated[int, typer.Option("--concurrency", help="Concurrent requests per tier.")]
OutTokOpt = Annotated[
    int | None,
    typer.Option(
        "--output-tokens",
        help="FAST MODE: cap every measured request at this many tokens (tests; the output says so). "
        "Default: each tier's declared official max output, stopping at EOS.",
    ),
]
FastOpt = Annotated[
    bool, typer.Option("--fast", help=f"FAST MODE with a {FAST_OUTPUT_TOKENS}-token cap (tests only).")
]
EosOpt = Annotated[
    bool,
    typer.Option(
        "--ignore-eos/--natural-stop",
        help="Stop at EOS (default, the seed's runs: lengths vary and the gate checks them against "
        "the control's) or fixed output lengths.",
    ),
]
SingleOpt = Annotated[
    bool,
    typer.Option(
        "--single-stream/--no-single-stream", help="Also the single-stream protocol (decode, TTFT, conc=8)."
    ),
]
DbOpt = Annotated[Path | None, typer.Option("--db", help="Store database (default: $APPLIANCE_HOME's).")]
OutOpt = Annotated[
    Path | None,
    typer.Option("--out", help="Write the JSON here (default under $APPLIANCE_HOME/benchmarks/)."),
]


def register(app: typer.Typer) -> None:
    for name, fn in (
        ("bench", bench),
        ("compare", compare_cmd),
        ("fingerprint", fingerprint),
        ("benchmarks", benchmarks),
    ):
        app.command(name)(fn)


def _cap(output_tokens: int | None, fast: bool) -> int | None:
    """The fast mode's cap (None: the tiers' declared max output)."""
    return output_tokens if output_tokens is not None else (FAST_OUTPUT_TOKENS if fast else None)


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def _run(coro: Coroutine[Any, Any, T]) -> T:
    try:
        return asyncio.run(coro)
    except (EngineNotReady, NoTierFits, CompareError, ClientError, ApiError) as exc:
        raise _fail(f"{type(exc).__name__}: {exc} (nothing stored)") from exc


def _progress(event: dict[str, Any]) -> None:
    """One line per progress event: where the run is (a real-host run takes many minutes)."""
    phase = event.get("phase")
    who = f"[{event['recipe']}] " if event.get("recipe") else ""
    if phase in ("tier", "decode", "conc") or str(phase).startswith("fingerprint"):
        what = event.get("tier") or phase
        extra = f" error={event['error']}" if event.get("error") else ""
        typer.echo(f"  {who}{what}: {event.get('done')}/{event.get('total')}{extra}", err=True)
    elif phase == "plan":
        typer.echo(f"  {who}tiers: {event.get('tier_rule')}", err=True)
    else:
        rest = {k: v for k, v in event.items() if k not in ("phase", "recipe")}
        typer.echo(f"  {who}{phase} {json.dumps(rest, default=str)}", err=True)


def _launch(api: str | None, engine_url: str | None, recipe: str | None) -> LaunchInfo:
    """The launch the engine belongs to (controller), or an engine given directly (then `--recipe`)."""
    if engine_url:
        return LaunchInfo(
            launch_id=None,
            recipe=recipe or "unknown",
            spec_hash=None,
            cache_vintage=None,
            cache_root=None,
            engine_url=engine_url,
        )
    client = Client(api_url(api))
    try:
        s = client.get("/status")
    except ApiError as exc:
        raise _fail(f"{exc} (or give --engine-url)") from exc
    if s.get("state") != "ready":
        raise _fail(
            f"EngineNotReady: the controller's engine is {s.get('state')} (recipe {s.get('recipe')}); "
            "nothing stored"
        )
    return _run(describe_http(client, s))


def _db(db: Path | None) -> Path:
    return db or paths().db


def _write_json(data: Any, out: Path | None, name: str) -> Path:
    target = out or paths().home / "benchmarks" / f"{name}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(data, indent=2, default=str))
    return target


def _fmt(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def print_bench(r: BenchResult) -> None:
    typer.echo(
        f"bench {r.id}: recipe {r.recipe} launch {r.launch_id or '-'} spec {r.spec_hash or '-'} "
        f"cache {r.cache_vintage or '-'} ({r.cache_root or '-'})"
    )
    typer.echo(f"tiers: {r.tier_rule}")
    typer.echo(f"mode: {mode_line(r)}")
    typer.echo(
        f"{'tier':8} {'inputs':>11} {'n':>3} {'failed':>6} {'out tok/s':>10} {'p99 TTFT ms':>12} "
        f"{'p99 TPOT ms':>12}  output_lens"
    )
    for t in r.tiers:
        typer.echo(
            f"{t.tier.name:8} {f'{t.tier.lo}-{t.tier.hi}':>11} {len(t.requests):>3} {t.failed:>6} "
            f"{t.output_throughput:>10.2f} {_fmt(t.p99_ttft_ms):>12} {_fmt(t.p99_tpot_ms):>12}  "
            f"{t.output_lens}"
        )
    typer.echo(
        f"score 0.20·thr(4-8K)+0.50·thr(8-16K)+0.30·thr(16-32K) = {r.score:.3f} output tok/s; "
        f"failed {r.failed}"
    )
    ss = r.single_stream
    if ss:
        ttft = ", ".join(f"{n} tok: {ms:.1f} ms" for n, ms in ss.ttft_ms_by_input.items())
        typer.echo(
            f"single stream: decode median {_fmt(ss.decode_ms_median, '.2f')} ms/token "
            f"(n={len(ss.decode_ms_samples)}); TTFT {ttft}; conc=8 {_fmt(ss.conc8_tokens_per_s, '.2f')} tok/s"
        )
    dist = r.length_distribution().get("all") or {}
    if dist.get("n"):
        typer.echo(
            f"output lengths: n={dist['n']} min {dist['min']} median {dist['median']} mean {dist['mean']} "
            f"max {dist['max']}" + (f"; {dist['at_cap']} stopped at the cap" if "at_cap" in dist else "")
        )
    if r.warmup:
        typer.echo(f"warm-up: {len(r.warmup)} request(s) sent first and discarded")
    good = {t: g for t, g in goodput_summary(r).items() if g}
    if good:
        typer.echo("goodput (requests meeting the recipe's SLO targets): " + "; ".join(
            f"{t} {g['good']}/{g['requests']} ({g['goodput_rps']} req/s)" for t, g in good.items()))
    for p in r.proof.problems:
        typer.echo(f"warning: {p}")


def mode_line(r: BenchResult) -> str:
    limits = sorted(set(r.output_limits.values()))
    shown = "/".join(str(n) for n in limits) or str(r.output_tokens)
    if r.mode == "fast":
        return f"FAST MODE (tests): every request capped at {shown} tokens — not the task's output lengths"
    if r.mode in ("standard", "full"):
        return f"{r.mode}: each tier's declared max output ({shown} tokens), stopping at EOS"
    return f"not recorded (max_tokens {r.output_tokens})"


def bench(
    api: ApiOpt = None,
    engine_url: Annotated[
        str | None, typer.Option("--engine-url", help="Bench this engine directly (not the controller's).")
    ] = None,
    recipe: Annotated[str | None, typer.Option(help="Recipe name to record with --engine-url.")] = None,
    key: KeyOpt = None,
    requests: RequestsOpt = 5,
    concurrency: ConcOpt = 5,
    output_tokens: OutTokOpt = None,
    fast: FastOpt = False,
    ignore_eos: EosOpt = False,
    single_stream: SingleOpt = True,
    warmup: Annotated[int, typer.Option(help="Discarded warm-up requests per tier.")] = 1,
    store: Annotated[bool, typer.Option("--store/--no-store", help="Record the result.")] = True,
    db: DbOpt = None,
    out: OutOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Benchmark the current engine: the seed's three tiers (scaled into its context), the fixed first
    requests of each, and the single-stream protocol. Prints a table, writes JSON, stores the result."""
    try:
        params = BenchParams(
            output_tokens=_cap(output_tokens, fast),
            requests_per_tier=requests,
            concurrency=concurrency,
            ignore_eos=ignore_eos,
            single_stream=single_stream,
            warmup=warmup,
        )
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    launch = _launch(api, engine_url, recipe)
    result = _run(run_bench(launch, params, api_key=key, progress=_progress))
    if store:
        s = EvalStore(_db(db))
        try:
            s.add_benchmark(result)
        finally:
            s.close()
    path = _write_json(result.model_dump(mode="json"), out, result.id)
    if as_json:
        typer.echo(json.dumps({**result.summary(), "json": str(path)}, indent=2, default=str))
    else:
        print_bench(result)
        typer.echo(f"json: {path}" + ("" if store else " (not stored)"))


def compare_cmd(
    baseline: Annotated[str, typer.Argument(help="The reference recipe.")],
    candidate: Annotated[str, typer.Argument(help="The recipe under test.")],
    api: ApiOpt = None,
    rounds: Annotated[
        int,
        typer.Option(help="Interleaved rounds at least (A B A B ...); the gate takes the median score."),
    ] = 1,
    max_rounds: Annotated[
        int, typer.Option(help="Round cap while a small gain is re-run until its spread is < 5%.")
    ] = 3,
    warm: Annotated[
        bool,
        typer.Option(
            "--warm/--as-is", help="Restart an arm whose start was a cache miss before measuring it."
        ),
    ] = True,
    requests: RequestsOpt = 5,
    concurrency: ConcOpt = 5,
    output_tokens: OutTokOpt = None,
    fast: FastOpt = False,
    full: Annotated[
        bool,
        typer.Option(
            "--full",
            help=f"The full run: {FULL_REQUESTS} prompts per tier, at least 3 rounds (seed 003 §1120); "
            "what turns ACCEPT-PENDING-FULL into a verdict.",
        ),
    ] = False,
    ignore_eos: EosOpt = False,
    single_stream: SingleOpt = True,
    warmup: Annotated[int, typer.Option(help="Discarded warm-up requests per tier, on both arms.")] = 1,
    smoke: Annotated[
        bool, typer.Option("--smoke/--no-smoke", help="The first 8-16K request alone first, on both arms.")
    ] = True,
    accuracy: Annotated[
        bool,
        typer.Option("--accuracy/--no-accuracy", help="Score the offline accuracy sets (the final veto)."),
    ] = True,
    accuracy_items: Annotated[int, typer.Option(help="Items per accuracy kind (four kinds).")] = 5,
    accuracy_drop: Annotated[
        float, typer.Option(help="Reject at an accuracy drop of more than this many points in a kind.")
    ] = 3.0,
    length_tolerance: Annotated[
        float, typer.Option(help="Output length change (fraction) beyond which a gain is held back.")
    ] = 0.02,
    allow_diff: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-diff",
            help="A forbidden difference that is the point of the comparison: max_num_seqs, "
            "max_num_batched_tokens, sampling or output_limits (repeatable).",
        ),
    ] = None,
    ready_timeout: Annotated[float, typer.Option(help="Seconds an arm may take to become ready.")] = 3600,
    db: DbOpt = None,
    out: OutOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """A/B two recipes on this host: switch through the controller, bench each arm warm, then the
    seed's gate in order: proof → smoke → first five per tier (failures, SLA P99 TTFT and TPOT ≤ 1.5×,
    long tier) → re-runs of a small gain → median score (<1% is noise; outputs shorter or longer
    than the control's hold a gain back) → accuracy, with the last word."""
    if full and (fast or output_tokens is not None):
        raise _fail("--full measures the tiers' declared output lengths: not with --fast or --output-tokens")
    try:
        params = BenchParams(
            output_tokens=_cap(output_tokens, fast),
            requests_per_tier=max(requests, FULL_REQUESTS) if full else requests,
            concurrency=concurrency,
            ignore_eos=ignore_eos,
            single_stream=single_stream,
            warmup=warmup,
        )
        options = CompareOptions(
            thresholds=Thresholds(
                max_rounds=max_rounds, accuracy_drop=accuracy_drop, length_tolerance=length_tolerance
            ),
            smoke=smoke,
            accuracy=accuracy,
            accuracy_items=accuracy_items,
            allow_diff=frozenset(allow_diff or ()),
        )
    except (ValueError, ValidationError) as exc:
        raise _fail(str(exc)) from exc
    if accuracy_items < 1:
        raise _fail("--accuracy-items must be at least 1")
    client = Client(api_url(api))
    if not client.token:
        raise _fail("compare switches recipes: it needs the admin token in $APPLIANCE_ADMIN_TOKEN")
    store = EvalStore(_db(db))
    try:
        outcome = _run(
            compare(
                http_control(client),
                baseline,
                candidate,
                params,
                store,
                rounds=rounds,
                warm=warm,
                ready_timeout_s=ready_timeout,
                progress=_progress,
                options=options,
            )
        )
    finally:
        store.close()
    g = outcome.gate
    report = compare_report(outcome, baseline, candidate)
    path = _write_json(report, out, outcome.id)
    if as_json:
        typer.echo(json.dumps(report, indent=2, default=str))
        return
    for r in [*outcome.baselines, *outcome.candidates]:
        print_bench(r)
        typer.echo("")
    delta = "n/a" if g.score_delta is None else f"{g.score_delta * 100:+.2f}%"
    typer.echo(
        f"compare {outcome.id}: {candidate} vs {baseline}: score {g.score_candidate:.3f} vs "
        f"{g.score_baseline:.3f} ({delta}); output tokens {g.output_tokens_candidate} vs "
        f"{g.output_tokens_baseline}; texts identical {g.texts_identical}/{g.texts_compared}"
    )
    for step in g.steps:
        typer.echo(f"  step {step.name:10} {step.status.value.upper():7} {'; '.join(step.reasons)}")
    typer.echo(f"VERDICT: {g.verdict.value.upper()}" + (f"  flags: {', '.join(g.flags)}" if g.flags else ""))
    for reason in g.reasons:
        typer.echo(f"  - {reason}")
    typer.echo(f"json: {path}")


def compare_report(outcome: CompareOutcome, baseline: str, candidate: str) -> dict[str, Any]:
    """Everything a compare recorded: the verdict with every step and its evidence, each arm's
    summaries, and every run whole (each request's text, the smoke, warm-up and accuracy items)."""
    return {
        "id": outcome.id,
        "baseline": baseline,
        "candidate": candidate,
        "gate": outcome.gate.model_dump(mode="json"),
        "baselines": [r.summary() for r in outcome.baselines],
        "candidates": [r.summary() for r in outcome.candidates],
        "runs": {
            "baseline": [r.model_dump(mode="json") for r in outcome.baselines],
            "candidate": [r.model_dump(mode="json") for r in outcome.candidates],
        },
    }


def earlier_launches(get: Callable[[str], Any], launch: LaunchInfo) -> list[str] | None:
    """The ids of the other launches of `launch`'s recipe variant (same recipe and spec hash) the
    controller has records of; None when it cannot tell (no launch id, no answer)."""
    if not launch.launch_id:
        return None
    try:
        rows = get(f"/launches?limit=1000&recipe={quote(launch.recipe, safe='')}")
    except ApiError:
        return None
    return [str(r["id"]) for r in rows
            if r.get("id") != launch.launch_id and r.get("spec_hash") == launch.spec_hash]


def print_fingerprint(run: FingerprintRun, earlier: list[str] | None = None) -> None:
    """`earlier`: the other launches of this variant (earlier_launches). The restart comparison needs
    the token streams of a *fingerprint* of one of them on this cache root, not just the launch: with
    launches but no such fingerprint the line says so, instead of "no earlier launch"."""
    fp = run.fingerprint
    typer.echo(
        f"fingerprint {run.id}: recipe {run.launch.recipe} launch {run.launch.launch_id or '-'} "
        f"cache {run.launch.cache_vintage or '-'} ({run.launch.cache_root or '-'})"
    )
    typer.echo(
        f"prompt set {fp.prompt_set}, {len(fp.stream_hashes)} prompts, max_tokens {fp.max_tokens}, "
        f"temperature 0, max_num_seqs {fp.max_num_seqs or 'engine default'}, concurrency {fp.concurrency}"
    )
    typer.echo(f"set sha256 (serial):     {fp.serial_set_hash}")
    typer.echo(f"set sha256 (concurrent): {fp.concurrent_set_hash}")

    def line(label: str, c: Any) -> str:
        if c is None and earlier:
            shown = ", ".join(earlier[:3]) + (", …" if len(earlier) > 3 else "")
            return (f"  {label:9} not measured: {len(earlier)} earlier launch(es) of this variant "
                    f"({shown}) but no stored fingerprint of one on this cache root with prompt set "
                    f"{fp.prompt_set} and max_tokens {fp.max_tokens} (`appliance fingerprint` after each "
                    "start, or `--restart`, stores one)")
        if c is None:
            return (f"  {label:9} not measured (no fingerprint of an earlier launch of this variant on this "
                    "cache root)")
        if c.identical:
            return f"  {label:9} identical"
        return f"  {label:9} {len(c.differing)} prompt(s) differ, first divergent token {c.first_divergence}"

    typer.echo(line("repeats", fp.repeats))
    typer.echo(line("batch", fp.batch))
    typer.echo(
        line("restarts", fp.restarts) + (f" (vs launch {fp.restart_reference})" if fp.restarts else "")
    )
    typer.echo(f"measured: {fp.measured.value}")
    if run.check:
        typer.echo(("MISMATCH: " if run.check.mismatch else "declared: ") + run.check.finding)


def fingerprint(
    api: ApiOpt = None,
    max_tokens: Annotated[int, typer.Option(help="Tokens per stream.")] = 32,
    concurrency: Annotated[int, typer.Option(help="Concurrency of the batch run.")] = 4,
    restart: Annotated[
        bool,
        typer.Option(
            "--restart",
            help="Then restart the engine through the controller "
            "(same cache root) and measure again: across-restart evidence.",
        ),
    ] = False,
    ready_timeout: Annotated[float, typer.Option(help="Seconds the restart may take.")] = 3600,
    db: DbOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The reproducibility fingerprint of the current engine: sha256 per token stream and per set;
    repeats, serial vs concurrent, and vs the previous launch on the same cache root."""
    client = Client(api_url(api))
    store = EvalStore(_db(db))
    try:
        runs = [
            _run(
                measure(
                    _launch(api, None, None),
                    store,
                    max_tokens=max_tokens,
                    concurrency=concurrency,
                    progress=_progress,
                )
            )
        ]
        if restart:
            if not client.token:
                raise _fail("--restart needs the admin token in $APPLIANCE_ADMIN_TOKEN")
            control = http_control(client)
            before = runs[0].launch

            async def again() -> FingerprintRun:
                await control.restart()
                await control.wait_ready(before.recipe, ready_timeout, before.launch_id)
                return await measure(
                    await control.describe(await control.status()),
                    store,
                    max_tokens=max_tokens,
                    concurrency=concurrency,
                    progress=_progress,
                )

            runs.append(_run(again()))
    finally:
        store.close()
    for run in runs:
        if run.check and run.check.mismatch and run.launch.launch_id:
            # A finding on the launch itself: `appliance launches ID` shows it with the other events.
            launches = Store(_db(db))
            try:
                launches.add_event(
                    "reproducibility-mismatch",
                    run.check.finding,
                    time.time(),
                    run.launch.launch_id,
                    {"fingerprint": run.id},
                )
            finally:
                launches.close()
    if as_json:
        typer.echo(
            json.dumps(
                [
                    {
                        "id": r.id,
                        "launch_id": r.launch.launch_id,
                        "recipe": r.launch.recipe,
                        "fingerprint": r.fingerprint.model_dump(mode="json"),
                        "measured": r.fingerprint.measured.value,
                        "check": r.check.model_dump(mode="json") if r.check else None,
                    }
                    for r in runs
                ],
                indent=2,
            )
        )
        return
    for run in runs:
        earlier = None if run.fingerprint.restarts is not None else earlier_launches(client.get, run.launch)
        print_fingerprint(run, earlier)


def benchmarks(
    recipe: Annotated[str | None, typer.Option(help="Only this recipe.")] = None,
    limit: Annotated[int, typer.Option(min=1, help="How many (newest first).")] = 20,
    db: DbOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Stored benchmark results, comparisons and fingerprints (newest first)."""
    store = EvalStore(_db(db))
    try:
        rows, cmps, fps = (
            store.benchmarks(limit, recipe),
            store.comparisons(limit),
            store.fingerprints(limit, recipe),
        )
    finally:
        store.close()
    if as_json:
        typer.echo(json.dumps({"benchmarks": rows, "comparisons": cmps, "fingerprints": fps}, indent=2))
        return
    # Units in the header: the score is the seed's weighted tokens/s, the latencies milliseconds.
    typer.echo(
        f"{'bench':18} {'recipe':24} {'cache':5} {'score tok/s':>11} {'p99 TTFT ms':>11} {'p99 TPOT ms':>11} "
        f"{'decode ms':>9} {'failed':>6}"
    )
    for r in rows:
        typer.echo(
            f"{r['id']:18} {r['recipe']:24} {r['cache_vintage'] or '-':5} {r['score']:>11.3f} "
            f"{_fmt(r['p99_ttft_ms']):>11} {_fmt(r['p99_tpot_ms']):>11} {_fmt(r['decode_ms_median']):>9} "
            f"{r['failed']:>6}"
        )
    for c in cmps:
        typer.echo(
            f"{c['id']}: {c['candidate']} vs {c['baseline']}: {c['verdict']} — {'; '.join(c['reasons'])}"
        )
    for f in fps:
        typer.echo(
            f"{f['id']}: {f['recipe']} launch {f['launch_id']}: {f['measured']}"
            + (" MISMATCH" if f["mismatch"] else "")
            + f" — {f['finding']}"
        )
