#!/bin/bash
# One entrypoint, the command picks the role:
#   controller   admin API + supervisor + host watch (root: see the Dockerfile)
#   gateway      the OpenAI-compatible gateway, dropped to uid 10001
#   token        create the admin token if none exists and print it once (only its sha256 is kept)
#   anything else: `appliance ARGS` (e.g. `plan cpu-smollm2-docker`, `host plan NAME --host-root /host`)
# Environment: APPLIANCE_HOME (the volume), APPLIANCE_ADMIN_PORT (8090), APPLIANCE_GATEWAY_PORT
# (8080), APPLIANCE_GATEWAY_CONTROL_PORT (the gateway's control listener on 127.0.0.1, the
# controller's admin calls and scrapes: the gateway port + 1), APPLIANCE_APPLY (a recipe applied at
# start when no running engine was adopted).
set -euo pipefail
home=${APPLIANCE_HOME:-/var/lib/appliance}
admin_port=${APPLIANCE_ADMIN_PORT:-8090}
gateway_port=${APPLIANCE_GATEWAY_PORT:-8080}
control_port=${APPLIANCE_GATEWAY_CONTROL_PORT:-$((gateway_port + 1))}

prepare_home() {
  # Shared by the controller (root) and the gateway (uid 10001): group `appliance`, setgid so new
  # files keep the group, umask 002 so the key store's WAL/-shm files stay group-writable. Secrets
  # (admin-token.sha256, run/gateway-control.token) are written 0600 by their code and stay root's.
  umask 002
  mkdir -p "$home"
  chgrp appliance "$home" && chmod 2775 "$home"
  for f in "$home"/keys.sqlite3 "$home"/keys.sqlite3-wal "$home"/keys.sqlite3-shm; do
    if [ -e "$f" ]; then chgrp appliance "$f" && chmod g+rw "$f"; fi
  done
}

role=${1:-controller}
case "$role" in
  controller)
    shift || true
    prepare_home
    # The gateway container writes its control token at its start; compose starts it first
    # (depends_on) but does not wait for it. The controller reads the token once, at start.
    for _ in $(seq 1 "${APPLIANCE_GATEWAY_TOKEN_WAIT_S:-30}"); do
      [ -s "$home/run/gateway-control.token" ] && break
      sleep 1
    done
    apply=()
    [ -n "${APPLIANCE_APPLY:-}" ] && apply=(--apply "$APPLIANCE_APPLY")
    exec appliance serve --host 127.0.0.1 --port "$admin_port" \
      --gateway-url "http://127.0.0.1:$control_port" \
      --gateway-client-url "http://127.0.0.1:$gateway_port" "${apply[@]}" "$@"
    ;;
  gateway)
    shift || true
    prepare_home
    # The control token the controller presents to the gateway's admin surface: kept across
    # restarts (a fresh one would leave a running controller holding a stale token), 0600 root.
    token=$(python3 - "$home/run" <<'PY'
import sys
from pathlib import Path
from controller import admin_token
run = Path(sys.argv[1])
print(admin_token.read_gateway_token(run) or admin_token.write_gateway_token(run))
PY
)
    hash=$(printf '%s' "$token" | sha256sum | cut -d' ' -f1)
    unset token
    exec env APPLIANCE_ADMIN_TOKEN_SHA256="$hash" \
      setpriv --reuid=10001 --regid=10001 --clear-groups \
      appliance gateway --listen "0.0.0.0:$gateway_port" --control-listen "127.0.0.1:$control_port" \
      --keys "$home/keys.sqlite3" "$@"
    ;;
  token)
    prepare_home
    exec python3 - "$home" <<'PY'
import sys
from pathlib import Path
from controller import admin_token
home = Path(sys.argv[1])
if admin_token.configured_hash(home) is not None:
    print(f"an admin token is already configured ({admin_token.hash_file(home)}); "
          "remove that file and run this again to make a new one", file=sys.stderr)
    sys.exit(1)
token = admin_token.new_token()
admin_token.write_hash(home, token)
print(f"export {admin_token.TOKEN_ENV}={token}   # shown once; only its sha256 is stored")
PY
    ;;
  *)
    exec appliance "$@"
    ;;
esac
