#!/bin/bash
# choose.sh — `appliance choose` on the lent H200 over the smollm2 variants:
#   appliance choose --recipes 'cuda-smollm2-*' --json
# every cuda recipe → lint → admission (the H200's cards and host memory) → the gate as a tournament
# (eager baseline, then piecewise and graph by the rule in appliance/evaluation/tournament.py), each
# gate the whole protocol of compare.sh (standard mode: declared output lengths, natural stops). The
# expected result: graph wins on throughput with its accuracy evidence from its eager twin,
# piecewise between. The host goes back to the eager recipe that was serving (no --promote).
# Sent like compare.sh (docs/gpu-h200.md): the kit from gpu-kit's setup.sh, the code in .gpuwt/:
#   bash .gpuwt/scripts/gpu_h200/choose.sh
# Budget: a device command runs at most 10 minutes and two gates of compare.sh's size take ~12–14;
# the choice is started with `--budget ${CHOOSE_BUDGET:-8m}` so it stops with the champion so far and
# the record says what was not tried (set CHOOSE_BUDGET=20m where a longer command is allowed).
# What comes back (a fixture CI re-judges): $OUT/choice.json (the decision record), $OUT/choice.md
# (its table), $OUT/comparisons/ID.json (each gate's whole report, the shape `compare --out` writes:
# every step with its evidence, every run with its texts), $OUT/launches/ID.json (each launch record
# with its events: kernel proof, deployment probe), $OUT/choose-summary.txt, $OUT/choose.tgz
# (progress, launches, comparisons, engine logs, redacted).
# CHOOSE_COLLECT=1 (the next call, within the machine's 30 s): the home and the running choice are kept;
# this call only waits (CHOOSE_WAIT_S more) for the CLI started by the first and collects.
NAME=choose
# The CLI writes here, outside the packed results: they are copied and redacted (sed -i makes a new
# file) only as snapshots, so a choice still running keeps writing to its own files.
LIVE=/root/results/choose-live
[ "${CHOOSE_COLLECT:-0}" = 1 ] && export KEEP_HOME=1
# shellcheck source=scripts/gpu_h200/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # the shared prelude: env, layout, token, redact, pack

if [ "${CHOOSE_COLLECT:-0}" = 1 ]; then
  CPID=$(cat "$R/choose.pid" 2>/dev/null || true)
  [ -n "$CPID" ] || { say "CHOOSE_COLLECT=1 but no choice was started here ($R/choose.pid): the machine went back?"; exit 2; }
  say "collecting the choice of the earlier call (pid $CPID)"
else
say "up with the baseline (eager)"
timeout 240 "${APP[@]}" up --recipe cuda-smollm2-eager > "$R/up.txt" 2>&1; echo "up rc=$?" >> "$R/up.txt"
redact "$R/up.txt"; tail -3 "$R/up.txt"; pack

say "choose (plan, then the tournament; the ETA is in the plan)"
rm -rf "$LIVE"; mkdir -p "$LIVE"
# The CLI follows the choice and prints the record at the end. It runs in its own session so that a
# choice longer than one device command can be collected by the next call (CHOOSE_WAIT_S bounds this
# one's wait; the controller and the choice go on until the machine goes back). On a fresh host the
# ETA comes from defaults (no history), so the budget must cover them: CHOOSE_BUDGET.
setsid timeout 3000 "${APP[@]}" choose --recipes "${CHOOSE_RECIPES:-cuda-smollm2-*}" --json --yes "${ACC[@]}" \
  --budget "${CHOOSE_BUDGET:-8m}" --ready-timeout 400 > "$LIVE/choice.json" 2> "$LIVE/choose-progress.txt" < /dev/null &
CPID=$!
echo "$CPID" > "$R/choose.pid"
fi
END=$(( T0 + ${CHOOSE_WAIT_S:-540} ))
while kill -0 "$CPID" 2>/dev/null && [ "$(date +%s)" -lt "$END" ]; do sleep 3; done
if kill -0 "$CPID" 2>/dev/null; then
  RC=124; say "the choice is still running (pid $CPID): collecting what it has; call again with CHOOSE_COLLECT=1"
elif [ "${CHOOSE_COLLECT:-0}" = 1 ]; then
  RC=0; say "the choice's CLI has ended (not this shell's child: its exit status is in the record's state)"
else
  wait "$CPID"; RC=$?
fi
cp "$LIVE/choice.json" "$LIVE/choose-progress.txt" "$R/" 2>/dev/null
echo "choose rc=$RC" >> "$R/choose-progress.txt"
redact "$R/choose-progress.txt" "$R/choice.json"; tail -5 "$R/choose-progress.txt"; pack

say "collect"
ID=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["id"])' "$R/choice.json" 2>/dev/null)
if [ -z "$ID" ]; then  # still running (or cut): the newest choice's record as the controller has it now
  ID=$("${APP[@]}" choices --json 2>/dev/null | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r[0]["id"] if r else "")' 2>/dev/null)
  [ -n "$ID" ] && "${APP[@]}" choices "$ID" --json > "$R/choice.json" 2>/dev/null
fi
[ -n "$ID" ] && "${APP[@]}" choices "$ID" --markdown > "$R/choice.md" 2>&1
"${APP[@]}" launches --json > "$R/launches.json" 2>&1
mkdir -p "$R/launches" "$R/comparisons"
for id in $(python3 -c 'import json,sys; print(" ".join(r["id"] for r in json.load(open(sys.argv[1]))))' "$R/launches.json" 2>/dev/null); do
  mkdir -p "$R/runs/$id"; cp "/root/app/runs/$id/engine.log" "$R/runs/$id/" 2>/dev/null
  "${APP[@]}" launches "$id" --json > "$R/launches/$id.json" 2>/dev/null
done
# Each gate's compare record, read from the evaluation store as `compare --out` would have written it.
python3 - "$R/choice.json" "$R/comparisons" <<'PY' >> "$R/choose-progress.txt" 2>&1
import json, sys
from pathlib import Path
from controller.evaluation.store import EvalStore
from controller.settings import Paths
try:
    record = json.load(open(sys.argv[1]))
except (OSError, ValueError) as exc:
    print(f"no decision record, no comparisons: {exc}"); sys.exit(0)
evals = EvalStore(Paths(Path("/root/app")).db)
for cid in sorted({x["comparison_id"] for x in record["lines"] if x.get("comparison_id")}):
    found = evals.comparison(cid)
    if found is None:
        print(f"comparison {cid}: not in the store"); continue
    info, gate = found
    runs = [evals.benchmark(str(row["id"])) for row in reversed(evals.benchmarks(40, comparison_id=cid))]
    arms = {arm: [r for r in runs if r is not None and r.recipe == info[arm]] for arm in ("baseline", "candidate")}
    report = {**info, "gate": gate.model_dump(mode="json"),
              "baselines": [r.summary() for r in arms["baseline"]],
              "candidates": [r.summary() for r in arms["candidate"]],
              "runs": {arm: [r.model_dump(mode="json") for r in rs] for arm, rs in arms.items()}}
    Path(sys.argv[2], f"{cid}.json").write_text(json.dumps(report, indent=2, default=str))
    print(f"comparison {cid}: {info['candidate']} vs {info['baseline']} {info['verdict']}")
PY
[ "$RC" = 124 ] || timeout 30 "${APP[@]}" down > "$R/down.txt" 2>&1  # a choice still running is left to the next call
find "$R" -type f -size +4M -exec truncate -s 4M {} +
redact "$R"/*.txt "$R"/*.json "$R"/*.md "$R"/runs/*/engine.log "$R"/launches/*.json "$R"/comparisons/*.json
cp "$R/choice.json" "$OUT/choice.json" 2>/dev/null; cp "$R/choice.md" "$OUT/choice.md" 2>/dev/null
cp -r "$R/comparisons" "$R/launches" "$OUT/" 2>/dev/null
python3 - "$R/choice.json" > "$OUT/choose-summary.txt" 2>&1 <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except (OSError, ValueError) as exc:
    print(f"no decision record: {exc}"); sys.exit(0)
took = (r.get("ended_at") or r["started_at"]) - r["started_at"]
print(f"choice {r['id']} {r['state']}: champion {r['champion']} ({r['champion_why']})")
print(f"expected {r['eta_s']:.0f} s, took {took:.0f} s, budget {r.get('budget_s')}; ended: {r.get('ended_why')}")
for x in r["lines"]:
    print(f"  {x.get('stage', 'tournament')[:5]} {x['recipe']:28} {x['status']:11} {x.get('verdict') or '-':20} {x.get('comparison_id') or '-':18} "
          f"ETA {x.get('eta_s')} took {x.get('took_s')}  {x['why'][:200]}")
PY
{ echo; echo "wall time $(( $(date +%s) - T0 )) s; choose rc=$RC"; cat "$R/gpu.txt"; } >> "$OUT/choose-summary.txt"
cp "$OUT/choose-summary.txt" "$R/"; pack
cat "$OUT/choose-summary.txt"; ls -l "$OUT"
exit $RC
