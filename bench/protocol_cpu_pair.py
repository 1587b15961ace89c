"""The acceptance gate's whole protocol on the CPU pair, on a private controller; prints the verdict.

    flock /tmp/appliance-engine.lock .venv/bin/python bench/protocol_cpu_pair.py [--output-tokens 32]

Starts a controller of its own (a private APPLIANCE_HOME, free ports, the persistent test compile-cache
root, like tests/integration/) serving `cpu-smollm2-eager`, then runs
`appliance compare pair-eager pair-compiled --json` — the same two recipes as cpu-smollm2-eager and
cpu-smollm2 — with the whole protocol at the CLI's defaults (natural output lengths, one warm-up
request per tier, the smoke, the first five of each tier, re-runs of a small gain, the median score,
five accuracy items per kind). Writes the report to bench/results/protocol_cpu_pair-TIME.json and
prints every step, the per-tier figures, the accuracy and the wall time of the compare.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.integration.controller_harness import (  # noqa: E402
    START_LIVENESS_S,
    TOKEN,
    Controller,
    engine_recipe,
    free_port,
    recipe_dirs,
    serving,
)

BASE, CAND = "pair-eager", "pair-compiled"


def main(args: argparse.Namespace) -> int:
    out = REPO / "bench" / "results" / f"protocol_cpu_pair-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="protocol-pair-") as tmp:
        home, recipes = recipe_dirs(Path(tmp), "cpu-smollm2", "cpu-smollm2-eager")
        port = free_port()
        (recipes / f"{BASE}.yaml").write_text(engine_recipe(BASE, "cpu-smollm2-eager", port))
        (recipes / f"{CAND}.yaml").write_text(engine_recipe(CAND, "cpu-smollm2", port))
        with serving(Controller(home, recipes, free_port(), port, recipe=BASE)) as c:
            c.wait_ready(START_LIVENESS_S)
            env = {**os.environ, "APPLIANCE_HOME": str(home), "APPLIANCE_ADMIN_TOKEN": TOKEN,
                   "APPLIANCE_RECIPES": str(recipes), "PYTHONPATH": str(REPO)}
            started = time.monotonic()
            r = subprocess.run(
                [sys.executable, "-m", "controller.cli.main", "compare", BASE, CAND, "--api", c.url,
                 "--output-tokens", str(args.output_tokens), "--ready-timeout", "1500", "--out", str(out),
                 *args.extra],
                env=env, cwd=REPO, capture_output=True, text=True, timeout=args.timeout,
            )
            wall = time.monotonic() - started
    print(r.stdout)
    if r.returncode != 0:
        print(r.stderr[-4000:], file=sys.stderr)
        return r.returncode
    report = json.loads(out.read_text())
    for arm in ("baselines", "candidates"):
        for b in report[arm]:
            acc = b.get("accuracy")
            print(f"{arm[:-1]} {b['recipe']}: score {b['score']}; accuracy "
                  f"{acc['overall'] if acc else '-'} {acc['by_kind'] if acc else ''}")
    print(f"compare wall time on this machine: {wall:.0f} s; report {out}")
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--timeout", type=float, default=3000)
    p.add_argument("extra", nargs="*", help="more `appliance compare` options (after --)")
    sys.exit(main(p.parse_args()))
