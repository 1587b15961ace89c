#!/usr/bin/env bash
# Start a Docker daemon if none answers (MEASURED.md: `dockerd --storage-driver=vfs` works on
# these machines, cgroup v1 + cgroupfs). Writes its PID to /run/appliance-dockerd.pid so that
# whoever stops it does so by PID.
set -euo pipefail
if docker info >/dev/null 2>&1; then
  echo "[dockerd] already running"
  exit 0
fi
log=${DOCKERD_LOG:-/var/log/appliance-dockerd.log}
echo "[dockerd] starting (log: $log)"
nohup dockerd --storage-driver=vfs >"$log" 2>&1 &
echo $! > /run/appliance-dockerd.pid
for _ in $(seq 1 60); do
  if docker info >/dev/null 2>&1; then
    echo "[dockerd] ready (pid $(cat /run/appliance-dockerd.pid))"
    exit 0
  fi
  sleep 1
done
echo "[dockerd] did not answer within 60 s; last log lines:" >&2
tail -n 20 "$log" >&2
exit 1
