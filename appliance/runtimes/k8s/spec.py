"""What the Kubernetes render reads from a LaunchSpec: the cluster options of any spec with an image,
and the engine facts it carries (TP, model; the pod's own listen address). Pure.

`cluster_target` is the one place that reads a runtime sub-model: a kubernetes spec's own, or a container
spec's image and options, or (with `--image`) a process spec.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from appliance import engine_argv
from appliance.runtimes.base import FormatError
from appliance.runtimes.k8s.model import DEFAULT_CACHE, DEFAULT_MODEL, KubernetesLaunch

if TYPE_CHECKING:
    from appliance.recipe.launch_spec import LaunchSpec

# The variables render pins to cache directories (appliance/recipe/launch_spec.py CACHE_DIR_ENV).
CACHE_DIR_ENV = ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TMPDIR")
# The device plugin assigns the cards (see the module docstring): these would name host indices.
DEVICE_ENV = ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
ANY_ADDRESS = "0.0.0.0"
GPU_RESOURCE = {"gfx906": "amd.com/gpu", "cuda": "nvidia.com/gpu"}
# Default node selection per platform: the vendors' node labellers (AMD's k8s-node-labeller marks GCN 5
# "Arctic Islands" cards such as gfx906 `amd.com/gpu.family=AI`; NVIDIA GPU feature discovery marks
# nodes `nvidia.com/gpu.present=true`). A recipe's `node_selector` replaces it.
PLATFORM_NODE_SELECTOR = {
    "gfx906": {"kubernetes.io/arch": "amd64", "amd.com/gpu.family": "AI"},
    "cuda": {"kubernetes.io/arch": "amd64", "nvidia.com/gpu.present": "true"},
    "cpu": {"kubernetes.io/os": "linux"},
}

class K8sRenderError(FormatError):
    """The spec cannot become manifests (a process recipe without an image)."""


# -- the one place that reads the runtime sub-model ----------------------------------------------------


def cluster_target(spec: LaunchSpec, image: str | None = None) -> KubernetesLaunch:
    """The cluster options of any spec with an image: a kubernetes spec's own sub-model; for a docker
    spec, its image, shm size, IPC mode and seccomp option with default storage; for a process spec
    only when `image` is given (it has none of its own)."""
    rt: Any = spec.runtime
    if isinstance(rt, KubernetesLaunch):
        return rt if image is None else rt.model_copy(update={"image": image, "digest": None})
    chosen = image or spec.runtime.engine_image()
    if not chosen:
        raise K8sRenderError(
            f"recipe '{spec.recipe}' runs as a {rt.kind} and has no container image, so it cannot be "
            f"rendered for Kubernetes: pass --image IMAGE (an image with vLLM and the model's runtime).")
    # A container spec's options read by name (duck typing: another kind's classes are its own business).
    return KubernetesLaunch(
        image=chosen,
        cache=DEFAULT_CACHE,
        model=DEFAULT_MODEL,
        shm_size=docker_size_to_quantity(getattr(rt, "shm_size", None)),
        host_ipc=getattr(rt, "ipc_mode", None) == "host",
        seccomp_unconfined="seccomp=unconfined" in tuple(getattr(rt, "security_opt", ()) or ()),
    )


def docker_size_to_quantity(size: str | None) -> str | None:
    """Docker's `16g` (binary units: b, k, m, g) → the Kubernetes quantity `16Gi`."""
    if size is None:
        return None
    m = re.fullmatch(r"(\d+)([bkmgBKMG]?)", size.strip())
    if m is None:
        raise K8sRenderError(f"shm_size {size!r} is not a docker size (e.g. 16g)")
    return m.group(1) + {"": "", "b": "", "k": "Ki", "m": "Mi", "g": "Gi"}[m.group(2).lower()]


# -- facts read from the common spec -----------------------------------------------------------------


def model_path(spec: LaunchSpec) -> str:
    """The model as the engine is told (`LaunchSpec.model`)."""
    if spec.model is None:
        raise K8sRenderError(f"recipe '{spec.recipe}': no model in the engine's argv")
    return spec.model


def pod_argv(spec: LaunchSpec, image_given: bool) -> tuple[str, ...]:
    """The engine's command in the pod. Two rewrites, both forced by the pod: `--host` becomes 0.0.0.0
    (the kubelet probes and the Service reach the pod IP; bound to 127.0.0.1 they get `connection
    refused`, DOMAIN §5), and a process recipe's host interpreter becomes the image's `python`."""
    python = spec.runtime.engine_python()
    launcher = spec.launcher
    if image_given and python is not None:
        launcher = tuple("python" if a == python else a for a in launcher)
    groups = [(flag, ANY_ADDRESS, *rest[1:]) if flag == "--host" and rest else (flag, *rest)
              for flag, *rest in spec.flag_groups]
    return spec.model_copy(update={"argv": engine_argv.join(launcher, groups)}).command()


def gpu_resource(spec: LaunchSpec) -> str | None:
    return GPU_RESOURCE.get(spec.platform)


def pod_device_env(spec: LaunchSpec) -> list[tuple[str, str]]:
    """The device variables the spec sets, renumbered for the pod: the plugin hands the pod its
    `tensor_parallel_size` cards, which the runtime numbers 0…n−1 inside the container. The host's
    indices would name cards the pod does not have, but the variable must not be dropped either:
    seed 000 chapter 一 §8 — HIP_VISIBLE_DEVICES is always given explicitly, never unset (unset = every
    card the runtime can see). NVIDIA's plugin sets the visible cards through the container runtime
    itself, so only the gfx906 rule is carried."""
    if spec.platform != "gfx906":
        return []
    cards = ",".join(str(i) for i in range(spec.tensor_parallel_size))
    return [(k, cards) for k in DEVICE_ENV if k in spec.env]
