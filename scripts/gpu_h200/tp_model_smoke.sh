#!/bin/bash
# tp_model_smoke.sh — TP=1 smoke of the tensor-parallel model on ONE H200 (kind nvidia-h200), ≈ 3 min:
# build the model on the device with scripts/make_tp_model.py (same bytes as here: --check compares the
# sha256 digests recorded in the script), start vLLM 0.26.0 on it in eager mode, measure, stop; start it
# in the default graph mode, measure, stop. Proves the model loads and serves on CUDA and gives the
# eager-vs-graph decode figure before a GPU pair is lent (docs/gpu-h200.md "The tensor-parallel model").
# Prerequisite: gpu-kit's setup.sh ran in an earlier call (vLLM 0.26.0 in /root/site, SmolLM2 in
# /root/gpu/smollm2 — its tokenizer is copied). Run from the repo root copy as
#   bash .gpuwt/scripts/gpu_h200/tp_model_smoke.sh
# What comes back: $OUT/tp-smoke.tgz (model digests, both engine logs, decode_client JSONs, nvidia-smi)
# and a summary on stdout.
set -uo pipefail
W="$PWD/.gpuwt"; [ -d "$W" ] || W="$PWD"
export PYTHONPATH=/root/site PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_LOGGING_LEVEL=INFO
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 TOKENIZERS_PARALLELISM=false
OUT="${OUT:-/tmp/tp-smoke-out}"; mkdir -p "$OUT"
R=/root/results/tp-smoke; rm -rf "$R"; mkdir -p "$R"
M=/root/app/models/tp-llama-8h4kv
T0=$(date +%s)
say() { echo "[tp-smoke $(( $(date +%s) - T0 ))s] $*"; }
pack() { tar -C /root/results -czf "$OUT/tp-smoke.tgz" tp-smoke 2>/dev/null; }

[ -d /root/site/vllm ] || { echo "no vLLM in /root/site: run gpu-kit's setup.sh first (docs/gpu-h200.md)"; exit 2; }
say "build the model"
python3 "$W/scripts/make_tp_model.py" --tokenizer-from /root/gpu/smollm2 --out "$M" --check > "$R/make.txt" 2>&1
cat "$R/make.txt"
nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv,noheader > "$R/gpu.txt" 2>&1

serve() {  # serve LABEL EXTRA-ARGS…: start, wait for /v1/models (150 s), measure, stop by PID
  local label="$1"; shift
  say "start $label"
  VLLM_CACHE_ROOT="/root/tp-smoke-cache/$label" python3 -m vllm.entrypoints.openai.api_server --model "$M" \
    --served-model-name tp-llama --dtype bfloat16 --max-model-len 2048 --gpu-memory-utilization 0.3 \
    --host 127.0.0.1 --port 8000 "$@" > "$R/engine-$label.log" 2>&1 &
  local pid=$! t=$(date +%s) ready=""
  while [ $(( $(date +%s) - t )) -lt 150 ] && kill -0 "$pid" 2>/dev/null; do
    if curl -sf -m 2 http://127.0.0.1:8000/v1/models > /dev/null; then ready=$(( $(date +%s) - t )); break; fi
    sleep 1
  done
  echo "$label ready_s=${ready:-never}" | tee -a "$R/summary.txt"
  if [ -n "$ready" ]; then
    nvidia-smi --query-gpu=memory.used --format=csv,noheader | sed "s/^/$label nvidia-smi used: /" | tee -a "$R/summary.txt"
    timeout 60 python3 "$W/scripts/gpu_h200/decode_client.py" http://127.0.0.1:8000 tp-llama "$label" \
      "$R/bench-$label.json" 2>&1 | tail -2 | tee -a "$R/summary.txt"
  else
    tail -20 "$R/engine-$label.log"
  fi
  kill -TERM "$pid" 2>/dev/null; for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  kill -KILL "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
  grep -E "Graph capturing finished|Available KV cache memory|Model loading took|torch.compile" "$R/engine-$label.log" \
    | cut -c1-200 | sed "s/^/$label: /" | tee -a "$R/summary.txt"
  pack
}
serve eager --enforce-eager
serve graph
say "done"; cat "$R/summary.txt"; pack; ls -l "$OUT"
