#!/bin/bash
# Entrypoint for MANUAL runs of the wrapper image (`docker run IMAGE serve /models/x --dtype float16 ...`).
# The appliance never uses it: DockerRuntime sets the entrypoint to the rendered command, which
# carries its own sourcing wrapper and torch-first `python -c` (so `appliance recipes render` shows
# exactly what runs).
#
# DOMAIN §2: the two env files are sourced before anything ("missing one causes trouble"), so a
# missing file is fatal here rather than silently skipped. DOMAIN §5: vllm imported before torch →
# std::bad_alloc, exit 134 — hence torch first, then vLLM's own CLI.
set -e
. /opt/dtk/env.sh
. /src/tools/dcu/env.sh
exec python -c 'import torch; from vllm.entrypoints.cli.main import main; main()' "$@"
