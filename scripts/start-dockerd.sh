#!/usr/bin/env bash
# Start a Docker daemon if none answers. Writes its PID to /run/appliance-dockerd.pid
# (APPLIANCE_DOCKERD_PIDFILE) so that whoever stops it does so by PID.
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

# A daemon that died without its own shutdown (a machine restored from a snapshot, a kill -9, a
# reboot where /run is not tmpfs) leaves its PID files behind, and dockerd then refuses to start:
# "pid file found, ensure docker is not running". A PID file is stale when no process of that name
# holds the PID (it may have been reused by something else): only then is it removed. A live
# daemon that does not answer is left alone and reported.
clear_stale_pidfile() {  # $1: pid file, $2: the process name that owns it
  local file=$1 name=$2 pid comm
  [ -f "$file" ] || return 0
  pid=$(tr -dc '0-9' <"$file")
  comm=""
  if [ -n "$pid" ] && [ -r "/proc/$pid/comm" ]; then
    comm=$(cat "/proc/$pid/comm")
  fi
  if [ "$comm" = "$name" ]; then
    echo "[dockerd] $name (pid $pid, from $file) is running but docker does not answer;" \
      "stop it (kill $pid) or wait for it" >&2
    exit 1
  fi
  echo "[dockerd] removing stale $file (pid ${pid:-none} is not a running $name)"
  rm -f "$file"
}
clear_stale_pidfile "${DOCKERD_PIDFILE:-/var/run/docker.pid}" dockerd
clear_stale_pidfile "${CONTAINERD_PIDFILE:-/var/run/docker/containerd/containerd.pid}" containerd

start() {  # $1: storage driver; returns 0 once the daemon answers
  echo "[dockerd] starting with --storage-driver=$1 (log: $log)"
  nohup dockerd --storage-driver="$1" >>"$log" 2>&1 &
  local pid=$!
  echo "$pid" > "${APPLIANCE_DOCKERD_PIDFILE:-/run/appliance-dockerd.pid}"
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
