#!/usr/bin/env python3
"""Judge a two-engines-on-one-card run (docs/gpu-h200.md, "Two engines on one card").

    python3 scripts/gpu_h200/alongside_judge.py DIR

DIR is what `scripts/gpu_h200/alongside.sh` packed into alongside.tgz (`alongside/`): `status-both.json`
(both engines ready), `client-smollm2.json` and `client-smollm2-side.json` (switch_load.py, one per
model), `launch-<ID>.json` (`appliance launches ID --json`), `status-restarted.json`, `restart.json`
and `after-stop.txt`. The primary's restart beside the side engine is judged by the same-card judge
(appliance.evaluation.samecard_switch: blue/green on the card, 0 failed, p99 during the switch vs
steady) over the primary's launches and its model's client; the side model's client must lose nothing
across that restart. Prints the verdict and the figures; exits 1 on FAIL.
tests/unit/test_alongside_h200_*.py judges a fixture folder the same way.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root (or .gpuwt/)

from appliance.evaluation.samecard_switch import SameCardVerdict, judge, render_text

PRIMARY_MODEL = "smollm2"
SIDE_MODEL = "smollm2-side"
SIDE_RECIPE = "cuda-smollm2-eager-side"  # alongside.sh writes it; the primary's launches are all the others


@dataclass
class AlongsideVerdict:
    checks: dict[str, bool] = field(default_factory=dict)
    switch: SameCardVerdict | None = None
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(self.checks.values())


def _load(folder: Path, name: str) -> Any:
    try:
        return json.loads((folder / name).read_text())
    except (OSError, ValueError):
        return {}


def judge_folder(folder: Path) -> AlongsideVerdict:
    v = AlongsideVerdict()
    both = _load(folder, "status-both.json").get("engines") or []
    ready = sorted(str(e.get("model")) for e in both if e.get("state") == "ready")
    keys = ("model", "recipe", "state", "port", "ready_s")
    v.figures["engines"] = [{k: e.get(k) for k in keys} for e in both]
    a, b = _load(folder, f"client-{PRIMARY_MODEL}.json"), _load(folder, f"client-{SIDE_MODEL}.json")
    for name, c in ((PRIMARY_MODEL, a), (SIDE_MODEL, b)):
        v.figures[name] = {k: c.get(k) for k in ("requests", "failed", "longest_s")}
    after_path = folder / "after-stop.txt"
    after = dict(line.split(None, 1) for line in after_path.read_text().splitlines() if line.strip()) \
        if after_path.exists() else {}
    v.figures["after_stop"] = after
    # The primary's launches (the side engine's records are not part of its switch).
    records = [_load(folder, p.name) for p in sorted(folder.glob("launch-*.json"))]
    primary = [r for r in records if isinstance(r, dict) and r.get("recipe") != SIDE_RECIPE]
    v.switch = judge(primary, a)
    # The side model's requests over the primary's switch window: none may fail or be held.
    restarted, before = _load(folder, "status-restarted.json"), _load(folder, "status-both.json")
    v.checks = {
        "both engines ready side by side": ready == sorted([PRIMARY_MODEL, SIDE_MODEL]),
        f"{PRIMARY_MODEL} answered, 0 failed": int(a.get("requests") or 0) > 0 and a.get("failed") == 0,
        f"{SIDE_MODEL} answered, 0 failed": int(b.get("requests") or 0) > 0 and b.get("failed") == 0,
        "the primary restarted and serves again": restarted.get("state") == "ready"
        and (restarted.get("launch") or {}).get("id") not in (None, (before.get("launch") or {}).get("id")),
        "the primary's restart went blue/green on the same card, no request held": v.switch.passed,
        f"after stop --model {SIDE_MODEL}: {PRIMARY_MODEL} 200": after.get(PRIMARY_MODEL) == "200",
        f"after stop --model {SIDE_MODEL}: {SIDE_MODEL} 404": after.get(SIDE_MODEL) == "404",
    }
    return v


def render(v: AlongsideVerdict, folder: Path) -> str:
    lines = [f"two engines on one card: {'PASS' if v.passed else 'FAIL'}",
             "engines: " + json.dumps(v.figures.get("engines"))]
    for name in (PRIMARY_MODEL, SIDE_MODEL):
        f = v.figures.get(name) or {}
        lines.append(f"{name}: requests {f.get('requests')} failed {f.get('failed')} "
                     f"longest {f.get('longest_s')} s")
    mem = folder / "gpu-mem-snapshots.txt"
    if mem.exists():
        lines.append("card memory:\n" + mem.read_text().strip())
    lines.append(f"after the stop: {v.figures.get('after_stop')}")
    restart = (_load(folder, "restart.json") or {}).get("switch") or {}
    lines.append(f"the primary's restart beside the side engine: path {restart.get('path')} "
                 f"- {restart.get('why')}")
    if v.switch is not None:
        lines.append(render_text(v.switch))
    lines += [("PASS " if ok else "FAIL ") + what for what, ok in v.checks.items()]
    lines.append("VERDICT " + ("PASS" if v.passed else "FAIL"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("folder", type=Path, help="the unpacked alongside/ folder")
    args = ap.parse_args(argv)
    if not args.folder.is_dir():
        ap.error(f"{args.folder} is not a folder")
    verdict = judge_folder(args.folder)
    print(render(verdict, args.folder))
    return 0 if verdict.passed else 1


if __name__ == "__main__":
    sys.exit(main())
