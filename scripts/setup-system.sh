#!/usr/bin/env bash
# System packages the test suite uses for real: a Docker daemon (MEASURED.md: Debian's docker.io
# works here with the vfs storage driver), Prometheus and its promtool for rule and query tests, nginx
# as the gateway benchmark's zero-logic floor, a static busybox to build tiny test images,
# debootstrap to make a local Debian base image where no registry is reachable
# (scripts/make-base-image.sh), Debian bookworm's docker-compose 1.29 for compose.yaml and to read
# rendered compose files back, and Debian's chromium + chromium-driver for the operator console's
# browser tests (Selenium drives them by path: no browser download at test time).
set -euo pipefail
need=()
command -v dockerd >/dev/null || need+=(docker.io)
# promtool (rule tests) and the server itself (tests/integration/prometheus_harness.py), one package.
{ command -v promtool && command -v prometheus; } >/dev/null || need+=(prometheus)
command -v nginx >/dev/null || need+=(nginx)
[ -x /bin/busybox ] || need+=(busybox-static)
command -v docker-compose >/dev/null || need+=(docker-compose)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v chromium >/dev/null || need+=(chromium)
command -v chromedriver >/dev/null || need+=(chromium-driver)
command -v openssl >/dev/null || need+=(openssl)  # tests/unit/test_upstream_client.py makes a TLS certificate with it
if [ ${#need[@]} -eq 0 ]; then
  echo "[setup-system] system packages present"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "[setup-system] need root to install: ${need[*]}" >&2
  exit 1
fi
echo "[setup-system] installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1  # no restart prompts in CI
apt-get update -qq
apt-get install -y -qq "${need[@]}" >/dev/null  # with recommends: the set validated on these machines
# Debian starts services it installs where it can; the appliance starts its own.
