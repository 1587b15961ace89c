#!/usr/bin/env bash
# Start a Docker daemon if none answers. Writes its PID to /run/appliance-dockerd.pid so that
# whoever stops it does so by PID.
#
# Storage driver (MEASURED.md "Building images here"): overlay2 works on these machines (the kernel
# has overlay, /var/lib/docker is on ext4) and is far lighter than vfs, which copies the whole root
# filesystem for every layer (multi-GB engine images become slow and huge). overlay2 is tried first;
# where it does not start (no overlay module, an unsupported backing filesystem), vfs is the fallback.
# DOCKERD_STORAGE_DRIVER forces one.
set -euo pipefail
if docker info >/dev/null 2>&1; then
  echo "[dockerd] already running (storage driver: $(docker info --format '{{.Driver}}' 2>/dev/null))"
  exit 0
fi
log=${DOCKERD_LOG:-/var/log/appliance-dockerd.log}

start() {  # $1: storage driver; returns 0 once the daemon answers
  echo "[dockerd] starting with --storage-driver=$1 (log: $log)"
  nohup dockerd --storage-driver="$1" >>"$log" 2>&1 &
  local pid=$!
  echo "$pid" > /run/appliance-dockerd.pid
  for _ in $(seq 1 60); do
    if docker info >/dev/null 2>&1; then
      echo "[dockerd] ready (pid $pid, storage driver $1)"
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "[dockerd] exited while starting with $1; last log lines:" >&2
      tail -n 5 "$log" >&2
      return 1
    fi
    sleep 1
  done
  echo "[dockerd] did not answer within 60 s with $1; stopping pid $pid" >&2
  kill "$pid" 2>/dev/null || true
  return 1
}

if [ -n "${DOCKERD_STORAGE_DRIVER:-}" ]; then
  start "$DOCKERD_STORAGE_DRIVER" && exit 0
else
  start overlay2 && exit 0
  echo "[dockerd] overlay2 did not start: falling back to vfs (slow, disk-hungry for big images)" >&2
  start vfs && exit 0
fi
tail -n 20 "$log" >&2
exit 1
