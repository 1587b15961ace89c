"""One engine replica as Kubernetes objects: `manifests(spec, launch_id=…) -> list[dict]`. Pure.

The effectful half (controller/runtime/kubernetes.py) applies exactly these dicts, and
`appliance recipes render NAME --format k8s` prints them, so what an operator reads is what runs.

**Why a Deployment (replicas 1, strategy Recreate) and not a StatefulSet.** One replica holds all its
GPUs and a ReadWriteOnce cache volume. A RollingUpdate would start the new pod while the old one still
holds both: the new pod stays Pending on GPUs (or fails to attach the RWO volume on another node) and
the rollout never finishes — Recreate stops the old pod first, which is what the controller does on
one host too (one engine at a time, ARCHITECTURE.md). A StatefulSet's strengths do not apply: its
`volumeClaimTemplates` make one claim per set *and ordinal* (a new set per launch would get a new, cold
cache), and a stable network identity is what the Service already gives. The warm cache instead lives
in a standalone claim named after the recipe, which every launch of that recipe mounts again (DOMAIN §4:
recipe C is ready in 230 s warm vs 352 s cold). The one thing a StatefulSet adds — at most one pod even
across a node partition — the RWO claim already enforces for the cache (a second pod cannot attach it).

Other choices, each from a fact:
- GPUs are extended resources (`amd.com/gpu` / `nvidia.com/gpu`, count = tensor_parallel_size) and
  HIP_/CUDA_VISIBLE_DEVICES are dropped: the device plugin gives the container exactly its cards,
  renumbered from 0, so the host indices of the recipe would name cards the pod does not have.
- No memory limit, only a request (DOMAIN §3: a cgroup limit counts page cache; 29 GB of mmapped weights
  + 4 workers hit a 32 GiB limit). A namespace LimitRange can still inject one: see needs.
- `/dev/shm` is a memory-backed emptyDir sized from the recipe (the container default is 64 MB; vLLM's
  workers exchange tensors through it), hostIPC where the recipe uses host IPC (RCCL SHM, S12).
- The startup probe's failureThreshold × periodSeconds covers the recipe's ready budget, so a 2700 s
  default-graph start (DOMAIN §4: an orchestrator that waited 1500 s killed it at 38/51) is not
  killed by the kubelet; liveness only starts after it.
- The engine key is never in a manifest: vLLM reads it from a config file (`--config`) that a Secret
  volume mounts at a path that is the same for every launch (appliance/engine_secret.py); the
  effectful half creates the Secret from the launch's key (controller/supervisor/launch_key.py).
  Not `VLLM_API_KEY` from a secretKeyRef: vLLM 0.26.0 hashes that variable into its compile-cache
  key, so a fresh key per launch made every warm restart a full recompile (docs/measured.md).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from appliance.engine_secret import (
    CONTAINER_KEY_DIR,
    CONTAINER_KEY_PATH,
    KEY_FILE_NAME,
    config_yaml,
    with_key_config,
)
from appliance.runtimes.k8s.model import KubernetesLaunch, Storage
from appliance.runtimes.k8s.names import (
    ENGINE_KEY_ENV,
    dns_label,
    key_secret_name,
    labels,
    raw_labels,
    selector,
    workload_name,
)
from appliance.runtimes.k8s.spec import (
    CACHE_DIR_ENV,
    DEVICE_ENV,
    PLATFORM_NODE_SELECTOR,
    cluster_target,
    gpu_resource,
    model_path,
    pod_argv,
    pod_device_env,
)

if TYPE_CHECKING:
    from appliance.recipe.launch_spec import LaunchSpec

CONTAINER = "engine"
PORT_NAME = "http"
KEY_VOLUME = "engine-key"
PROBE_PERIOD_S = 10


def _meta(spec: LaunchSpec, name: str, target: KubernetesLaunch, launch_id: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if target.namespace is not None:
        meta["namespace"] = target.namespace
    meta["labels"] = labels(spec, launch_id)
    meta["annotations"] = raw_labels(spec, launch_id)  # label values are sanitised; these are exact
    return meta


# The kubelet's startup window outlasts the controller's ready budget by this much, so a slow start is
# judged by the controller (phase-aware: it reads the log, diagnoses, backs off), not killed blind.
STARTUP_MARGIN_S = 60


def startup_failure_threshold(ready_budget_s: int, period_s: int = PROBE_PERIOD_S) -> int:
    """Enough failures that failureThreshold × periodSeconds ≥ the ready budget + a margin (DOMAIN §4:
    a default-graph start takes 1542–1583 s; an orchestrator that waited 1500 s killed it at 38/51)."""
    return max(1, math.ceil((ready_budget_s + STARTUP_MARGIN_S) / period_s))


# -- the manifests ---------------------------------------------------------------------------------------


def manifests(spec: LaunchSpec, *, launch_id: str | None = None, image: str | None = None,
              key_secret: str | None = None, memory_request: str | None = None) -> list[dict[str, Any]]:
    """The objects of one engine replica, in apply order: the claims it creates, Deployment, Service.

    `image`: for a process spec (it has none); `key_secret`: the Secret holding VLLM_API_KEY;
    `memory_request`: when the spec has none (a docker spec; the render passes the recipe's)."""
    target = cluster_target(spec, image)
    if memory_request is not None and target.memory_request is None:
        target = target.model_copy(update={"memory_request": memory_request})
    name = workload_name(spec)
    out: list[dict[str, Any]] = []
    for role, storage in (("cache", target.cache), ("model", target.model)):
        if storage.claim is None:
            out.append(_claim(spec, target, f"{name}-{role}", storage, launch_id))
    out.append(_deployment(spec, target, name, launch_id, key_secret or key_secret_name(spec),
                           image_given=image is not None))
    out.append(_service(spec, target, name, launch_id))
    return out


def engine_key_secret(spec: LaunchSpec, key: str, *, launch_id: str | None = None,
                      name: str | None = None, namespace: str | None = None) -> dict[str, Any]:
    """The Secret the Deployment mounts as the engine's key file (for the effectful half; never
    rendered or printed). `key` is the launch's engine key (`launch_key(spec)[0]`: the recipe's own
    or a fresh one)."""
    meta: dict[str, Any] = {"name": name or key_secret_name(spec), "labels": labels(spec, launch_id)}
    if namespace is not None:
        meta["namespace"] = namespace
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "Opaque",
            "stringData": {KEY_FILE_NAME: config_yaml(key)}}


def claim_name(spec: LaunchSpec, role: str, storage: Storage) -> str:
    return storage.claim or f"{workload_name(spec)}-{role}"


def _claim(spec: LaunchSpec, target: KubernetesLaunch, name: str, storage: Storage,
           launch_id: str | None) -> dict[str, Any]:
    # The claim outlives launches (that is its point): it carries no launch id, so deleting a
    # launch's objects by launch id leaves the warm cache in place.
    body: dict[str, Any] = {"accessModes": [storage.access_mode],
                            "resources": {"requests": {"storage": storage.size}}}
    if storage.storage_class is not None:
        body["storageClassName"] = storage.storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": _meta(spec, name, target, None), "spec": body}


def _cache_mounts(spec: LaunchSpec) -> list[dict[str, Any]]:
    """The cache claim at the variant's cache root (subPath = the variant, so one claim serves every
    variant of the recipe), and again at every pinned cache directory outside that root (the recipe's
    fixed Triton volume, DOMAIN §2): every cache env path lands in the claim, none in the container
    layer (S8 §5.4: 2.1 GB written there otherwise)."""
    root = spec.cache_root.rstrip("/")
    variant = root.rsplit("/", 1)[-1]
    mounts = [{"name": "cache", "mountPath": root, "subPath": variant}]
    outside = sorted({spec.env[k] for k in CACHE_DIR_ENV
                      if k in spec.env and not (spec.env[k] + "/").startswith(root + "/")})
    mounts += [{"name": "cache", "mountPath": path, "subPath": dns_label(path.strip("/"))}
               for path in outside]
    return mounts


def _env(spec: LaunchSpec) -> list[dict[str, Any]]:
    # A recipe's own VLLM_API_KEY goes into the Secret's key file instead (never a manifest value).
    return [{"name": k, "value": v} for k, v in spec.env.items()
            if k not in DEVICE_ENV and k != ENGINE_KEY_ENV] + [
        {"name": k, "value": v} for k, v in pod_device_env(spec)]


def _resources(spec: LaunchSpec, target: KubernetesLaunch) -> dict[str, Any]:
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    if target.cpu_request is not None:
        requests["cpu"] = target.cpu_request
    if target.memory_request is not None:
        requests["memory"] = target.memory_request  # a request only: never a limit (DOMAIN §3)
    gpu = gpu_resource(spec)
    if gpu is not None:
        # Extended resources are whole cards, limit = request (the scheduler's rule).
        requests[gpu] = limits[gpu] = spec.tensor_parallel_size
    out: dict[str, Any] = {"requests": requests}
    if limits:
        out["limits"] = limits
    return out


def _probe(spec: LaunchSpec, period_s: int, failures: int, timeout_s: int) -> dict[str, Any]:
    return {"httpGet": {"path": spec.probes.health_path, "port": PORT_NAME},
            "periodSeconds": period_s, "failureThreshold": failures, "timeoutSeconds": timeout_s}


def _deployment(spec: LaunchSpec, target: KubernetesLaunch, name: str, launch_id: str | None,
                key_secret: str, *, image_given: bool) -> dict[str, Any]:
    model = model_path(spec)
    mounts = [*_cache_mounts(spec), {"name": "model", "mountPath": model, "readOnly": True},
              {"name": "dshm", "mountPath": "/dev/shm"}]
    if target.model.sub_path is not None:
        mounts[-2]["subPath"] = target.model.sub_path
    mounts.append({"name": KEY_VOLUME, "mountPath": CONTAINER_KEY_DIR, "readOnly": True})
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": target.image_ref,
        "command": list(with_key_config(pod_argv(spec, image_given), CONTAINER_KEY_PATH)),
        "env": _env(spec),
        "ports": [{"name": PORT_NAME, "containerPort": spec.port, "protocol": "TCP"}],
        "resources": _resources(spec, target),
        "volumeMounts": mounts,
        "startupProbe": _probe(spec, PROBE_PERIOD_S, startup_failure_threshold(spec.ready_budget_s), 5),
        "readinessProbe": _probe(spec, 5, 3, 5),
        # vLLM's /health can be slow under a full batch: 6 × 10 s before a restart.
        "livenessProbe": _probe(spec, PROBE_PERIOD_S, 6, 10),
    }
    workdir = spec.workdir
    if workdir and not image_given:
        container["workingDir"] = workdir
    if target.seccomp_unconfined:
        container["securityContext"] = {"seccompProfile": {"type": "Unconfined"}}
    shm: dict[str, Any] = {"medium": "Memory"}
    if target.shm_size is not None:
        shm["sizeLimit"] = target.shm_size
    pod: dict[str, Any] = {
        "containers": [container],
        "restartPolicy": "Always",  # a Deployment allows only Always; the controller still watches exits
        "terminationGracePeriodSeconds": 60,
        "volumes": [
            {"name": "cache",
             "persistentVolumeClaim": {"claimName": claim_name(spec, "cache", target.cache)}},
            {"name": "model",
             "persistentVolumeClaim": {"claimName": claim_name(spec, "model", target.model),
                                       "readOnly": True}},
            {"name": "dshm", "emptyDir": shm},
            # 0400: the key file is the engine's alone (vLLM's config file,
            # appliance/engine_secret.py).
            {"name": KEY_VOLUME, "secret": {"secretName": key_secret, "defaultMode": 0o400,
                                            "items": [{"key": KEY_FILE_NAME, "path": KEY_FILE_NAME}]}},
        ],
    }
    if target.host_ipc:
        pod["hostIPC"] = True
    selector_labels = (PLATFORM_NODE_SELECTOR.get(spec.platform, {}) if target.node_selector is None
                       else target.node_selector)
    if selector_labels:
        pod["nodeSelector"] = dict(selector_labels)
    if target.tolerations:
        pod["tolerations"] = [t.model_dump(exclude_none=True) for t in target.tolerations]
    if target.runtime_class is not None:
        pod["runtimeClassName"] = target.runtime_class
    if target.image_pull_secret is not None:
        pod["imagePullSecrets"] = [{"name": target.image_pull_secret}]
    meta = _meta(spec, name, target, launch_id)
    template_meta = {"labels": meta["labels"], "annotations": meta["annotations"]}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": selector(spec)},
            # The rollout may take the whole ready budget before it counts as stalled.
            "progressDeadlineSeconds": spec.ready_budget_s + 600,
            "template": {"metadata": template_meta, "spec": pod},
        },
    }


def _service(spec: LaunchSpec, target: KubernetesLaunch, name: str, launch_id: str | None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(spec, name, target, launch_id),
            "spec": {"type": target.service_type, "selector": selector(spec),
                     "ports": [{"name": PORT_NAME, "port": spec.port, "targetPort": PORT_NAME,
                                "protocol": "TCP"}]}}
