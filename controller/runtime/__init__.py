"""Runtimes: the one seam through which the controller starts, watches and stops engines.

`make_runtime(kind, runs_dir)` returns the runtime a LaunchSpec's `runtime` field names. The docker
SDK is imported only when the docker runtime is asked for, so the process runtime (the embedded CPU
engine) works on a host without a Docker daemon.
"""

from __future__ import annotations

from pathlib import Path

from controller.runtime.base import EngineHandle, ExitInfo, Runtime, RuntimeError_

__all__ = ["EngineHandle", "ExitInfo", "Runtime", "RuntimeError_", "make_runtime"]

KINDS = ("process", "docker")


def make_runtime(kind: str, runs_dir: Path) -> Runtime:
    """`kind` is LaunchSpec.runtime; `runs_dir` holds the process runtime's per-launch files
    (the docker runtime keeps nothing on disk: its state is in the daemon, found by label)."""
    if kind == "process":
        from controller.runtime.process import ProcessRuntime

        return ProcessRuntime(runs_dir)
    if kind == "docker":
        from controller.runtime.docker_rt import DockerRuntime

        return DockerRuntime()
    raise ValueError(f"unknown runtime kind {kind!r}; expected one of {', '.join(KINDS)}")
