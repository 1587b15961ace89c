#!/bin/bash
# client_isolation.sh — the gateway's own upstream client measured in isolation: this
# tree's gateway (own httptools client + gc.freeze) against the same gateway on aiohttp + gc.freeze
# (branch bench-aiohttp-gcfreeze: a05ccc9 plus only the gc.freeze part of 410fc44, exported with
# `git archive` into .benchbase/), interleaved, nginx as the control where it runs, all in front of
# the synthetic vLLM-shaped upstream (bench/synthetic_upstream.py). No GPU is used: the device host
# is run for its 16 quiet cores (on the 2-core development machine the load generator, the upstream
# and the proxy fight for the same cores). Run from the repo root copy, after .gpuwt/ is laid out:
#   bash .gpuwt/scripts/gpu_h200/client_isolation.sh
# carry: .gpuwt .benchbase [.nginx: Debian's nginx binary and the libraries it needs, see docs]
# What comes back: $OUT/isolation.tgz (isolation/: bench.txt, gateway-*.json, host.txt).
set -uo pipefail
ROOT="$PWD"; W="$ROOT/.gpuwt"; cd "$W" || exit 2
export PYTHONPATH="/root/site:$W" PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/isolation-out}"; mkdir -p "$OUT"
R=/root/results/isolation; rm -rf "$R"; mkdir -p "$R"
if [ -x "$ROOT/.nginx/usr/sbin/nginx" ]; then
  mkdir -p /tmp/nginxbin
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$ROOT/.nginx/lib" "$ROOT/.nginx/usr/sbin/nginx" > /tmp/nginxbin/nginx
  chmod +x /tmp/nginxbin/nginx; export PATH="/tmp/nginxbin:$PATH"
  nginx -v >> "$R/host.txt" 2>&1 || { echo "nginx does not run here" >> "$R/host.txt"; rm -f /tmp/nginxbin/nginx; }
fi
ARMS=direct,gateway
command -v nginx >/dev/null && ARMS=direct,gateway,nginx
{ nproc; uptime; python3 --version; python3 -c 'import aiohttp, httptools, uvloop, uvicorn; print("aiohttp", aiohttp.__version__, "httptools", httptools.__version__, "uvloop", uvloop.__version__, "uvicorn", uvicorn.__version__)'; echo "arms: $ARMS + gateway@.benchbase"; } >> "$R/host.txt" 2>&1
trap 'tar -C /root/results -czf "$OUT/isolation.tgz" isolation 2>/dev/null' EXIT
timeout "${ISOLATION_TIMEOUT_S:-420}" python3 bench/gateway_bench.py --arms "$ARMS" --baseline "$ROOT/.benchbase" \
  --conc 1,64 --modes plain,stream --rounds "${ROUNDS:-4}" --soak 300 > "$R/bench.txt" 2>&1
echo "bench rc $?" >> "$R/host.txt"
cp bench/results/gateway-*.json "$R/" 2>/dev/null
tail -60 "$R/bench.txt"
