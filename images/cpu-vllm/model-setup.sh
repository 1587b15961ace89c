#!/bin/bash
# Fill the appliance's volume with the small model: convert the GGUF carried by this image into the
# HF folder the CPU recipes serve (${APPLIANCE_HOME}/models/smollm2-135m-instruct). Idempotent; the
# converter writes `<out>.partial` and renames at the end. compose.yaml runs it as the one-shot
# service `model-setup`.
set -euo pipefail
out=${1:-${APPLIANCE_HOME:-/var/lib/appliance}/models/smollm2-135m-instruct}
if [ -f "$out/config.json" ]; then
  echo "model present: $out"
  exit 0
fi
mkdir -p "$(dirname "$out")"
exec python /opt/appliance/convert_gguf.py --gguf "$MODEL_GGUF" --out "$out"
