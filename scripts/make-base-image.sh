#!/usr/bin/env bash
# Make a local Debian bookworm base image when no registry can be reached (MEASURED.md "Building
# images here"): `debootstrap --variant=minbase` from Debian's archive (~1 min, ~200 MB) and
# `docker import` (~2 s). Idempotent: an existing image with the tag is kept.
#
#   scripts/make-base-image.sh [TAG]        # default local/debian:bookworm
# Env: DEBIAN_MIRROR (default http://deb.debian.org/debian), DOCKER (client binary).
set -euo pipefail
tag=${1:-local/debian:bookworm}
docker=${DOCKER:-docker}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
if "$docker" image inspect "$tag" >/dev/null 2>&1; then
  echo "[base] $tag present"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "[base] debootstrap is missing: bash scripts/setup-system.sh" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "[base] debootstrap needs root" >&2; exit 1; }
rootfs=$(mktemp -d /var/tmp/appliance-rootfs.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT
start=$(date +%s)
echo "[base] debootstrap --variant=minbase bookworm from $mirror"
debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$rootfs.log" 2>&1 || {
  tail -n 20 "$rootfs.log" >&2; rm -f "$rootfs.log"; exit 1; }
rm -f "$rootfs.log"
# What the slim images do too: no apt caches, no docs in later installs, apt sources as http (the
# archive is reached without TLS, so containers need no CA for apt).
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
mkdir -p "$rootfs/etc/dpkg/dpkg.cfg.d"
printf 'path-exclude /usr/share/doc/*\npath-exclude /usr/share/man/*\npath-exclude /usr/share/locale/*\n' \
  > "$rootfs/etc/dpkg/dpkg.cfg.d/docker-minimal"
printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb http://deb.debian.org/debian-security bookworm-security main\n' \
  "$mirror" "$mirror" > "$rootfs/etc/apt/sources.list"
tar -C "$rootfs" -c . | "$docker" import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["bash"]' - "$tag" >/dev/null
echo "[base] $tag imported in $(( $(date +%s) - start )) s"
