#!/bin/bash
# gateway_bench.sh — what the gateway costs a client in front of the real vLLM engine on the lent H200
# host (16 cores: the proxy, the engine's API server and the load generator no longer fight over two
# cores as on the development machine). docs/gpu-h200.md says how it is sent: the kit set up by an
# earlier call (gpu-kit's setup.sh: vLLM 0.26.0 in /root/site, the model in /root/gpu/smollm2), the
# appliance's code in .gpuwt/; run from the repo root copy as
#   bash .gpuwt/scripts/gpu_h200/gateway_bench.sh
# Steps: vLLM's OpenAI server on :8000 (smollm2, CUDA graphs: its cold compile ~110 s), then
#   bench/gateway_bench.py --upstream-url http://127.0.0.1:8000 --arms direct,gateway[,nginx]
#     --conc 1,64 --modes plain,stream --rounds 3 --soak 300   (steady state: connections warmed)
#   and, time permitting, the same at concurrency 64 with --cold-connections;
# the engine is stopped by its PID. nginx joins only where the image has it.
# What comes back: $OUT/gwbench.tgz (gwbench/: bench-*.txt, gateway-*.json, engine.log, gpu.txt).
set -uo pipefail
W="$PWD/.gpuwt"; cd "$W" || exit 2  # python -m puts the cwd first on sys.path: the checkout's own code must not win
export PYTHONPATH="/root/site:$W" PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT="${OUT:-/tmp/gwbench-out}"; mkdir -p "$OUT"
R=/root/results/gwbench
T0=$(date +%s)
DEADLINE=${GWBENCH_DEADLINE_S:-540}
say() { echo "[gwbench $(( $(date +%s) - T0 ))s] $*"; }
el() { echo $(( $(date +%s) - T0 )); }
pack() { tar -C /root/results -czf "$OUT/gwbench.tgz" gwbench 2>/dev/null; }

[ -d /root/site/vllm ] || { echo "no vLLM in /root/site: run gpu-kit's setup.sh first (docs/gpu-h200.md)"; exit 2; }
rm -rf "$R"; mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.used,memory.total,power.limit,driver_version --format=csv,noheader > "$R/gpu.txt" 2>&1
{ nproc; uptime; command -v nginx || echo "no nginx"; } > "$R/host.txt" 2>&1

say "engine: vLLM on :8000 (smollm2, CUDA graphs)"
VLLM_USE_FLASHINFER_SAMPLER=0 python3 -m vllm.entrypoints.openai.api_server --model /root/gpu/smollm2 --served-model-name smollm2 \
  --host 127.0.0.1 --port 8000 --max-model-len 2048 --gpu-memory-utilization 0.5 --max-num-seqs 128 \
  > "$R/engine.log" 2>&1 &
EP=$!
stop_engine() {
  kill -TERM "$EP" 2>/dev/null
  for _ in $(seq 30); do kill -0 "$EP" 2>/dev/null || break; sleep 1; done
  kill -KILL "$EP" 2>/dev/null
}
trap 'stop_engine; pack' EXIT
ready=0
for _ in $(seq 300); do
  if python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/health', timeout=2)" 2>/dev/null; then
    ready=1; break
  fi
  kill -0 "$EP" 2>/dev/null || break
  sleep 1
done
[ "$ready" = 1 ] || { say "engine did not become ready"; tail -30 "$R/engine.log"; exit 1; }
say "engine ready"

ARMS=direct,gateway
command -v nginx >/dev/null && ARMS=direct,gateway,nginx
say "steady state: $ARMS, conc 1,64, plain and stream, 3 rounds"
timeout $(( DEADLINE - $(el) - 20 )) python3 bench/gateway_bench.py --upstream-url http://127.0.0.1:8000 \
  --model smollm2 --max-tokens 32 --arms "$ARMS" --conc 1,64 --modes plain,stream --rounds 3 --soak 300 \
  > "$R/bench-steady.txt" 2>&1
say "steady run: rc $?"
cp bench/results/gateway-*.json "$R/" 2>/dev/null
pack
if [ $(( DEADLINE - $(el) )) -gt 120 ]; then
  say "cold connections: conc 64"
  timeout $(( DEADLINE - $(el) - 20 )) python3 bench/gateway_bench.py --upstream-url http://127.0.0.1:8000 \
    --model smollm2 --max-tokens 32 --arms "$ARMS" --conc 64 --modes plain,stream --rounds 3 --soak 0 \
    --cold-connections > "$R/bench-cold.txt" 2>&1
  say "cold run: rc $?"
  cp bench/results/gateway-*.json "$R/" 2>/dev/null
fi
grep '^|' "$R"/bench-*.txt
say "done"
