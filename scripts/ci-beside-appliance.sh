#!/usr/bin/env bash
# The unit suite beside a running appliance: the README's two commands in their order (`make up`,
# then `make test`) once failed because unit tests probed the host's real port 8000, which the
# running engine held. Run by `make test` after the integration suite: the unit suite runs here,
# once, beside the appliance (which is stronger than running it alone, and costs one run, not two).
#
# If something already holds the appliance's default ports (engine 127.0.0.1:8000, gateway :8080 and its control listener :8081,
# controller :8090) — an appliance an operator started — the suite runs beside it as it is.
# Otherwise a real appliance is started on those ports with `appliance up` (controller, gateway, the
# embedded CPU engine serving cpu-smollm2) in a temporary APPLIANCE_HOME that borrows the installed
# engine venv and models by symlink (no second install), the unit suite runs with that home as its
# "default" one, and `appliance down` stops it by PID (also on failure: trap).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
PORTS=(8000 8080 8081 8090)

held() {  # how many of the default ports accept a connection on 127.0.0.1
    "$BIN/python" - "${PORTS[@]}" <<'PY'
import socket, sys
n = 0
for port in sys.argv[1:]:
    with socket.socket() as s:
        s.settimeout(1.0)
        n += s.connect_ex(("127.0.0.1", int(port))) == 0
print(n)
PY
}

run_unit() {
    echo "[ci-beside-appliance] unit suite with ${PORTS[*]} held ($(held)/${#PORTS[@]} answering)"
    # -n auto: the unit suite is hermetic (no fixed port, path or clock shared between tests), so it
    # runs on every core — 5 min serial, 1.5 min on 2 cores here; CI has 90 minutes for everything.
    "$BIN/python" -m pytest -q -ra -p no:cacheprovider -n auto tests/unit
}

if [ "$(held)" != 0 ]; then
    echo "[ci-beside-appliance] the default ports are already in use: running beside what holds them"
    run_unit
    exit
fi

default_home=$(env -u APPLIANCE_HOME "$BIN/python" -c 'from controller.settings import default_home; print(default_home())')
home=$(mktemp -d "${TMPDIR:-/tmp}/appliance-ci.XXXXXX")
for part in engine models; do  # borrowed, read by the engine only; `rm -r` below removes the links
    [ -e "$default_home/$part" ] && ln -s "$default_home/$part" "$home/$part"
done
export APPLIANCE_HOME="$home"
unset APPLIANCE_API APPLIANCE_ADMIN_TOKEN APPLIANCE_ADMIN_TOKEN_SHA256
cleanup() {
    "$BIN/appliance" down >>"$home/down.log" 2>&1 || { echo "[ci-beside-appliance] appliance down failed:"; cat "$home/down.log"; }
    rm -r "$home"
}
trap cleanup EXIT

started=$(date +%s)
# `up` shows the new admin token once: keep its output in the temporary home, shown (redacted) on failure.
if ! "$BIN/appliance" up >"$home/up.log" 2>&1; then
    echo "[ci-beside-appliance] appliance up failed:"
    sed -E 's/adm_[A-Za-z0-9_-]+/adm_<redacted>/g' "$home/up.log" | tail -40
    exit 1
fi
echo "[ci-beside-appliance] appliance up in $(( $(date +%s) - started )) s"
[ "$(held)" = "${#PORTS[@]}" ] || { echo "[ci-beside-appliance] the appliance does not hold all of ${PORTS[*]}"; exit 1; }
run_unit
echo "[ci-beside-appliance] done in $(( $(date +%s) - started )) s"
