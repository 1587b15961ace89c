#!/bin/bash
# compare.sh — the acceptance gate's whole protocol on the lent H200 for the eager/graph pair:
#   appliance compare cuda-smollm2-eager cuda-smollm2-graph --json
# (proof → smoke → first five per tier → re-runs of a small gain → median score → accuracy with the
# last word; one discarded warm-up request per tier on both arms). the standard mode — every
# measured request carries its tier's declared max output (1024 tokens, appliance/evaluation/
# bench_tiers.py) and stops at EOS, not the old 64-token cap; the graph arm declares
# varies-across-restarts, so its smoke length, length hold and accuracy come from its eager twin
# (derived: cuda-smollm2-eager, the baseline — no extra switch, no candidate accuracy run).
# docs/gpu-h200.md says how it is sent: the kit set up by an earlier call (gpu-kit's setup.sh: vLLM
# 0.26.0 in /root/site, the model in /root/gpu/smollm2), the appliance's code in .gpuwt/; run from
# the repo root copy as
#   bash .gpuwt/scripts/gpu_h200/compare.sh
# The accuracy step scores summaries with `rouge-score` (and its nltk, absl-py, joblib), which the
# device image lacks: carry their wheels in .whl/ (`pip wheel --no-deps -w .whl rouge-score nltk
# absl-py joblib` on this machine) and they are unpacked into /root/site; without them the compare
# runs with --no-accuracy and says so.
# Budget: ~6–7 minutes, under 9 (eager ready ≈ 45 s, graph cold + warm ≈ 130 s; with real output
# lengths the eager arm's smoke and three tiers of 5 concurrent requests take up to ~20 s each at
# 17.5–20 ms/token if they run to the 1024 cap, the graph arm's ~3 s each; the warm-up keeps 16
# tokens and the single stream 64; 20 accuracy items ≤ 96 tokens). A small gain would re-run up to
# 3 rounds (+~4 min): the eager/graph pair's gain (~4×) never is one.
# What comes back: $OUT/compare.json (the whole report: every step with its evidence, every run with
# its texts), $OUT/compare-summary.txt, $OUT/compare.tgz (progress, launches, engine logs, redacted).
NAME=compare
# shellcheck source=scripts/gpu_h200/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # the shared prelude: env, layout, token, redact, pack

say "up with the baseline (eager)"
timeout 240 "${APP[@]}" up --recipe cuda-smollm2-eager > "$R/up.txt" 2>&1; echo "up rc=$?" >> "$R/up.txt"
redact "$R/up.txt"; tail -3 "$R/up.txt"; pack

say "compare (the whole protocol)"
timeout 480 "${APP[@]}" compare cuda-smollm2-eager cuda-smollm2-graph --json "${ACC[@]}" \
  --ready-timeout 400 --out "$R/compare.json" > "$R/compare-stdout.json" 2> "$R/compare-progress.txt"
RC=$?; echo "compare rc=$RC" >> "$R/compare-progress.txt"
redact "$R/compare-progress.txt" "$R/compare.json"; tail -5 "$R/compare-progress.txt"; pack

say "collect"
"${APP[@]}" launches --json > "$R/launches.json" 2>&1
for id in $(python3 -c 'import json,sys; print(" ".join(r["id"] for r in json.load(open(sys.argv[1]))))' "$R/launches.json" 2>/dev/null); do
  mkdir -p "$R/runs/$id"; cp "/root/app/runs/$id/engine.log" "$R/runs/$id/" 2>/dev/null
  # the launch record with its events: the kernel proof and the deployment probe (versions, devices)
  "${APP[@]}" launches "$id" --json > "$R/launch-$id.json" 2>/dev/null
  "${APP[@]}" launches "$id" > "$R/launch-$id.txt" 2>/dev/null
done
timeout 30 "${APP[@]}" down > "$R/down.txt" 2>&1
find "$R" -type f -size +4M -exec truncate -s 4M {} +
redact "$R"/*.txt "$R"/*.json "$R"/runs/*/engine.log
cp "$R/compare.json" "$OUT/compare.json" 2>/dev/null
python3 - "$R/compare.json" > "$OUT/compare-summary.txt" 2>&1 <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except (OSError, ValueError) as exc:
    print(f"no compare result: {exc}"); sys.exit(0)
g = r["gate"]
print(f"compare {r['id']}: {r['candidate']} vs {r['baseline']}: VERDICT {g['verdict'].upper()}  flags: {', '.join(g['flags'])}")
for s in g["steps"]:
    print(f"  {s['name']:10} {s['status'].upper():7} {'; '.join(s['reasons'])[:300]}")
print(f"score {g['score_candidate']:.1f} vs {g['score_baseline']:.1f} output tok/s; output tokens "
      f"{g['output_tokens_candidate']} vs {g['output_tokens_baseline']}; texts identical {g['texts_identical']}/{g['texts_compared']}")
steps = {s['name']: s for s in g['steps']}
rr = steps.get('re-runs', {}).get('evidence', {})
if rr:
    print(f"rounds {rr.get('rounds')}; score spreads {rr.get('spread')}; tier spreads {rr.get('tier_spreads')}")
acc = steps.get('accuracy', {}).get('evidence', {})
print(f"token-stream evidence: smoke {steps['smoke'].get('evidence', {}).get('length_sources')}, "
      f"accuracy {acc.get('sources')}; cannot discriminate: {acc.get('cannot_discriminate')}")
for arm in ("baselines", "candidates"):
    for b in r[arm]:
        tiers = "; ".join(f"{t['tier']} {t['output_throughput']:.1f} tok/s p99 TTFT {t['p99_ttft_ms']} TPOT {t['p99_tpot_ms']}" for t in b["tiers"])
        print(f"  {arm[:-1]} {b['recipe']} {b['id']}: mode {b.get('mode')}, score {b['score']}, decode {b['decode_ms_median']} ms/token; {tiers}")
        for tier, d in (b.get('output_lengths') or {}).items():
            print(f"    output lengths {tier}: {d}")
        if b.get("accuracy"):
            print(f"    accuracy {b['accuracy']['overall']} points {b['accuracy']['by_kind']}")
PY
{ echo; echo "wall time $(( $(date +%s) - T0 )) s; compare rc=$RC"; cat "$R/gpu.txt"; } >> "$OUT/compare-summary.txt"
cp "$OUT/compare-summary.txt" "$R/"; pack
cat "$OUT/compare-summary.txt"; ls -l "$OUT"
exit $RC
