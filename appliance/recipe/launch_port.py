"""The same launch on another port: what a blue/green switch starts beside the serving engine.

Only the port changes: argv's `--port`, the spec's `port` (the URL the controller and the gateway
reach the engine at, the probes, a cluster runtime's container port) and a bridge container's
published port. The spec hash covers the port, so it is computed again (and its label with it); the
compile-cache key leaves the port out (appliance/recipe/cache_key.py), so the moved launch uses the
same variant cache root and starts warm.
"""

from __future__ import annotations

from typing import Any

from appliance.engine_names import LABEL_SPEC_HASH
from appliance.recipe.launch_spec import HASH_EXCLUDE, LaunchSpec, spec_hash


def _argv_on_port(argv: tuple[str, ...], old: int, port: int) -> tuple[str, ...]:
    out = list(argv)
    for i, word in enumerate(out):
        if word == "--port" and i + 1 < len(out) and out[i + 1] == str(old):
            out[i + 1] = str(port)
        elif word == f"--port={old}":
            out[i] = f"--port={port}"
    return tuple(out)


def on_port(spec: LaunchSpec, port: int) -> LaunchSpec:
    """`spec` listening on `port` instead, with its hash (and hash label) computed again."""
    if port == spec.port:
        return spec
    old = spec.port
    runtime = spec.runtime
    published = getattr(runtime, "published_ports", None)
    if published:
        # A bridge container: the engine listens on the moved port inside and is published on it.
        moved = {(port if c == old else c): (port if h == old else h) for c, h in published.items()}
        runtime = runtime.model_copy(update={"published_ports": moved})
    fields: dict[str, Any] = {**dict(spec), "argv": _argv_on_port(spec.argv, old, port), "port": port,
                              "runtime": runtime, "spec_hash": "-"}
    digest = spec_hash(LaunchSpec.model_validate(fields).model_dump(mode="json", exclude=set(HASH_EXCLUDE)))
    labels = {**spec.labels, LABEL_SPEC_HASH: digest} if LABEL_SPEC_HASH in spec.labels else dict(spec.labels)
    return LaunchSpec.model_validate({**fields, "spec_hash": digest, "labels": labels})
