#!/bin/bash
# alongside.sh — two engines side by side on the ONE card of the lent H200, behind one gateway:
# `up --recipe cuda-smollm2-graph` (the primary, model `smollm2`, gpu_memory_utilization 0.3), then
# `apply cuda-smollm2-eager-side --alongside` (a recipe this script writes: cuda-smollm2-eager served as
# `smollm2-side` on port 8001) — admitted against the card's free memory with the graph engine on it
# (controller/supervisor/alongside_admission.py), started beside it, its own gateway slot. Then 2 clients
# per model through the gateway (both must answer, 0 failed) across a restart of the primary (same-card
# blue/green when the card's free memory admits a third engine for the switch, else the hold: the path
# and why are reported), then `stop --model smollm2-side`: the primary keeps answering, the side model
# answers 404.
# docs/gpu-h200.md says how it is sent: the kit set up by an earlier call (gpu-kit's setup.sh: vLLM
# 0.26.0 in /root/site, the model in /root/gpu/smollm2), the appliance's code in .gpuwt/; run from the
# repo root copy as
#   bash .gpuwt/scripts/gpu_h200/alongside.sh
# Budget: everything packed by DEADLINE (560 s) of wall time, each wait bounded by what is left; the
# background processes (the clients, the nvidia-smi sampler) are stopped by their PIDs, the appliance
# by `down`, also when a step fails (trap).
# What comes back: $OUT/alongside.tgz (alongside/: status-*.json, apply.json, client-*.json,
# gpu-mem.csv, after-stop.txt, launches.json, launch-ID.json, runs/ID/engine.log, logs/) and
# $OUT/alongside-summary.txt (the verdict: both engines ready on one card, each model's requests and
# failures, the card's memory with one and two engines, what answered after the stop).
NAME=alongside
# shellcheck source=scripts/gpu_h200/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # the shared prelude: env, layout, token, redact, pack, collect
set -e
DEADLINE=${ALONGSIDE_DEADLINE_S:-560}  # seconds of wall time by which everything is packed
RESERVE=45                             # stop clients + collect + down + pack + judge
PRIMARY=cuda-smollm2-graph
SIDE=cuda-smollm2-eager-side
SIDE_MODEL=smollm2-side
CLIENT_A=""; CLIENT_B=""; SMI_PID=""; UP=0; DONE=0
el() { echo $(( $(date +%s) - T0 )); }
# a wait's bound: its own cap, or what is left before DEADLINE - RESERVE (at least 1 s)
cap() { local rest=$(( DEADLINE - RESERVE - $(el) )); [ "$rest" -lt 1 ] && rest=1; [ "$rest" -lt "$1" ] && echo "$rest" || echo "$1"; }
# one engine of the status' `engines` list by model: its state (empty when absent)
engine_state() {
  python3 - "$1" "$2" <<'PY' 2>/dev/null || true
import json, sys
try:
    rows = json.load(open(sys.argv[1])).get("engines") or []
except (OSError, ValueError):
    rows = []
print(next((str(r.get("state")) for r in rows if r.get("model") == sys.argv[2]), ""))
PY
}
ask() {  # ask MODEL: one chat completion through the gateway → its HTTP status
  python3 - "$1" <<'PY' 2>/dev/null || echo none
import json, sys, urllib.error, urllib.request
key = open("/root/app/alongside.key").read().strip()
body = json.dumps({"model": sys.argv[1], "max_tokens": 8, "temperature": 0,
                   "messages": [{"role": "user", "content": "Say hi."}]}).encode()
req = urllib.request.Request("http://127.0.0.1:8080/v1/chat/completions", data=body, method="POST",
                             headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=60) as resp:
        print(resp.status)
except urllib.error.HTTPError as exc:
    print(exc.code)
PY
}
finish() {  # on every exit: the background processes by PID, the appliance by `down`, then pack
  local rc=$?
  [ "$DONE" = 1 ] && return 0
  DONE=1
  set +e
  touch "$R/stop" 2>/dev/null
  stop_pid "$CLIENT_A"; stop_pid "$CLIENT_B"; stop_pid "$SMI_PID"
  if [ "$UP" = 1 ]; then
    [ -f "$R/launches.json" ] || collect
    say "down"; timeout 60 "${APP[@]}" down > "$R/down.txt" 2>&1
  fi
  mkdir -p "$R/logs"; cp /root/app/logs/*.log "$R/logs/" 2>/dev/null
  find "$R" -type f -size +4M -exec truncate -s 4M {} + 2>/dev/null
  redact "$R"/*.txt "$R"/*.json "$R"/runs/*/engine.log "$R"/logs/*
  say "judge"
  python3 "$W/scripts/gpu_h200/alongside_judge.py" "$R" > "$OUT/alongside-summary.txt" 2>&1; local jrc=$?
  { echo; echo "wall time $(el) s; script rc=$rc"; cat "$R/steps.txt" 2>/dev/null; } >> "$OUT/alongside-summary.txt"
  cp "$OUT/alongside-summary.txt" "$R/" 2>/dev/null
  cp "$R"/client-*.json "$R/launches.json" "$R/status-both.json" "$R/restart.json" "$OUT/" 2>/dev/null
  cp "$R/logs/controller.log" "$OUT/controller.log" 2>/dev/null
  pack
  cat "$OUT/alongside-summary.txt"; ls -l "$OUT"
  [ "$rc" = 0 ] && exit "$jrc" || exit "$rc"
}
trap finish EXIT

: > "$R/steps.txt"
# the engine beside the primary: cuda-smollm2-eager under another served name and port
cat > "$W/recipes/$SIDE.yaml" <<YAML
name: $SIDE
extends: cuda-smollm2-eager
description: cuda-smollm2-eager served as $SIDE_MODEL on port 8001, beside the graph engine on the same card
model:
  served_name: $SIDE_MODEL
engine:
  port: 8001
YAML
"${APP[@]}" keys create --name alongside --json 2> "$R/keys-create.txt" \
  | python3 -c 'import json,sys; d=json.load(sys.stdin); open("/root/app/alongside.key","w").write(d["key"]); print("key", d["id"], d["name"])' >> "$R/keys-create.txt" 2>&1
redact "$R/keys-create.txt"

say "up --recipe $PRIMARY (timeout $(cap 240) s)"
UP=1
rc=0; timeout "$(cap 240)" "${APP[@]}" up --recipe "$PRIMARY" > "$R/up.txt" 2>&1 || rc=$?
redact "$R/up.txt"; tail -3 "$R/up.txt"; echo "up rc=$rc" >> "$R/steps.txt"
status_to "$R/status-one.json"
[ "$(field "$R/status-one.json" state)" = ready ] || { say "not ready after up: stopping here"; exit 1; }
{ echo "one engine:"; nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader; } > "$R/gpu-mem-snapshots.txt" 2>&1 || true
nvidia-smi --query-gpu=timestamp,index,memory.used,memory.total --format=csv,noheader -l 2 > "$R/gpu-mem.csv" 2>&1 &
SMI_PID=$!

say "apply $SIDE --alongside"
rc=0; timeout 60 "${APP[@]}" apply "$SIDE" --alongside --json > "$R/apply.json" 2> "$R/apply.err" || rc=$?
echo "apply --alongside rc=$rc model=$(field "$R/apply.json" model)" >> "$R/steps.txt"
[ "$rc" = 0 ] || { cat "$R/apply.err"; say "refused: stopping here"; exit 1; }
WAIT=$(cap 200); END=$(( $(el) + WAIT ))
while [ "$(el)" -lt "$END" ]; do
  status_to "$R/status-both.json"
  s=$(engine_state "$R/status-both.json" "$SIDE_MODEL")
  [ "$s" = ready ] || [ "$s" = failed ] && break
  sleep 2
done
echo "side engine: $(engine_state "$R/status-both.json" "$SIDE_MODEL") after $(el) s (bound $WAIT s)" >> "$R/steps.txt"
[ "$(engine_state "$R/status-both.json" "$SIDE_MODEL")" = ready ] || { say "the side engine is not ready"; exit 1; }
{ echo "two engines:"; nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader; } >> "$R/gpu-mem-snapshots.txt" 2>&1 || true

say "load: 2 clients per model, across the primary's restart"
python3 "$W/scripts/gpu_h200/switch_load.py" http://127.0.0.1:8080 smollm2 "$R/client-smollm2.json" \
  --key-file /root/app/alongside.key --stop-file "$R/stop" --clients 2 --max-s "$(cap 220)" > "$R/client-a.txt" 2>&1 &
CLIENT_A=$!
python3 "$W/scripts/gpu_h200/switch_load.py" http://127.0.0.1:8080 "$SIDE_MODEL" "$R/client-$SIDE_MODEL.json" \
  --key-file /root/app/alongside.key --stop-file "$R/stop" --clients 2 --max-s "$(cap 220)" > "$R/client-b.txt" 2>&1 &
CLIENT_B=$!
sleep "$(cap 10)"
# The primary's restart while the side engine serves: same-card blue/green when the card's free memory
# (two engines on it now) admits a third for the switch, else the hold; the path and why are reported.
say "restart --json (the primary, beside $SIDE_MODEL)"
OLD_ID=$(field "$R/status-both.json" launch.id)
rc=0; timeout 30 "${APP[@]}" restart --json > "$R/restart.json" 2> "$R/restart.err" || rc=$?
echo "restart rc=$rc path=$(field "$R/restart.json" switch.path)" >> "$R/steps.txt"
END=$(( $(el) + $(cap 150) ))
while [ "$(el)" -lt "$END" ]; do
  status_to "$R/status-poll.json"
  NEW_ID=$(field "$R/status-poll.json" launch.id)
  if [ "$(field "$R/status-poll.json" state)" = ready ] && [ -n "$NEW_ID" ] && [ "$NEW_ID" != "$OLD_ID" ] \
     && [ -z "$(field "$R/status-poll.json" blue_green)" ]; then
    break
  fi
  sleep 2
done
cp "$R/status-poll.json" "$R/status-restarted.json" 2>/dev/null || true
echo "restart: old $OLD_ID new $(field "$R/status-restarted.json" launch.id) after $(el) s" >> "$R/steps.txt"
sleep "$(cap 5)"
touch "$R/stop"
for _ in $(seq 1 60); do kill -0 "$CLIENT_A" 2>/dev/null || kill -0 "$CLIENT_B" 2>/dev/null || break; sleep 0.5; done
stop_pid "$CLIENT_A"; CLIENT_A=""; stop_pid "$CLIENT_B"; CLIENT_B=""
cat "$R/client-a.txt" "$R/client-b.txt" 2>/dev/null || true

say "stop --model $SIDE_MODEL"
timeout 30 "${APP[@]}" stop --model "$SIDE_MODEL" --json > "$R/stop.json" 2>&1 || true
END=$(( $(el) + $(cap 60) ))
while [ "$(el)" -lt "$END" ]; do
  status_to "$R/status-after.json"
  [ -z "$(engine_state "$R/status-after.json" "$SIDE_MODEL")" ] && break
  sleep 2
done
{ echo "smollm2 $(ask smollm2)"; echo "$SIDE_MODEL $(ask "$SIDE_MODEL")"; } > "$R/after-stop.txt"
cat "$R/after-stop.txt"
stop_pid "$SMI_PID"; SMI_PID=""
collect
exit 0
