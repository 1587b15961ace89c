"""One way to build a LaunchSpec by hand in tests: common fields with defaults, and the runtime
kind's own options as the `runtime:` sub-model (appliance/runtimes/<kind>.py)."""

from __future__ import annotations

from typing import Any

from appliance.recipe.launch_spec import LaunchSpec

COMMON_DEFAULTS: dict[str, Any] = {
    "recipe": "r",
    "spec_hash": "0" * 16,
    "platform": "cpu",
    "argv": ("python",),
    "env": {},
    "port": 8000,
    "served_model_name": "m",
    "cache_root": "/c",
    "ready_budget_s": 60,
    "stall_window_s": 60,
}


def launch_spec(kind: str = "process", runtime: dict[str, Any] | None = None, **common: Any) -> LaunchSpec:
    """`runtime`: the kind's options (process: python; docker: image, mounts, ...)."""
    options = runtime if runtime is not None else ({"python": "python"} if kind == "process" else {})
    return LaunchSpec.model_validate(
        {**COMMON_DEFAULTS, **common, "runtime": {"kind": kind, **options}}
    )


def with_runtime(spec: LaunchSpec, kind: str, **options: Any) -> LaunchSpec:
    """`spec` with another runtime sub-model (validated)."""
    data = spec.model_dump()
    data["runtime"] = {"kind": kind, **options}
    return LaunchSpec.model_validate(data)
