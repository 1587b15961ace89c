"""The runtimes create the compile-cache directories the engine's env points at before start."""

from __future__ import annotations

from pathlib import Path

from appliance.recipe.launch_spec import LaunchSpec, Mount
from controller.runtime.base import ensure_cache_dirs, host_cache_dirs
from tests.unit.spec_helpers import launch_spec


def _spec(runtime: str, env: dict[str, str], mounts: tuple[Mount, ...] = ()) -> LaunchSpec:
    options = {"python": "python"} if runtime == "process" else {"image": "engine:1", "mounts": mounts}
    return launch_spec(runtime, options, env=env)


def test_process_runtime_creates_every_pinned_cache_dir(tmp_path: Path) -> None:
    env = {
        "TMPDIR": str(tmp_path / "root" / "tmp"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "root" / "inductor"),
        "VLLM_CACHE_ROOT": str(tmp_path / "root" / "vllm"),
    }
    ensure_cache_dirs(_spec("process", env))
    for value in env.values():
        assert Path(value).is_dir()


def test_docker_maps_container_paths_to_mount_sources() -> None:
    spec = _spec(
        "docker",
        {"VLLM_CACHE_ROOT": "/cache/vllm", "TRITON_CACHE_DIR": "/triton", "TMPDIR": "/tmp"},
        mounts=(Mount(source="/host/cache/x", target="/cache"), Mount(source="/host/tri", target="/triton")),
    )
    # /tmp is on no mount: it lives in the container layer and is not created on the host.
    assert host_cache_dirs(spec) == [Path("/host/cache/x/vllm"), Path("/host/tri")]
