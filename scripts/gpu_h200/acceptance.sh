#!/bin/bash
# acceptance.sh — the GPU acceptance run, on the lent H200, for any change that touches
# how the engine is launched (env, argv, cache paths, keys). docs/gpu-h200.md says how it is sent: the
# kit set up by an earlier call (gpu-kit's setup.sh: vLLM 0.26.0 in /root/site, the model in
# /root/gpu/smollm2), the appliance's code in .gpuwt/; run from the repo root copy as
#   bash .gpuwt/scripts/gpu_h200/acceptance.sh
# Steps (each followed by one chat completion through the gateway, port 8080, with the key `accept`):
#   up --recipe cuda-smollm2-graph (cold, then warm: warm_restart) · restart --follow (warm 2)
#   apply cuda-smollm2-piecewise --follow (cold + warm) · restart --follow (warm 2)
#   apply cuda-smollm2-eager --follow (once; its recipe has no warm_restart)
# then launches --json, launches ID --json for each, status --json, down; logs and engine logs redacted.
# Budget: done by DEADLINE (520 s) of wall time; a step that would not fit is skipped (`left N`), and
# `pack` after every step, so a command cut at its limit still brings back what it had.
# What comes back: $OUT/accept.tgz (accept/: launch-ID.json, runs/ID/engine.log, gateway.jsonl,
# steps.tsv, CLI outputs, logs/) and $OUT/accept-summary.txt (the judge's table and verdict).
set -uo pipefail
W="$PWD/.gpuwt"; cd "$W" || exit 2  # python -m puts the cwd first on sys.path: the checkout's own code must not win
export APPLIANCE_HOME=/root/app APPLIANCE_RECIPES="$W/recipes" PYTHONPATH="/root/site:$W" PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT="${OUT:-/tmp/accept-out}"; mkdir -p "$OUT"
APP=(python3 -m controller.cli.main)
R=/root/results/accept
T0=$(date +%s)
DEADLINE=${ACCEPT_DEADLINE_S:-520}   # seconds of wall time by which everything is packed
RESERVE=40                           # collect + down + pack + judge
say() { echo "[accept $(( $(date +%s) - T0 ))s] $*"; }
el() { echo $(( $(date +%s) - T0 )); }
left() { [ "$(el)" -lt "$1" ]; }
# a step's timeout: its own cap, or what is left before DEADLINE - RESERVE
cap() { local rest=$(( DEADLINE - RESERVE - $(el) )); [ "$rest" -lt "$1" ] && echo "$rest" || echo "$1"; }
redact() {  # the admin token, gateway keys (sk-app-…), engine keys (eng_ + 43 url-safe base64 chars)
  sed -i -E -e "s/(APPLIANCE_ADMIN_TOKEN=)[^ ]+/\1<redacted>/g; s/(shown once\): )[^ ]+/\1<redacted>/g" \
    -e 's/adm_[A-Za-z0-9_-]{43}/adm_<redacted>/g; s/sk-app-[A-Za-z0-9_-]+/sk-app-<redacted>/g' \
    -e 's/eng_[A-Za-z0-9_-]{43}/eng_<redacted>/g' "$@" 2>/dev/null
}
pack() { tar -C /root/results -czf "$OUT/accept.tgz" accept 2>/dev/null; }
step() { printf '%s\t%s\n' "$1" "$2" >> "$R/steps.tsv"; }
layout() {
  mkdir -p /root/app/engine/cuda/bin /root/app/models
  printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" > /root/app/engine/cuda/bin/python
  chmod +x /root/app/engine/cuda/bin/python
  ln -sfn /root/site /root/app/engine/cuda/site
  ln -sfn /root/gpu/smollm2 /root/app/models/smollm2-135m-instruct
}
# One chat completion through the gateway with the `accept` key → one JSON line in gateway.jsonl
# (step, recipe and launch id from `status --json`, HTTP status; a 401 is retried for the key refresh).
ask() {
  "${APP[@]}" status --json > "$R/status-$1.json" 2>&1
  python3 - "$1" "$R/status-$1.json" /root/app/accept.key >> "$R/gateway.jsonl" <<'PY'
import json, sys, time, urllib.error, urllib.request
step, status_path, key_path = sys.argv[1:4]
try:
    s = json.load(open(status_path))
except (OSError, ValueError):
    s = {}
launch = s.get("launch") or {}
out = {"step": step, "recipe": s.get("recipe"), "launch_id": launch.get("id"), "state": s.get("state")}
try:
    key = open(key_path).read().strip()
except OSError as exc:
    key = ""
    out.update(status=None, error=f"no client key: {exc}")
body = json.dumps({"model": launch.get("served_model_name") or "smollm2", "max_tokens": 16, "temperature": 0,
                   "messages": [{"role": "user", "content": "What is the capital of France?"}]}).encode()
for attempt in range(6 if key else 0):
    req = urllib.request.Request("http://127.0.0.1:8080/v1/chat/completions", data=body, method="POST",
                                 headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    t = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            data = json.loads(resp.read())
        out.update(status=resp.status, answer=data["choices"][0]["message"]["content"], attempts=attempt + 1,
                   seconds=round(time.monotonic() - t, 3))
        break
    except urllib.error.HTTPError as exc:
        out.update(status=exc.code, error=exc.read().decode(errors="replace")[:200], attempts=attempt + 1)
        if exc.code != 401:
            break
        time.sleep(1.0)  # a key created a moment ago reaches the gateway within its ~1 s refresh
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        out.update(status=None, error=str(exc)[:200], attempts=attempt + 1)
        break
print(json.dumps(out, ensure_ascii=False))
PY
  tail -1 "$R/gateway.jsonl" | cut -c1-200
}
# run STEP TIMEOUT-CAP MIN-LEFT cmd…: skipped when less than MIN-LEFT is left, else run, record, ask, pack
run_step() {
  local name="$1" maxt="$2" need="$3"; shift 3
  if ! left $(( DEADLINE - RESERVE - need )); then
    say "skipping $name: $(el) s gone, it needs ~$need s"; step "$name" skipped; pack; return 1
  fi
  local t; t=$(cap "$maxt"); say "$name (timeout $t s)"
  timeout "$t" "${APP[@]}" "$@" > "$R/$name.txt" 2>&1; local rc=$?
  redact "$R/$name.txt"; tail -4 "$R/$name.txt"
  [ "$rc" = 0 ] && step "$name" ok || step "$name" "rc=$rc"
  ask "$name"; pack
  return 0
}

[ -d /root/site/vllm ] || { echo "no vLLM in /root/site: run gpu-kit's setup.sh first (docs/gpu-h200.md)"; exit 2; }
# A clean appliance home: a cold start needs an empty cache root, and the records must be this run's.
if [ -e /root/app ]; then
  timeout 60 "${APP[@]}" down > /dev/null 2>&1
  mv /root/app "/root/app.prev-$T0"; say "moved an earlier /root/app to /root/app.prev-$T0"
fi
rm -rf "$R"; mkdir -p "$R"; : > "$R/steps.tsv"; : > "$R/gateway.jsonl"
layout
TOKEN=$(python3 -c 'from pathlib import Path; from controller import admin_token as a; t = a.new_token(); a.write_hash(Path("/root/app"), t); print(t)')
export APPLIANCE_ADMIN_TOKEN="$TOKEN"  # `up` finds the hash and takes this token: nothing shown once
nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv,noheader > "$R/gpu.txt" 2>&1

# the client key `accept`, before `up` (which then makes no `default` key of its own): printed once, on
# stdout with --json; kept out of the results. The gateway reads the same key file (~1 s refresh).
"${APP[@]}" keys create --name accept --json 2> "$R/keys-create.txt" \
  | python3 -c 'import json,sys; d=json.load(sys.stdin); open("/root/app/accept.key","w").write(d["key"]); print("key", d["id"], d["name"])' >> "$R/keys-create.txt" 2>&1
redact "$R/keys-create.txt"; cat "$R/keys-create.txt"
# 1. up: gateway + controller, graph cold warm-up then warm restart (ready ≈ 89 + 38 s measured)
run_step up-graph 330 150 up --recipe cuda-smollm2-graph
# 2. second warm restart of graph (≈ 40 s)
run_step restart-graph 150 60 restart --follow
# 3. piecewise: cold + warm by warm_restart (≈ 69 + 28 s), then a second warm restart (≈ 34 s)
run_step apply-piecewise 240 130 apply cuda-smollm2-piecewise --follow \
  && run_step restart-piecewise 150 60 restart --follow
# 4. eager once (≈ 54 s; 80–111 s on a fresh machine's first Python imports)
run_step apply-eager 200 90 apply cuda-smollm2-eager --follow

say "collect"
"${APP[@]}" launches --json > "$R/launches.json" 2>&1
for id in $(python3 -c 'import json,sys; print(" ".join(r["id"] for r in json.load(open(sys.argv[1]))))' "$R/launches.json" 2>/dev/null); do
  "${APP[@]}" launches "$id" --json > "$R/launch-$id.json" 2> "$R/launch-$id.explain.txt"
  mkdir -p "$R/runs/$id"; cp "/root/app/runs/$id/engine.log" "$R/runs/$id/" 2>/dev/null
done
"${APP[@]}" status --json > "$R/status.json" 2>&1
# The key's facts, before anything is redacted: how the key reached vLLM (mode of the key files,
# never a VLLM_API_KEY in the engine's environment) and whether vLLM 0.26.0 logged it in clear.
{ echo "key files:"; ls -l /root/app/runs/.engine-keys/ 2>&1 | sed 's/^/  /'
  echo "engine logs with the key in vLLM's non-default args line: $(grep -l "'api_key': \['eng_" /root/app/runs/*/engine.log 2>/dev/null | wc -l) of $(ls /root/app/runs/*/engine.log 2>/dev/null | wc -l)"
  for p in $(pgrep -f 'vllm.entrypoints.openai.api_server' 2>/dev/null); do
    echo "pid $p: VLLM_API_KEY in environ: $(tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -c '^VLLM_API_KEY=')"
    echo "pid $p: argv: $(tr '\0' ' ' < /proc/$p/cmdline 2>/dev/null | grep -o -- '--config [^ ]*')"
  done; } > "$R/key-delivery.txt" 2>&1
say "down"; timeout 30 "${APP[@]}" down > "$R/down.txt" 2>&1
# After down, no file the appliance left holds an engine key (the shim redacts
# engine.log as it writes it; a launch that ended removes its key files) — the model and the kit's
# site-packages are links, not searched.
{ echo "after down: files under /root/app holding an engine key: $(grep -rlE 'eng_[A-Za-z0-9_-]{43}' /root/app 2>/dev/null | wc -l)"
  grep -rlE 'eng_[A-Za-z0-9_-]{43}' /root/app 2>/dev/null | sed 's/^/  /'
  echo "after down: key files left: $(ls /root/app/runs/.engine-keys/ 2>/dev/null | wc -l)"; } >> "$R/key-delivery.txt" 2>&1
mkdir -p "$R/logs"; cp /root/app/logs/*.log "$R/logs/" 2>/dev/null
find "$R" -type f -size +4M -exec truncate -s 4M {} +   # accept.tgz stays well under 16 MiB
redact "$R"/*.txt "$R"/*.json "$R"/*.jsonl "$R"/runs/*/engine.log "$R"/logs/*
pack
say "judge"
python3 "$W/scripts/gpu_h200/acceptance_judge.py" "$R" > "$OUT/accept-summary.txt" 2>&1; RC=$?
{ echo; echo "wall time $(el) s; steps:"; cat "$R/steps.tsv"; } >> "$OUT/accept-summary.txt"
cp "$OUT/accept-summary.txt" "$R/"; pack
cat "$OUT/accept-summary.txt"; ls -l "$OUT"
exit $RC
