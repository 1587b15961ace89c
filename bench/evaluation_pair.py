"""The full evaluation protocol for a recipe pair, through a running controller; prints the figures.

    APPLIANCE_ADMIN_TOKEN=... python bench/evaluation_pair.py cpu-smollm2-eager cpu-smollm2 \\
        [--api http://127.0.0.1:8090] [--requests 5] [--output-tokens 32]

For each recipe, in order: apply on an empty compile-cache root (`fresh_cache`: a cold start) →
ready seconds cold; fingerprint; restart on the same root → ready seconds warm; fingerprint again
(across-restart evidence, cold vs warm vintage). Then `compare` (both arms warm, same client and
prompts, the DOMAIN §7 gate in the seed's order: proof → smoke → first five → re-runs → median
score → accuracy; natural output lengths unless --ignore-eos). Everything is stored like the CLI
stores it; the table at the end is what the README and the report quote: decode ms/token, ready
cold/warm, reproducibility, then every gate step.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from appliance.evaluation.protocol import Thresholds
from controller.api_client import Client, api_url
from controller.evaluation.bench import BenchParams
from controller.evaluation.compare import CompareOptions, compare
from controller.evaluation.controls import http_control
from controller.evaluation.fingerprint import FingerprintRun, measure
from controller.evaluation.store import EvalStore
from controller.settings import paths


def say(event: dict[str, Any]) -> None:
    print("  " + json.dumps(event, default=str), file=sys.stderr, flush=True)


async def arm(client: Client, recipe: str, timeout_s: float, store: EvalStore) -> dict[str, Any]:
    control = http_control(client)
    before = (await control.status()).get("launch") or {}
    await asyncio.to_thread(client.post, "/apply", {"recipe": recipe, "fresh_cache": True})
    s = await control.wait_ready(recipe, timeout_s, before.get("id"))
    cold = await control.describe(s)
    cold_ready = s["launch"]["ready_s"]
    fp_cold: FingerprintRun = await measure(cold, store, progress=say)
    await control.restart()
    s = await control.wait_ready(recipe, timeout_s, cold.launch_id)
    warm = await control.describe(s)
    fp_warm = await measure(warm, store, progress=say)
    return {
        "recipe": recipe,
        "ready_cold_s": cold_ready,
        "ready_warm_s": s["launch"]["ready_s"],
        "cache": (cold.cache_vintage, warm.cache_vintage),
        "fp_cold": fp_cold,
        "fp_warm": fp_warm,
    }


async def main(args: argparse.Namespace) -> int:
    client = Client(api_url(args.api))
    if not client.token:
        print("needs APPLIANCE_ADMIN_TOKEN", file=sys.stderr)
        return 2
    store = EvalStore(paths().db)
    arms = [await arm(client, r, args.ready_timeout, store) for r in (args.baseline, args.candidate)]
    params = BenchParams(
        output_tokens=args.output_tokens,
        requests_per_tier=args.requests,
        concurrency=args.concurrency,
        ignore_eos=args.ignore_eos,
    )
    options = CompareOptions(
        thresholds=Thresholds(max_rounds=args.max_rounds),
        accuracy=args.accuracy_items > 0,
        accuracy_items=max(args.accuracy_items, 1),
    )
    outcome = await compare(
        http_control(client),
        args.baseline,
        args.candidate,
        params,
        store,
        rounds=args.rounds,
        ready_timeout_s=args.ready_timeout,
        progress=say,
        options=options,
    )
    benches = {r.recipe: r for r in [*outcome.baselines, *outcome.candidates]}
    print(
        f"{'recipe':20} {'ready cold s':>12} {'ready warm s':>12} {'decode ms/tok':>13} {'conc8 tok/s':>11} "
        f"{'score':>8}  reproducibility (restarts cold→warm; batch)"
    )
    for a in arms:
        b = benches[a["recipe"]]
        ss = b.single_stream
        fp = a["fp_warm"].fingerprint
        restarts = (
            "identical"
            if fp.restarts and fp.restarts.identical
            else (f"differ from token {fp.restarts.first_divergence}" if fp.restarts else "n/a")
        )
        batch = "identical" if fp.batch.identical else f"differ from token {fp.batch.first_divergence}"
        decode = "-" if not ss or ss.decode_ms_median is None else f"{ss.decode_ms_median:.2f}"
        conc = "-" if not ss or ss.conc8_tokens_per_s is None else f"{ss.conc8_tokens_per_s:.2f}"
        print(
            f"{a['recipe']:20} {a['ready_cold_s']:>12.1f} {a['ready_warm_s']:>12.1f} {decode:>13} {conc:>11} "
            f"{b.score:>8.2f}  {fp.measured.value} (restarts {restarts}; batch {batch})"
        )
    g = outcome.gate
    for step in g.steps:
        print(f"  step {step.name:10} {step.status.value:7} {'; '.join(step.reasons)}")
    for r in [*outcome.baselines, *outcome.candidates]:
        if r.accuracy:
            print(f"  accuracy {r.recipe}: {r.accuracy.overall:.1f} points {r.accuracy.by_kind()}")
    print(f"compare {args.candidate} vs {args.baseline}: {g.verdict.value}; " + "; ".join(g.reasons))
    store.close()
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("baseline")
    p.add_argument("candidate")
    p.add_argument("--api")
    p.add_argument("--requests", type=int, default=5)
    p.add_argument("--concurrency", type=int, default=5)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--max-rounds", type=int, default=3)
    p.add_argument("--ignore-eos", action="store_true", help="fixed output lengths (default: natural stops)")
    p.add_argument("--accuracy-items", type=int, default=5, help="items per accuracy kind; 0: no accuracy")
    p.add_argument("--ready-timeout", type=float, default=3600)
    sys.exit(asyncio.run(main(p.parse_args())))
