"""Shared values for the supervisor tests: a LaunchSpec and a handle, no I/O."""

from __future__ import annotations

from appliance.launch_spec import LaunchSpec
from controller.runtime.base import EngineHandle


def make_spec(
    recipe: str = "test-recipe", budget: int = 600, stall: int = 120, port: int = 18000
) -> LaunchSpec:
    return LaunchSpec(
        recipe=recipe,
        spec_hash="0123456789abcdef",
        platform="cpu",
        runtime="process",
        python="/usr/bin/python3",
        argv=("/usr/bin/python3", "-m", "engine", "--api-key", "not-printed"),
        env={"VLLM_LOGGING_LEVEL": "INFO", "HF_TOKEN": "hf_secret", "MY_API_KEY": "k", "PATH": "/usr/bin"},
        port=port,
        served_model_name="smollm2",
        cache_root="/tmp/cache",
        ready_budget_s=budget,
        stall_window_s=stall,
    )


def make_handle(
    launch_id: str, recipe: str = "test-recipe", ref: str = "4242", started_at: float = 0.0
) -> EngineHandle:
    return EngineHandle(
        launch_id=launch_id, runtime="process", ref=ref, recipe=recipe, spec_hash="0123456789abcdef",
        log_path=None, started_at=started_at,
    )
