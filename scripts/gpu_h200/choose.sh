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
# What comes back: $OUT/choice.json (the decision record), $OUT/choice.md (its table),
# $OUT/choose-summary.txt, $OUT/choose.tgz (progress, launches, comparisons, engine logs, redacted).
set -uo pipefail
W="$PWD/.gpuwt"; cd "$W" || exit 2  # python -m puts the cwd first on sys.path: the checkout's own code must not win
export APPLIANCE_HOME=/root/app APPLIANCE_RECIPES="$W/recipes" PYTHONPATH="/root/site:$W" PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT="${OUT:-/tmp/choose-out}"; mkdir -p "$OUT"
APP=(python3 -m controller.cli.main)
R=/root/results/choose
T0=$(date +%s)
say() { echo "[choose $(( $(date +%s) - T0 ))s] $*"; }
redact() {  # the admin token, gateway keys (sk-app-…), engine keys (eng_ + 43 url-safe base64 chars)
  sed -i -E -e "s/(APPLIANCE_ADMIN_TOKEN=)[^ ]+/\1<redacted>/g; s/(shown once\): )[^ ]+/\1<redacted>/g" \
    -e 's/adm_[A-Za-z0-9_-]{43}/adm_<redacted>/g; s/sk-app-[A-Za-z0-9_-]+/sk-app-<redacted>/g' \
    -e 's/eng_[A-Za-z0-9_-]{43}/eng_<redacted>/g' "$@" 2>/dev/null
}
pack() { tar -C /root/results -czf "$OUT/choose.tgz" choose 2>/dev/null; }
layout() {
  mkdir -p /root/app/engine/cuda/bin /root/app/models
  printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" > /root/app/engine/cuda/bin/python
  chmod +x /root/app/engine/cuda/bin/python
  ln -sfn /root/site /root/app/engine/cuda/site
  ln -sfn /root/gpu/smollm2 /root/app/models/smollm2-135m-instruct
}

[ -d /root/site/vllm ] || { echo "no vLLM in /root/site: run gpu-kit's setup.sh first (docs/gpu-h200.md)"; exit 2; }
ACC=(--accuracy)
if ! python3 -c 'import rouge_score' 2>/dev/null; then
  for whl in "$W"/../.whl/*.whl "$W"/.whl/*.whl; do
    [ -f "$whl" ] && python3 -m zipfile -e "$whl" /root/site
  done
  python3 -c 'import rouge_score' 2>/dev/null \
    || { ACC=(--no-accuracy); say "rouge-score not importable (no wheels in .whl/): the choice runs with --no-accuracy"; }
fi
if [ -e /root/app ]; then
  timeout 60 "${APP[@]}" down > /dev/null 2>&1
  mv /root/app "/root/app.prev-$T0"; say "moved an earlier /root/app to /root/app.prev-$T0"
fi
rm -rf "$R"; mkdir -p "$R"
layout
TOKEN=$(python3 -c 'from pathlib import Path; from controller import admin_token as a; t = a.new_token(); a.write_hash(Path("/root/app"), t); print(t)')
export APPLIANCE_ADMIN_TOKEN="$TOKEN"
nvidia-smi --query-gpu=name,memory.used,memory.total,power.limit,driver_version --format=csv,noheader > "$R/gpu.txt" 2>&1

say "up with the baseline (eager)"
timeout 240 "${APP[@]}" up --recipe cuda-smollm2-eager > "$R/up.txt" 2>&1; echo "up rc=$?" >> "$R/up.txt"
redact "$R/up.txt"; tail -3 "$R/up.txt"; pack

say "choose (plan, then the tournament; the ETA is in the plan)"
timeout 560 "${APP[@]}" choose --recipes 'cuda-smollm2-*' --json --yes "${ACC[@]}" \
  --budget "${CHOOSE_BUDGET:-8m}" --ready-timeout 400 > "$R/choice.json" 2> "$R/choose-progress.txt"
RC=$?; echo "choose rc=$RC" >> "$R/choose-progress.txt"
redact "$R/choose-progress.txt" "$R/choice.json"; tail -5 "$R/choose-progress.txt"; pack

say "collect"
ID=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["id"])' "$R/choice.json" 2>/dev/null)
[ -n "$ID" ] && "${APP[@]}" choices "$ID" --markdown > "$R/choice.md" 2>&1
"${APP[@]}" launches --json > "$R/launches.json" 2>&1
for id in $(python3 -c 'import json,sys; print(" ".join(r["id"] for r in json.load(open(sys.argv[1]))))' "$R/launches.json" 2>/dev/null); do
  mkdir -p "$R/runs/$id"; cp "/root/app/runs/$id/engine.log" "$R/runs/$id/" 2>/dev/null
done
timeout 30 "${APP[@]}" down > "$R/down.txt" 2>&1
find "$R" -type f -size +4M -exec truncate -s 4M {} +
redact "$R"/*.txt "$R"/*.json "$R"/*.md "$R"/runs/*/engine.log
cp "$R/choice.json" "$OUT/choice.json" 2>/dev/null; cp "$R/choice.md" "$OUT/choice.md" 2>/dev/null
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
    print(f"  {x['recipe']:28} {x['status']:11} {x.get('verdict') or '-':20} {x.get('comparison_id') or '-':18} "
          f"ETA {x.get('eta_s')} took {x.get('took_s')}  {x['why'][:200]}")
PY
{ echo; echo "wall time $(( $(date +%s) - T0 )) s; choose rc=$RC"; cat "$R/gpu.txt"; } >> "$OUT/choose-summary.txt"
cp "$OUT/choose-summary.txt" "$R/"; pack
cat "$OUT/choose-summary.txt"; ls -l "$OUT"
exit $RC
