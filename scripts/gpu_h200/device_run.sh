#!/bin/bash
# device_run.sh A|B — the appliance on the lent H200 (docs/gpu-h200.md says how it is sent).
# Runs in the device tool's copy of the repo root, after gpu-kit's setup.sh put vLLM 0.26.0 into
# /root/site and the model into /root/gpu/smollm2. The appliance's own code travels in .gpuwt/.
#   A: layout + probes (docker SDK absent, logging, NVML) + `appliance up` with cuda-smollm2-graph
#      (cold), measure, `appliance restart --follow` (warm), measure.
#   B: apply cuda-smollm2-piecewise (cold), measure, restart (warm), measure; apply cuda-smollm2-eager
#      (cold), measure, restart, measure; collect records and logs; `appliance down`.
#   C: (nvidia-h200-x2; the TP=2 recipes live in docs/gpu-h200/recipes-tp2/: copy them into .gpuwt/recipes
#      with a model vLLM accepts at TP=2 — SmolLM2-135M has 9 heads) layout + `appliance up` with cuda-smollm2-tp2-graph (custom all-reduce on),
#      measure; apply cuda-smollm2-tp2-graph-nocar, measure; collect; down.
# What comes back: $OUT/results-<step>.tgz (+ summary text on stdout).
set -uo pipefail
STEP="${1:?A, B or C}"
W="$PWD/.gpuwt"; cd "$W" || exit 2  # python -m puts the cwd first on sys.path: the checkout's own code must not win
export APPLIANCE_HOME=/root/app APPLIANCE_RECIPES="$W/recipes" PYTHONPATH="/root/site:$W" PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
APP=(python3 -m controller.cli.main)
R=/root/results/$STEP; mkdir -p "$R"
T0=$(date +%s)
say() { echo "[run $STEP $(( $(date +%s) - T0 ))s] $*"; }
redact() { sed -i -E 's/(APPLIANCE_ADMIN_TOKEN=)[^ ]+/\1<redacted>/g; s/(shown once\): )[^ ]+/\1<redacted>/g; s/Bearer sk-app-[A-Za-z0-9_-]+/Bearer <redacted>/g' "$@"; }
bench() { timeout 90 python3 "$W/scripts/gpu_h200/decode_client.py" http://127.0.0.1:8000 smollm2 "$1" "$R/bench-$1.json" 2>&1 | tail -3; }
pack() { tar -C /root/results -czf "$OUT/results-$STEP.tgz" "$STEP" 2>/dev/null; }  # after every step: a
# command cut at its time limit still brings back what it had
left() { [ $(( $(date +%s) - T0 )) -lt "$1" ]; }
nv() { nvidia-smi --query-gpu=memory.used,memory.total,utilization.gpu --format=csv,noheader | sed "s/^/   nvidia-smi $1: /"; }

layout() {
  mkdir -p /root/app/engine/cuda/bin /root/app/models
  printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" > /root/app/engine/cuda/bin/python
  chmod +x /root/app/engine/cuda/bin/python
  ln -sfn /root/site /root/app/engine/cuda/site
  ln -sfn /root/gpu/smollm2 /root/app/models/smollm2-135m-instruct
}
collect() {
  "${APP[@]}" status --json > "$R/status.json" 2>&1
  "${APP[@]}" launches --json > "$R/launches.json" 2>&1
  for id in $(python3 -c 'import json,sys; print(" ".join(r["id"] for r in json.load(open(sys.argv[1]))))' "$R/launches.json"); do
    "${APP[@]}" launches "$id" --json > "$R/launch-$id.json" 2>&1
  done
  say "down"; "${APP[@]}" down > "$R/down.txt" 2>&1
  mkdir -p "$R/app"; cp -r /root/app/logs "$R/app/" 2>/dev/null; cp -r /root/app/runs "$R/app/" 2>/dev/null
  redact "$R"/*.txt "$R"/app/logs/* 2>/dev/null
}

if [ "$STEP" = C ]; then
  # nvidia-h200-x2: TP=2, custom all-reduce on, then off (cuda-smollm2-tp2-graph[-nocar]).
  layout
  nvidia-smi topo -m > "$R/topo.txt" 2>&1; cat "$R/topo.txt"; nv idle
  "${APP[@]}" plan cuda-smollm2-tp2-graph > "$R/plan-tp2.txt" 2>&1; grep -E "admission|refuse|GPUs" "$R/plan-tp2.txt"
  say "up cuda-smollm2-tp2-graph (cold warm-up, then warm)"
  timeout 330 "${APP[@]}" up --recipe cuda-smollm2-tp2-graph > "$R/up-tp2.txt" 2>&1
  grep -o 'APPLIANCE_ADMIN_TOKEN=[^ ]*' "$R/up-tp2.txt" | head -1 | cut -d= -f2 > /root/app/token
  sed -i -E 's/Bearer sk-app-[A-Za-z0-9_-]+/Bearer <redacted>/g' "$R/up-tp2.txt"; redact "$R/up-tp2.txt"; tail -14 "$R/up-tp2.txt"
  export APPLIANCE_ADMIN_TOKEN="$(cat /root/app/token)"
  nv tp2; bench tp2-car; pack
  if left 420; then
    say "apply cuda-smollm2-tp2-graph-nocar"
    timeout 200 "${APP[@]}" apply cuda-smollm2-tp2-graph-nocar --follow > "$R/apply-tp2-nocar.txt" 2>&1; tail -8 "$R/apply-tp2-nocar.txt"
    nv tp2-nocar; bench tp2-nocar; pack
  fi
  collect
  grep -h -i -E "custom.?all.?reduce|p2p|nccl" "$R"/app/runs/*/engine.log | cut -c1-220 | sort | uniq -c | sort -rn | head -20
elif [ "$STEP" = A ]; then
  layout
  {
    echo "== python: $(command -v python3) $(python3 -V 2>&1)"
    echo "== docker SDK importable? $(python3 -c 'import docker; print(docker.__file__)' 2>&1 | tail -1)"
    echo "== sitecustomize/usercustomize:"; python3 -c 'import sitecustomize; print(sitecustomize.__file__)' 2>&1 | tail -1
    python3 -c 'import usercustomize; print(usercustomize.__file__)' 2>&1 | tail -1
    echo "== root logger after importing the controller's modules (basicConfig is a no-op if it has handlers):"
    python3 -c 'import logging; import controller.cli.main, controller.service, controller.cli.lifecycle_cmd, controller.cli.api_cmd; r=logging.getLogger(); print("handlers", r.handlers, "level", logging.getLevelName(r.level)); print("disabled loggers", [n for n, l in logging.root.manager.loggerDict.items() if getattr(l, "disabled", False)][:20])'
    python3 -c 'import logging; import controller.service as s; import uvicorn; print("uvicorn", uvicorn.__version__); logging.basicConfig(level="INFO"); print("after basicConfig root handlers", logging.getLogger().handlers, logging.getLevelName(logging.getLogger().level))'
    echo "== NVML through the appliance's GPU watch:"; python3 -c 'from controller.watch.gpu import GpuReader; print(GpuReader().sample())'
    nv idle
  } > "$R/probes.txt" 2>&1
  cat "$R/probes.txt"
  "${APP[@]}" plan cuda-smollm2-graph > "$R/plan-graph.txt" 2>&1; grep -E "admission|refuse|GPUs" "$R/plan-graph.txt"
  say "up cuda-smollm2-graph (cold)"
  timeout 400 "${APP[@]}" up --recipe cuda-smollm2-graph > "$R/up-graph.txt" 2>&1
  grep -o 'APPLIANCE_ADMIN_TOKEN=[^ ]*' "$R/up-graph.txt" | head -1 | cut -d= -f2 > /root/app/token
  redact "$R/up-graph.txt"; tail -25 "$R/up-graph.txt"
  export APPLIANCE_ADMIN_TOKEN="$(cat /root/app/token)"
  nv graph-cold; bench graph-cold; pack
  say "restart (warm)"
  timeout 300 "${APP[@]}" restart --follow > "$R/restart-graph.txt" 2>&1; tail -12 "$R/restart-graph.txt"
  nv graph-warm; bench graph-warm
else
  # A fresh admin token when step A's `up` did not show one (a token from an earlier `up` is shown once).
  [ -s /root/app/token ] || python3 -c 'from pathlib import Path; from controller import admin_token as a; t = a.new_token(); a.write_hash(Path("/root/app"), t); print(t)' > /root/app/token
  export APPLIANCE_ADMIN_TOKEN="$(cat /root/app/token)"
  if [ ! -s "$R/../A/restart-graph.txt" ] || grep -q "needs the admin token" "$R/../A/restart-graph.txt"; then
    say "restart cuda-smollm2-graph (warm)"
    timeout 150 "${APP[@]}" restart --follow > "$R/restart-graph.txt" 2>&1; tail -8 "$R/restart-graph.txt"
    nv graph-warm2; bench graph-warm2; pack
  fi
  for mode in piecewise eager; do
    say "apply cuda-smollm2-$mode (cold)"
    left 380 || { say "skipping $mode: no time left"; continue; }
    timeout 200 "${APP[@]}" apply "cuda-smollm2-$mode" --follow > "$R/apply-$mode.txt" 2>&1; tail -8 "$R/apply-$mode.txt"
    nv "$mode-cold"; bench "$mode-cold"; pack
    left 480 || { say "skipping the $mode restart: no time left"; continue; }
    say "restart $mode (warm)"
    timeout 150 "${APP[@]}" restart --follow > "$R/restart-$mode.txt" 2>&1; tail -8 "$R/restart-$mode.txt"
    nv "$mode-warm"; bench "$mode-warm"; pack
  done
  collect
  python3 - "$R" <<'PY'
import json, sys, pathlib
r = pathlib.Path(sys.argv[1])
for p in sorted(r.glob("launch-*.json")):
    d = json.loads(p.read_text())
    print(p.name, d["recipe"], d["status"], d["ready_s"], d["cache"], "phases", len(d["phases"]),
          "pkgs", d["packages"], "engine", json.dumps(d.get("engine"))[:300], "gpu", list(d.get("gpu_peaks", {}))[:8])
PY
  grep -c "as pid" /root/app/logs/controller.log | sed 's/^/controller.log "as pid" lines: /'
fi
say "packing"
tar -C /root/results -czf "$OUT/results-$STEP.tgz" "$STEP" && ls -l "$OUT"
