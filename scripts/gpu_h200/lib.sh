#!/bin/bash
# lib.sh — the prelude compare.sh, choose.sh and alongside.sh share; sourced by them (never run), with NAME set to
# the script's name (its results folder /root/results/$NAME, its $OUT default, its log prefix).
# What it sets up is docs/gpu-h200.md's device layout: the kit from gpu-kit's setup.sh (vLLM in
# /root/site, the model in /root/gpu/smollm2), the appliance's code in .gpuwt/, a fresh
# APPLIANCE_HOME=/root/app (an earlier one is moved aside) and a new admin token.
set -uo pipefail
W="$PWD/.gpuwt"; cd "$W" || exit 2  # python -m puts the cwd first on sys.path: the checkout's own code must not win
export APPLIANCE_HOME=/root/app APPLIANCE_RECIPES="$W/recipes" PYTHONPATH="/root/site:$W" PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT="${OUT:-/tmp/$NAME-out}"; mkdir -p "$OUT"
APP=(python3 -m controller.cli.main)
R="/root/results/$NAME"
T0=$(date +%s)
say() { echo "[$NAME $(( $(date +%s) - T0 ))s] $*"; }
redact() {  # the admin token, gateway keys (sk-app-…), engine keys (eng_ + 43 url-safe base64 chars)
  sed -i -E -e "s/(APPLIANCE_ADMIN_TOKEN=)[^ ]+/\1<redacted>/g; s/(shown once\): )[^ ]+/\1<redacted>/g" \
    -e 's/adm_[A-Za-z0-9_-]{43}/adm_<redacted>/g; s/sk-app-[A-Za-z0-9_-]+/sk-app-<redacted>/g' \
    -e 's/eng_[A-Za-z0-9_-]{43}/eng_<redacted>/g' "$@" 2>/dev/null
}
pack() { tar -C /root/results -czf "$OUT/$NAME.tgz" "$NAME" 2>/dev/null; }
layout() {
  mkdir -p /root/app/engine/cuda/bin /root/app/models
  printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" > /root/app/engine/cuda/bin/python
  chmod +x /root/app/engine/cuda/bin/python
  ln -sfn /root/site /root/app/engine/cuda/site
  ln -sfn /root/gpu/smollm2 /root/app/models/smollm2-135m-instruct
}
# stop PID: TERM, up to 10 s, then KILL — only the processes the script started
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
# every launch's record and engine log into $R, and the status at the end
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

[ -d /root/site/vllm ] || { echo "no vLLM in /root/site: run gpu-kit's setup.sh first (docs/gpu-h200.md)"; exit 2; }
ACC=(--accuracy)
if ! python3 -c 'import rouge_score' 2>/dev/null; then
  for whl in "$W"/../.whl/*.whl "$W"/.whl/*.whl; do
    [ -f "$whl" ] && python3 -m zipfile -e "$whl" /root/site
  done
  python3 -c 'import rouge_score' 2>/dev/null \
    || { ACC=(--no-accuracy); say "rouge-score not importable (no wheels in .whl/): the $NAME runs with --no-accuracy"; }
fi
# The admin token of the appliance this prelude set up: root-only, outside the results (never packed),
# so that a later call with KEEP_HOME=1 can still drive it.
TOKEN_FILE=/root/.appliance-admin-token
if [ "${KEEP_HOME:-0}" = 1 ] && [ -d /root/app ] && [ -s "$TOKEN_FILE" ]; then
  # a later call of the same work (a choice longer than one command): the home, the running appliance
  # and the results so far stay as they are
  say "KEEP_HOME=1: the appliance home /root/app and $R are kept"
  mkdir -p "$R"
  export APPLIANCE_ADMIN_TOKEN="$(cat "$TOKEN_FILE")"
else
  if [ -e /root/app ]; then
    timeout 60 "${APP[@]}" down > /dev/null 2>&1
    mv /root/app "/root/app.prev-$T0"; say "moved an earlier /root/app to /root/app.prev-$T0"
  fi
  rm -rf "$R"; mkdir -p "$R"
  layout
  # KEEP_CACHE=1: the compile caches of the home moved aside come along (one machine, several scripts
  # in a row: what an earlier script warmed starts warm here; the launch history stays behind)
  if [ "${KEEP_CACHE:-0}" = 1 ] && [ -d "/root/app.prev-$T0/cache" ]; then
    mv "/root/app.prev-$T0/cache" /root/app/cache; say "KEEP_CACHE=1: the compile caches of /root/app.prev-$T0 are kept"
  fi
  TOKEN=$(python3 -c 'from pathlib import Path; from controller import admin_token as a; t = a.new_token(); a.write_hash(Path("/root/app"), t); print(t)')
  (umask 077; printf '%s' "$TOKEN" > "$TOKEN_FILE")
  export APPLIANCE_ADMIN_TOKEN="$TOKEN"
fi
nvidia-smi --query-gpu=name,memory.used,memory.total,power.limit,driver_version --format=csv,noheader > "$R/gpu.txt" 2>&1
