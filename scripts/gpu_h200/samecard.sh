#!/bin/bash
# samecard.sh — blue/green on the SAME GPU card, on the lent H200: a restart of a
# GPU engine under load starts the new engine beside the serving one on its card (the card's free
# memory admits it: controller/supervisor/blue_green.py `same_card_fit`), switches the gateway when
# it is ready, then drains and stops the old one; no client is held for the start.
# docs/gpu-h200.md says how it is sent: the kit set up by an earlier call (gpu-kit's setup.sh: vLLM
# 0.26.0 in /root/site, the model in /root/gpu/smollm2), the appliance's code in .gpuwt/; run from the
# repo root copy as
#   bash .gpuwt/scripts/gpu_h200/samecard.sh
# Steps: `up --recipe cuda-smollm2-graph` (gpu_memory_utilization 0.3 of 139.8 GiB: two fit; cold
# warm-up then warm restart ≈ 89 + 38 s measured) · 4 clients of chat completions through the gateway
# (switch_load.py) · 15 s steady · `restart --json` (its `switch` must say blue_green) · wait, bounded,
# until the new launch is ready and the old one gone (≈ 62 s measured for a second engine beside the
# first) · 10 s more load · stop the clients · collect · down.
# Budget: everything packed by DEADLINE (340 s) of wall time, each wait bounded by what is left; the
# background processes (the clients, the nvidia-smi sampler) are stopped by their PIDs, the appliance
# by `down`, also when a step fails (trap).
# What comes back: $OUT/samecard.tgz (samecard/: launch-ID.json, launches.json, restart.json,
# status-*.json, client.json, gpu-mem.csv, runs/ID/engine.log, logs/ — the controller's and gateway's
# logs), and beside it $OUT/samecard-summary.txt (scripts/gpu_h200/samecard_judge.py's verdict and
# figures: the path and its numbers, failed requests, the longest wait, p99 steady vs during the
# switch), $OUT/client.json, $OUT/launches.json, $OUT/launch-ID.json, $OUT/controller.log.
set -euo pipefail
W="$PWD/.gpuwt"; cd "$W"  # python -m puts the cwd first on sys.path: the checkout's own code must not win
export APPLIANCE_HOME=/root/app APPLIANCE_RECIPES="$W/recipes" PYTHONPATH="/root/site:$W" PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT="${OUT:-/tmp/samecard-out}"; mkdir -p "$OUT"
APP=(python3 -m controller.cli.main)
R=/root/results/samecard
T0=$(date +%s)
DEADLINE=${SAMECARD_DEADLINE_S:-340}  # seconds of wall time by which everything is packed
RESERVE=45                            # stop clients + collect + down + pack + judge
RECIPE=cuda-smollm2-graph
CLIENT_PID=""; SMI_PID=""; UP=0; DONE=0
say() { echo "[samecard $(( $(date +%s) - T0 ))s] $*"; }
el() { echo $(( $(date +%s) - T0 )); }
# a wait's bound: its own cap, or what is left before DEADLINE - RESERVE (at least 1 s)
cap() { local rest=$(( DEADLINE - RESERVE - $(el) )); [ "$rest" -lt 1 ] && rest=1; [ "$rest" -lt "$1" ] && echo "$rest" || echo "$1"; }
redact() {  # the admin token, gateway keys (sk-app-…), engine keys (eng_ + 43 url-safe base64 chars)
  sed -i -E -e "s/(APPLIANCE_ADMIN_TOKEN=)[^ ]+/\1<redacted>/g; s/(shown once\): )[^ ]+/\1<redacted>/g" \
    -e 's/adm_[A-Za-z0-9_-]{43}/adm_<redacted>/g; s/sk-app-[A-Za-z0-9_-]+/sk-app-<redacted>/g' \
    -e 's/eng_[A-Za-z0-9_-]{43}/eng_<redacted>/g' "$@" 2>/dev/null || true
}
pack() { tar -C /root/results -czf "$OUT/samecard.tgz" samecard 2>/dev/null || true; }
layout() {
  mkdir -p /root/app/engine/cuda/bin /root/app/models
  printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" > /root/app/engine/cuda/bin/python
  chmod +x /root/app/engine/cuda/bin/python
  ln -sfn /root/site /root/app/engine/cuda/site
  ln -sfn /root/gpu/smollm2 /root/app/models/smollm2-135m-instruct
}
# stop PID: TERM, up to 10 s, then KILL — only the processes this script started
stop_pid() {
  local pid="$1" i
  [ -n "$pid" ] || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for i in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.5; done
  kill -KILL "$pid" 2>/dev/null || true
}
# the status as JSON → FILE; the value of a dotted key of it (empty when absent)
status_to() { timeout 20 "${APP[@]}" status --json > "$1" 2>/dev/null || true; }
field() {
  python3 - "$1" "$2" <<'PY' 2>/dev/null || true
import json, sys
try:
    v = json.load(open(sys.argv[1]))
    for part in sys.argv[2].split("."):
        v = v.get(part) if isinstance(v, dict) else None
except (OSError, ValueError):
    v = None
print("" if v is None else v)
PY
}
collect() {
  say "collect"
  timeout 20 "${APP[@]}" launches --json > "$R/launches.json" 2>&1 || true
  local id
  for id in $(python3 -c 'import json,sys; print(" ".join(r["id"] for r in json.load(open(sys.argv[1]))))' "$R/launches.json" 2>/dev/null || true); do
    timeout 20 "${APP[@]}" launches "$id" --json > "$R/launch-$id.json" 2>/dev/null || true
    mkdir -p "$R/runs/$id"; cp "/root/app/runs/$id/engine.log" "$R/runs/$id/" 2>/dev/null || true
  done
  status_to "$R/status-end.json"
}
finish() {  # on every exit: the background processes by PID, the appliance by `down`, then pack
  local rc=$?
  [ "$DONE" = 1 ] && return 0
  DONE=1
  set +e
  touch "$R/stop" 2>/dev/null
  stop_pid "$CLIENT_PID"; stop_pid "$SMI_PID"
  if [ "$UP" = 1 ]; then
    [ -f "$R/launches.json" ] || collect
    say "down"; timeout 40 "${APP[@]}" down > "$R/down.txt" 2>&1
  fi
  mkdir -p "$R/logs"; cp /root/app/logs/*.log "$R/logs/" 2>/dev/null
  find "$R" -type f -size +4M -exec truncate -s 4M {} + 2>/dev/null
  redact "$R"/*.txt "$R"/*.json "$R"/runs/*/engine.log "$R"/logs/*
  pack
  say "judge"
  python3 "$W/scripts/gpu_h200/samecard_judge.py" "$R" > "$OUT/samecard-summary.txt" 2>&1; local jrc=$?
  { echo; echo "wall time $(el) s; script rc=$rc"; cat "$R/steps.txt" 2>/dev/null; } >> "$OUT/samecard-summary.txt"
  cp "$OUT/samecard-summary.txt" "$R/" 2>/dev/null
  cp "$R/client.json" "$R/launches.json" "$R"/launch-*.json "$R/restart.json" "$OUT/" 2>/dev/null
  cp "$R/logs/controller.log" "$OUT/controller.log" 2>/dev/null || cp "$R"/logs/*.log "$OUT/" 2>/dev/null
  pack
  cat "$OUT/samecard-summary.txt"; ls -l "$OUT"
  [ "$rc" = 0 ] && exit "$jrc" || exit "$rc"
}
trap finish EXIT

[ -d /root/site/vllm ] || { echo "no vLLM in /root/site: run gpu-kit's setup.sh first (docs/gpu-h200.md)"; exit 2; }
# A clean appliance home: a cold start needs an empty cache root, and the records must be this run's.
if [ -e /root/app ]; then
  timeout 60 "${APP[@]}" down > /dev/null 2>&1 || true
  mv /root/app "/root/app.prev-$T0"; say "moved an earlier /root/app to /root/app.prev-$T0"
fi
rm -rf "$R"; mkdir -p "$R"; : > "$R/steps.txt"
layout
TOKEN=$(python3 -c 'from pathlib import Path; from controller import admin_token as a; t = a.new_token(); a.write_hash(Path("/root/app"), t); print(t)')
export APPLIANCE_ADMIN_TOKEN="$TOKEN"  # `up` finds the hash and takes this token: nothing shown once
nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv,noheader > "$R/gpu.txt" 2>&1 || true
# the client key, before `up`: on stdout once with --json, kept in /root/app (never in the results)
"${APP[@]}" keys create --name samecard --json 2> "$R/keys-create.txt" \
  | python3 -c 'import json,sys; d=json.load(sys.stdin); open("/root/app/samecard.key","w").write(d["key"]); print("key", d["id"], d["name"])' >> "$R/keys-create.txt" 2>&1
redact "$R/keys-create.txt"

say "up --recipe $RECIPE (timeout $(cap 240) s)"
UP=1
rc=0; timeout "$(cap 240)" "${APP[@]}" up --recipe "$RECIPE" > "$R/up.txt" 2>&1 || rc=$?
redact "$R/up.txt"; tail -3 "$R/up.txt"; echo "up rc=$rc" >> "$R/steps.txt"
status_to "$R/status-before.json"
[ "$(field "$R/status-before.json" state)" = ready ] || { say "not ready after up: stopping here"; exit 1; }
OLD_ID=$(field "$R/status-before.json" launch.id)
MODEL=$(field "$R/status-before.json" launch.served_model_name)
say "ready: launch $OLD_ID, model ${MODEL:-smollm2}"
# the card's memory every 2 s for the whole switch (two engines: ≈ 44 → 88 GiB measured)
nvidia-smi --query-gpu=timestamp,index,memory.used,memory.total --format=csv,noheader -l 2 > "$R/gpu-mem.csv" 2>&1 &
SMI_PID=$!

say "load: 4 clients through the gateway"
python3 "$W/scripts/gpu_h200/switch_load.py" http://127.0.0.1:8080 "${MODEL:-smollm2}" "$R/client.json" \
  --key-file /root/app/samecard.key --stop-file "$R/stop" --clients 4 --max-s "$(cap 200)" \
  > "$R/client.txt" 2>&1 &
CLIENT_PID=$!
sleep 15

say "restart --json"
rc=0; timeout 30 "${APP[@]}" restart --json > "$R/restart.json" 2> "$R/restart.err" || rc=$?
echo "restart rc=$rc path=$(field "$R/restart.json" switch.path)" >> "$R/steps.txt"
say "restart answered: path $(field "$R/restart.json" switch.path)"
# bounded: until a new launch serves and the old one is gone (blue_green null), or the bound
WAIT=$(cap 150); END=$(( $(el) + WAIT )); NEW_ID=""
while [ "$(el)" -lt "$END" ]; do
  status_to "$R/status-poll.json"
  NEW_ID=$(field "$R/status-poll.json" launch.id)
  if [ "$(field "$R/status-poll.json" state)" = ready ] && [ -n "$NEW_ID" ] && [ "$NEW_ID" != "$OLD_ID" ] \
     && [ -z "$(field "$R/status-poll.json" blue_green)" ]; then
    break
  fi
  sleep 2
done
cp "$R/status-poll.json" "$R/status-after.json" 2>/dev/null || true
echo "switch: old $OLD_ID new ${NEW_ID:-none} after $(el) s (bound $WAIT s)" >> "$R/steps.txt"
say "switched to ${NEW_ID:-none}"
sleep "$(cap 10)"

say "stop the clients"
touch "$R/stop"
for _ in $(seq 1 60); do kill -0 "$CLIENT_PID" 2>/dev/null || break; sleep 0.5; done
stop_pid "$CLIENT_PID"; CLIENT_PID=""
cat "$R/client.txt" 2>/dev/null || true
stop_pid "$SMI_PID"; SMI_PID=""
collect
exit 0
