#!/bin/bash
# kv_admission_check.sh — the GPU KV admission against a real H200 (kind nvidia-h200), ≈ 1–2 min:
#  1. read the idle card the way preflight does (GpuReader → CardMemory) and judge utilization 0.3 / 0.9;
#  2. hold 100 GiB of the card from another process (torch), read again: 0.9 must be refused with the
#     numbers; with that process counted as "the engine being replaced" (GpuReader.process_memory of its
#     pid) the same start must be admitted, and refused again side by side (replaces_running=False);
#  3. start vLLM 0.26.0 at --gpu-memory-utilization 0.9 beside the holder: it must refuse in its own words,
#     and `diagnose` must read that log as gpu_memory_short, not retryable (the fixture
#     tests/fixtures/doctor/gpu_memory_short_h200.log is composed: this is the real line to compare).
# Prerequisite: gpu-kit's setup.sh ran (vLLM 0.26.0 + nvidia-ml-py in /root/site, SmolLM2 in /root/gpu/smollm2).
#   bash .gpuwt/scripts/gpu_h200/kv_admission_check.sh
# What comes back: $OUT/kv-admission.tgz (judgements JSON, the engine log) and a summary on stdout.
set -uo pipefail
W="$PWD/.gpuwt"; [ -d "$W" ] || W="$PWD"
export PYTHONPATH="/root/site:$W" PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_LOGGING_LEVEL=INFO
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 TOKENIZERS_PARALLELISM=false
export CUDA_VISIBLE_DEVICES=0
OUT="${OUT:-/tmp/kv-admission-out}"; mkdir -p "$OUT"
R=/root/results/kv-admission; rm -rf "$R"; mkdir -p "$R"
pack() { tar -C /root/results -czf "$OUT/kv-admission.tgz" kv-admission 2>/dev/null; }
[ -d /root/site/vllm ] || { echo "no vLLM in /root/site: run gpu-kit's setup.sh first (docs/gpu-h200.md)"; exit 2; }

judge() {  # judge LABEL [PID]: the admission of cuda-smollm2-graph at 0.3 and 0.9 on the card as it is now
  (cd "$W" && python3 - "$1" "${2:-}" <<'PY'
import json, sys
from controller.watch.gpu import GpuReader
from appliance.recipe.gpu_kv_admission import CardMemory, GpuMemoryView, gpu_memory_checks
from controller.catalogue import Catalogue
from pathlib import Path
label, pid = sys.argv[1], sys.argv[2]
reader = GpuReader()
cards = tuple(CardMemory.from_sample(s) for s in reader.sample())
base = Catalogue(Path("recipes")).launchable("cuda-smollm2-graph")
held = reader.process_memory({int(pid)}) if pid else {}
out = {"cards": [c.model_dump() for c in cards], "held_by_pid": held}
for util in (0.3, 0.9):
    r = base.model_copy(update={"engine": base.engine.model_copy(update={"gpu_memory_utilization": util})})
    for name, view in (("nothing_replaced", GpuMemoryView(cards=cards, held={})),
                       ("replacing_pid", GpuMemoryView(cards=cards, held=held)),
                       ("side_by_side", GpuMemoryView(cards=cards, held=held, replaces_running=False))):
        if name != "nothing_replaced" and not pid:
            continue
        (c,) = gpu_memory_checks(r, view)
        out[f"{util}/{name}"] = {"verdict": c.verdict, "message": c.message}
        print(f"{label} util {util} {name}: {c.verdict.upper()} {c.message}")
json.dump(out, open(f"/root/results/kv-admission/judge-{label}.json", "w"), indent=1)
PY
  )
}

echo "== idle"; judge idle
nvidia-smi --query-gpu=memory.used,memory.free,memory.total --format=csv,noheader | tee "$R/nvidia-smi-idle.txt"
echo "== hold 100 GiB from another process"
python3 -c "
import torch, time
x = torch.empty(100 * 2**30, dtype=torch.uint8, device='cuda'); torch.cuda.synchronize()
print('holding', flush=True); time.sleep(300)" > "$R/holder.log" 2>&1 &
HOLDER=$!
for _ in $(seq 60); do grep -q holding "$R/holder.log" && break; sleep 1; done
nvidia-smi --query-gpu=memory.used,memory.free,memory.total --format=csv,noheader | tee "$R/nvidia-smi-held.txt"
judge held "$HOLDER"
echo "== vLLM at 0.9 beside the holder"
timeout 120 python3 -m vllm.entrypoints.openai.api_server --model /root/gpu/smollm2 --served-model-name smollm2 \
  --dtype bfloat16 --max-model-len 2048 --gpu-memory-utilization 0.9 --host 127.0.0.1 --port 8000 \
  > "$R/engine-0.9.log" 2>&1
echo "engine exit $?"
grep -m2 "Free memory on device" "$R/engine-0.9.log"
(cd "$W" && python3 -c "
from appliance.diagnosis.diagnose import FailureFacts, diagnose
tail = tuple(open('$R/engine-0.9.log', errors='replace').read().split('\n')[-200:])
d = diagnose(FailureFacts(exit_code=1, log_tail=tail))
print('diagnosis', d.code.value, 'retryable' if d.retryable else 'not retryable', '|', d.summary)") | tee "$R/diagnosis.txt"
kill "$HOLDER" 2>/dev/null; wait "$HOLDER" 2>/dev/null
pack
