"""Runtimes: the one seam through which the controller starts, watches and stops engines.

`make_runtime(kind, runs_dir)` returns the runtime a LaunchSpec's `kind` names, through the registry
(controller/runtime/registry.py). A runtime's SDK is imported only when its kind is asked for, so the
process runtime (the embedded CPU engine) works on a host without a Docker daemon or SDK.
"""

from __future__ import annotations

from controller.runtime.base import EngineHandle, EngineRuntimeError, ExitInfo, Runtime
from controller.runtime.registry import KINDS, make_runtime

__all__ = ["KINDS", "EngineHandle", "EngineRuntimeError", "ExitInfo", "Runtime", "make_runtime"]
