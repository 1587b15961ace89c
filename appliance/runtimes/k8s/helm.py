"""The same launch as values for vLLM production-stack's Helm chart (`render --format helm-values`). Pure.

The chart (github.com/vllm-project/production-stack, helm/) deploys one Deployment per
`servingEngineSpec.modelSpec` entry. Its engine command is fixed — `vllm serve <modelURL> --host 0.0.0.0
--port <containerPort>` followed by the flags its `vllmConfig` keys map to and `vllmConfig.extraArgs` —
and its one volume (`pvcStorage`) is mounted at /data. So this render maps what the chart has a key for,
passes every other engine flag through `extraArgs`, moves the compile caches into /data (so they
survive pod restarts), and says in comments what the chart cannot carry (a sourced environment, the
torch-first wrapper, everything needs lists). What it writes is exactly the model in
helm_model.py (the chart's documented key names, unknown keys forbidden), which tests validate
every shipped recipe's values against.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

from appliance.runtimes.k8s.manifests import PROBE_PERIOD_S, startup_failure_threshold
from appliance.runtimes.k8s.names import ENGINE_KEY_ENV, dns_label, key_secret_name
from appliance.runtimes.k8s.spec import (
    CACHE_DIR_ENV,
    DEVICE_ENV,
    PLATFORM_NODE_SELECTOR,
    cluster_target,
    gpu_resource,
    model_path,
    pod_device_env,
)

if TYPE_CHECKING:
    from appliance.recipe.launch_spec import LaunchSpec
    from appliance.recipe.recipe_model import Recipe

DATA = "/data"  # where the chart mounts `pvcStorage` (and sets HF_HOME)
CACHE_IN_DATA = f"{DATA}/appliance-cache"
# Engine flag → (vllmConfig key, type) for the flags the chart has a key for (besides TP, which the
# spec carries as a typed fact: `LaunchSpec.tensor_parallel_size`).
_MAPPED: dict[str, tuple[str, type]] = {
    "--dtype": ("dtype", str),
    "--max-model-len": ("maxModelLen", int),
    "--gpu-memory-utilization": ("gpuMemoryUtilization", float),
    "--max-num-seqs": ("maxNumSeqs", int),
}
# The chart writes these itself.
_CHART_OWNS = ("--host", "--port", "--model")


def split_image(ref: str) -> tuple[str, str]:
    """`registry:5000/repo:tag@sha256:…` → (`registry:5000/repo`, `tag@sha256:…`): the chart writes
    `repository:tag`, and `repo:tag@digest` is a valid reference that pins the digest."""
    name, _, digest = ref.partition("@")
    slash = name.rfind("/")
    colon = name.rfind(":")
    repo, tag = (name[:colon], name[colon + 1:]) if colon > slash else (name, "latest")
    return repo, f"{tag}@{digest}" if digest else tag


def _gib(quantity: str | None) -> float | None:
    m = re.fullmatch(r"([0-9.]+)Gi", quantity or "")
    return float(m.group(1)) if m else None


def memory_request(recipe: Recipe | None) -> str | None:
    """The pod's memory request from the recipe's memory model: admission's cold-start peak
    (workers × (RssAnon + RssFile) + EngineCore/API server + start-up transient, DOMAIN §3), rounded up
    to whole GiB. A request for scheduling only — never a limit (DOMAIN §3)."""
    if recipe is None or recipe.memory is None:
        return None
    m = recipe.memory
    graph = recipe.engine.mode.value == "graph"
    per_worker = (m.worker_anon_gib_graph + m.worker_file_gib_graph) if graph else \
        (m.worker_anon_gib_eager + m.worker_file_gib_eager)
    peak = recipe.workers * per_worker + m.overhead_gib + m.startup_transient_gib
    return f"{max(1, math.ceil(peak))}Gi"


def _model_url(model: str) -> str:
    """A local model folder must be in the chart's volume (/data); an HF id stays as it is."""
    return f"{DATA}/models/{model.rstrip('/').rsplit('/', 1)[-1]}" if model.startswith("/") else model


def _cache_path(spec: LaunchSpec, path: str) -> str:
    root = spec.cache_root.rstrip("/")
    variant = root.rsplit("/", 1)[-1]
    if path == root or path.startswith(root + "/"):
        return f"{CACHE_IN_DATA}/{variant}{path[len(root):]}"
    return f"{CACHE_IN_DATA}/{dns_label(path.strip('/'))}"


def helm_values(spec: LaunchSpec, recipe: Recipe | None = None, *,
                image: str | None = None) -> dict[str, Any]:
    target = cluster_target(spec, image)
    tp = spec.tensor_parallel_size
    vllm_config: dict[str, Any] = {}
    extra: list[str] = []
    for group in spec.flag_groups:
        flag = group[0]
        if flag in _CHART_OWNS:
            continue
        if flag == "--tensor-parallel-size":
            vllm_config["tensorParallelSize"] = tp  # the typed fact, in its place in the argv order
        elif flag in _MAPPED and len(group) == 2:
            key, cast = _MAPPED[flag]
            vllm_config[key] = cast(group[1])
        elif flag in ("--enable-prefix-caching", "--no-enable-prefix-caching"):
            vllm_config["enablePrefixCaching"] = flag == "--enable-prefix-caching"
        else:
            extra += group
    # The chart writes --no-enable-prefix-caching whenever the key is false or absent; vLLM's own
    # default (V1) is on, so an unset recipe value is written as on.
    vllm_config.setdefault("enablePrefixCaching", True)
    vllm_config.setdefault("tensorParallelSize", tp)
    if extra:
        vllm_config["extraArgs"] = extra
    env = [{"name": k, "value": _cache_path(spec, v) if k in CACHE_DIR_ENV else v}
           for k, v in spec.env.items() if k not in DEVICE_ENV and k != ENGINE_KEY_ENV]
    env += [{"name": k, "value": v} for k, v in pod_device_env(spec)]
    model = model_path(spec)
    repo, tag = split_image(target.image_ref)
    gpu = gpu_resource(spec)
    entry: dict[str, Any] = {
        "name": dns_label(spec.recipe, 40),
        "repository": repo,
        "tag": tag,
        "modelURL": _model_url(model),
        "replicaCount": 1,
        # API server + EngineCore + one busy worker per card.
        "requestCPU": int(float(target.cpu_request)) if target.cpu_request and not
        target.cpu_request.endswith("m") else tp + 2,
        "requestMemory": target.memory_request or memory_request(recipe) or "16Gi",
        "requestGPU": tp if gpu is not None else 0,
        "pvcStorage": _storage_size(target.model.size, target.cache.size),
        "pvcAccessMode": [target.model.access_mode],
        "vllmConfig": vllm_config,
        "env": env,
    }
    if gpu is not None and gpu != "nvidia.com/gpu":
        entry["requestGPUType"] = gpu
    if target.model.storage_class is not None:
        entry["storageClass"] = target.model.storage_class
    if target.shm_size is not None:
        entry["shmSize"] = target.shm_size
    node = target.node_selector
    if node is None:
        node = PLATFORM_NODE_SELECTOR.get(spec.platform, {})
    if node:
        entry["nodeSelectorTerms"] = [{"matchExpressions": [
            {"key": k, "operator": "In", "values": [v]} for k, v in node.items()]}]
    if target.tolerations:
        entry["tolerations"] = [t.model_dump(exclude_none=True) for t in target.tolerations]
    if target.runtime_class is not None:
        entry["runtimeClassName"] = target.runtime_class
    if target.image_pull_secret is not None:
        entry["imagePullSecret"] = target.image_pull_secret
    probe = {"httpGet": {"path": spec.probes.health_path, "port": spec.port}, "initialDelaySeconds": 0}
    return {"servingEngineSpec": {
        "containerPort": spec.port,
        "strategy": {"type": "Recreate"},
        "vllmApiKey": {"secretName": key_secret_name(spec), "secretKey": ENGINE_KEY_ENV},
        "startupProbe": {**probe, "periodSeconds": PROBE_PERIOD_S,
                         "failureThreshold": startup_failure_threshold(spec.ready_budget_s)},
        "readinessProbe": {**probe, "periodSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {**probe, "periodSeconds": PROBE_PERIOD_S, "failureThreshold": 6},
        "modelSpec": [entry],
    }}


def _storage_size(model: str | None, cache: str | None) -> str:
    """The chart has one volume for the model and (here) the compile caches: the sum when both are GiB."""
    m, c = _gib(model), _gib(cache)
    if m is not None and c is not None:
        return f"{m + c:g}Gi"
    return model or cache or "150Gi"


def comment_lines(spec: LaunchSpec, recipe: Recipe | None) -> list[str]:
    """What the chart cannot carry of this launch, as YAML comments."""
    lines = [
        f"# vLLM production-stack values for recipe '{spec.recipe}' (spec {spec.spec_hash}): one model, "
        f"one replica. `helm install NAME vllm/vllm-stack -f THIS_FILE` after creating the Secret "
        f"'{key_secret_name(spec)}' (key {ENGINE_KEY_ENV}).",
        "# strategy Recreate: a rolling update would start the new pod while the old one holds the GPUs.",
        f"# startupProbe: failureThreshold × periodSeconds ≥ the ready budget ({spec.ready_budget_s} s, "
        f"DOMAIN §4).",
        "# Compile caches moved into the chart's volume (/data/appliance-cache/...): warm restarts across "
        "pods (DOMAIN §4).",
        "# HIP_/CUDA_VISIBLE_DEVICES dropped: the device plugin assigns the cards.",
    ]
    model = model_path(spec)
    if model.startswith("/"):
        lines.append(f"# modelURL: copy the model folder ({model}) into the volume at /data/models/ first, "
                     f"or set an HF model id.")
    if spec.source_files:
        lines.append(f"# NOT EXPRESSIBLE in the chart: it runs `vllm serve` directly, so the recipe's "
                     f"sourced files ({', '.join(spec.source_files)}) must be baked into the image's "
                     f"environment.")
    if spec.launcher[1:2] == ("-c",):
        lines.append("# NOT EXPRESSIBLE in the chart: the torch-first wrapper (importing vllm before torch → "
                     "std::bad_alloc, SIGABRT 134, DOMAIN §5); use `render --format k8s` for this recipe.")
    if recipe is not None:
        from appliance.runtimes.k8s.needs import comment_lines as needs_comments

        lines += needs_comments(recipe)
    return lines
