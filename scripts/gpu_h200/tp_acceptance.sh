#!/bin/bash
# tp_acceptance.sh N ARM — the tensor-parallel run on N H200s of one host (kind nvidia-h200-x2 for N=2,
# nvidia-h200-x4 for N=4), through the appliance, with the tensor-parallel model (scripts/make_tp_model.py;
# SmolLM2's 9 heads refuse TP > 1). Modelled on acceptance.sh; docs/gpu-h200.md ("Tensor parallel")
# gives the device calls. Prerequisite: gpu-kit's setup.sh ran in an earlier call on the same machine
# (vLLM 0.26.0 in /root/site, SmolLM2 in /root/gpu/smollm2 — its tokenizer is copied into the model).
#   ARM car    custom all-reduce on:  up cuda-tpN-graph (cold, then warm: warm_restart) · restart (warm 2)
#              · apply cuda-tpN-piecewise (cold + warm) · restart · apply cuda-tpN-eager
#   ARM nocar  the same recipes with -nocar (custom all-reduce off), then a rank's death: rank 1's worker
#              of the running engine killed by PID (its pid from the launch record's engine.ranks), and
#              the controller's diagnosis of it
#   ARM compare  `appliance compare cuda-tpN-eager cuda-tpN-graph --rounds 1` (decode, TTFT, ready, the
#              reproducibility fingerprint across restarts)
# Every step: one chat completion through the gateway (port 8080, key `accept`), and decode_client.py's
# TTFT / decode ms/token through the gateway. Also: nvidia-smi topo -m and the P2P path, nvidia-smi
# per card after each step (graph pool per rank is in each record's engine facts and its per-rank log).
# Budget: DEADLINE (520 s) of wall time per call; a step that would not fit is skipped, `pack` after each.
# What comes back: $OUT/tp-N-ARM.tgz (launch-ID.json with engine.ranks, engine logs, bench-*.json,
# topo.txt, p2p.txt, steps.tsv, CLI outputs) and $OUT/tp-N-ARM-summary.txt.
set -uo pipefail
N="${1:?N: 2 or 4}"; ARM="${2:?ARM: car, nocar or compare}"
W="$PWD/.gpuwt"; cd "$W" || exit 2  # python -m puts the cwd first on sys.path: the checkout's own code must not win
export APPLIANCE_HOME=/root/app APPLIANCE_RECIPES="$W/recipes" PYTHONPATH="/root/site:$W" PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT="${OUT:-/tmp/tp-out}"; mkdir -p "$OUT"
APP=(python3 -m controller.cli.main)
NAME="tp-$N-$ARM"; R="/root/results/$NAME"
SUF=""; [ "$ARM" = nocar ] && SUF="-nocar"
T0=$(date +%s)
DEADLINE=${ACCEPT_DEADLINE_S:-520}
RESERVE=40
say() { echo "[$NAME $(( $(date +%s) - T0 ))s] $*"; }
el() { echo $(( $(date +%s) - T0 )); }
left() { [ "$(el)" -lt "$1" ]; }
cap() { local rest=$(( DEADLINE - RESERVE - $(el) )); [ "$rest" -lt "$1" ] && echo "$rest" || echo "$1"; }
redact() {
  sed -i -E -e "s/(APPLIANCE_ADMIN_TOKEN=)[^ ]+/\1<redacted>/g; s/(shown once\): )[^ ]+/\1<redacted>/g" \
    -e 's/adm_[A-Za-z0-9_-]{43}/adm_<redacted>/g; s/sk-app-[A-Za-z0-9_-]+/sk-app-<redacted>/g' \
    -e 's/eng_[A-Za-z0-9_-]{43}/eng_<redacted>/g' "$@" 2>/dev/null
}
pack() { tar -C /root/results -czf "$OUT/$NAME.tgz" "$NAME" 2>/dev/null; }
step() { printf '%s\t%s\n' "$1" "$2" >> "$R/steps.tsv"; }
nv() { nvidia-smi --query-gpu=index,memory.used,memory.total,utilization.gpu --format=csv,noheader \
         | sed "s/^/$1 gpu /" >> "$R/nvidia-smi.txt"; }
bench() {  # decode ms/token and TTFT through the gateway, with the client key (environment only)
  DECODE_CLIENT_KEY="$(cat /root/app/accept.key 2>/dev/null)" timeout 90 \
    python3 "$W/scripts/gpu_h200/decode_client.py" http://127.0.0.1:8080 tp-llama "$1" "$R/bench-$1.json" 2>&1 | tail -1
}
run_step() {  # run_step NAME TIMEOUT-CAP MIN-LEFT cmd…
  local name="$1" maxt="$2" need="$3"; shift 3
  if ! left $(( DEADLINE - RESERVE - need )); then
    say "skipping $name: $(el) s gone, it needs ~$need s"; step "$name" skipped; pack; return 1
  fi
  local t; t=$(cap "$maxt"); say "$name (timeout $t s)"
  timeout "$t" "${APP[@]}" "$@" > "$R/$name.txt" 2>&1; local rc=$?
  redact "$R/$name.txt"; tail -4 "$R/$name.txt"
  [ "$rc" = 0 ] && step "$name" ok || step "$name" "rc=$rc"
  nv "$name"; [ "$rc" = 0 ] && bench "$name"; pack
  return 0
}

[ -d /root/site/vllm ] || { echo "no vLLM in /root/site: run gpu-kit's setup.sh first (docs/gpu-h200.md)"; exit 2; }
GPUS=$(nvidia-smi -L 2>/dev/null | wc -l)
[ "$GPUS" -ge "$N" ] || { echo "TP=$N needs $N GPUs; this machine has $GPUS (kind nvidia-h200-x$N)"; exit 2; }
if [ "$ARM" != compare ] && [ -e /root/app ]; then
  timeout 60 "${APP[@]}" down > /dev/null 2>&1
  mv /root/app "/root/app.prev-$T0"; say "moved an earlier /root/app to /root/app.prev-$T0"
fi
rm -rf "$R"; mkdir -p "$R"; : > "$R/steps.tsv"
mkdir -p /root/app/engine/cuda/bin /root/app/models
printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" > /root/app/engine/cuda/bin/python
chmod +x /root/app/engine/cuda/bin/python
ln -sfn /root/site /root/app/engine/cuda/site
ln -sfn /root/gpu/smollm2 /root/app/models/smollm2-135m-instruct
[ -f /root/app/models/tp-llama-8h4kv/config.json ] || \
  python3 "$W/scripts/make_tp_model.py" --tokenizer-from /root/gpu/smollm2 --out /root/app/models/tp-llama-8h4kv --check \
  > "$R/make-model.txt" 2>&1
nvidia-smi topo -m > "$R/topo.txt" 2>&1
nvidia-smi topo -p2p r > "$R/p2p.txt" 2>&1; nvidia-smi nvlink -s >> "$R/p2p.txt" 2>&1
nv idle
[ -s /root/app/token ] || python3 -c 'from pathlib import Path; from controller import admin_token as a; t = a.new_token(); a.write_hash(Path("/root/app"), t); print(t)' > /root/app/token
export APPLIANCE_ADMIN_TOKEN="$(cat /root/app/token)"
[ -s /root/app/accept.key ] || "${APP[@]}" keys create --name accept --json 2> "$R/keys-create.txt" \
  | python3 -c 'import json,sys; d=json.load(sys.stdin); open("/root/app/accept.key","w").write(d["key"]); print("key", d["id"])' >> "$R/keys-create.txt" 2>&1
"${APP[@]}" plan "cuda-tp$N-graph$SUF" > "$R/plan.txt" 2>&1; grep -E "gpus|memory-peak|verdict" "$R/plan.txt" | head -6

if [ "$ARM" = compare ]; then
  run_step up-eager 300 120 up --recipe "cuda-tp$N-eager"
  run_step compare 420 300 compare "cuda-tp$N-eager" "cuda-tp$N-graph" --rounds 1
else
  run_step "up-graph$SUF" 330 150 up --recipe "cuda-tp$N-graph$SUF"
  run_step "restart-graph$SUF" 150 60 restart --follow
  run_step "apply-piecewise$SUF" 240 130 apply "cuda-tp$N-piecewise$SUF" --follow \
    && run_step "restart-piecewise$SUF" 150 60 restart --follow
  run_step "apply-eager$SUF" 200 90 apply "cuda-tp$N-eager$SUF" --follow
fi
if [ "$ARM" = nocar ] && left $(( DEADLINE - RESERVE - 45 )); then
  # A rank's death: rank 1's worker of the running engine, by the pid the launch record gives it.
  "${APP[@]}" status --json > "$R/status-before-kill.json" 2>&1
  ID=$(python3 -c 'import json,sys; print((json.load(open(sys.argv[1])).get("launch") or {}).get("id", ""))' "$R/status-before-kill.json")
  "${APP[@]}" launches "$ID" --json > "$R/launch-before-kill.json" 2>&1
  PID=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["engine"]["ranks"]["1"]["pid"])' "$R/launch-before-kill.json" 2>/dev/null)
  if [ -n "$PID" ] && grep -q "TP1" "/proc/$PID/cmdline" 2>/dev/null; then
    say "kill rank 1 (pid $PID)"; kill -9 "$PID"; step kill-rank1 "pid $PID"
    sleep 20; "${APP[@]}" status --json > "$R/status-after-kill.json" 2>&1
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])).get("last_diagnosis") or {}; print("diagnosis:", d.get("code"), "-", d.get("summary"))' "$R/status-after-kill.json"
  else
    say "no rank-1 pid in the record (got '$PID')"; step kill-rank1 "no pid"
  fi
fi

say "collect"
"${APP[@]}" launches --json > "$R/launches.json" 2>&1
for id in $(python3 -c 'import json,sys; print(" ".join(r["id"] for r in json.load(open(sys.argv[1]))))' "$R/launches.json" 2>/dev/null); do
  "${APP[@]}" launches "$id" --json > "$R/launch-$id.json" 2> "$R/launch-$id.explain.txt"
  mkdir -p "$R/runs/$id"; cp "/root/app/runs/$id/engine.log" "$R/runs/$id/" 2>/dev/null
done
"${APP[@]}" status --json > "$R/status.json" 2>&1
say "down"; timeout 30 "${APP[@]}" down > "$R/down.txt" 2>&1
mkdir -p "$R/logs"; cp /root/app/logs/*.log "$R/logs/" 2>/dev/null
find "$R" -type f -size +4M -exec truncate -s 4M {} +
redact "$R"/*.txt "$R"/*.json "$R"/runs/*/engine.log "$R"/logs/*
python3 - "$R" > "$OUT/$NAME-summary.txt" 2>&1 <<'PY'
import json, pathlib, sys
r = pathlib.Path(sys.argv[1])
print("launch  recipe  status  ready_s  cache  ranks: pid furthest cache anon_peak_GiB graph_pool_GiB")
for p in sorted(r.glob("launch-*.json")):
    try:
        d = json.loads(p.read_text())
    except ValueError:
        continue
    if "recipe" not in d:
        continue
    ranks = (d.get("engine") or {}).get("ranks") or {}
    per = "; ".join(f"{k}: {v.get('pid')} {v.get('furthest')} {v.get('cache_outcome')} "
                    f"{(v.get('anon_peak_bytes') or 0) / 2**30:.2f} pool {v.get('graph_pool_gib')}"
                    for k, v in sorted(ranks.items()))
    eng = d.get("engine") or {}
    print(d.get("id"), d["recipe"], d.get("status"), d.get("ready_s"), d.get("cache"),
          "graph_pool_gib", eng.get("graph_pool_gib"), "|", per)
for p in sorted(r.glob("bench-*.json")):
    b = json.loads(p.read_text())
    print(p.stem, "decode ms/token", b.get("decode_ms_per_token_median"), "TTFT ms", b.get("ttft_ms_median"),
          "same across requests", b.get("same_across_requests"))
PY
{ echo; echo "wall time $(el) s; steps:"; cat "$R/steps.tsv"; } >> "$OUT/$NAME-summary.txt"
cp "$OUT/$NAME-summary.txt" "$R/"; pack
cat "$OUT/$NAME-summary.txt"; ls -l "$OUT"
