"""KubernetesRuntime: one engine replica as a workload on a cluster, through the official client.

The manifests come from the pure half (`appliance/runtimes/k8s/kubernetes.py`, `manifests(spec, ...)`);
this module only applies, watches, reads and deletes them. Choices, and why:

- **Apply = server-side apply** (PATCH `application/apply-patch+yaml`, field manager
  `appliance-controller`, force) for the Service and the Deployment: one idempotent request per
  object whether it exists or not, no read-modify-write race, and the server records which fields are
  ours. Claims are created only if absent (they outlive launches: the warm cache; re-applying a bound
  claim with another size would be an immutable-field error, not a launch failure). Before applying,
  the workload and Service names (one per recipe) are read: one carrying another launch's
  `appliance.launch_id`, or still being deleted, is refused rather than taken over.
- **The engine API key** goes into a per-launch Secret created first (the pure half's
  `engine_key_secret`, made `immutable`): the launch's key, or the recipe's own when it brings one,
  as vLLM's config file, mounted 0400 and given with `--config` at one path for every launch (never
  `VLLM_API_KEY`: vLLM 0.26.0 hashes it into its compile-cache key). The manifests only
  name the Secret, so the key is never in a manifest, a log line or a record. `read_engine_key`
  reads it back through the workload's Secret volume.
- **Ended = the first container run ended.** A Deployment's pod always restarts (restartPolicy
  Always), but the controller owns restarts (backoff, diagnosis, DOMAIN §3's OOM loops): so a
  terminated state, a restart count above 0, CrashLoopBackOff, an image that cannot be pulled and an
  unschedulable pod all read as `running=False`, the cause in `ExitInfo.reason`. An unschedulable pod
  gets a grace first (`unschedulable_grace_s`, $APPLIANCE_K8S_UNSCHEDULABLE_GRACE_S, 300 s by default,
  counted from the condition's lastTransitionTime): a cluster autoscaler (or Karpenter) answers a
  pending GPU pod by adding a node, which takes minutes; failing at the first scheduler message would
  end every launch that waits for one. The grace counts inside the ready budget.
- **wait** lists the launch's pods, then watches them from that list's resourceVersion with a
  server-side `timeoutSeconds` (event-driven, no tight poll).
- **Logs** have no byte offset in the API: each read fetches the current container's log with
  `limitBytes = offset + MAX_CHUNK_BYTES` (bounded; the kubelet rotates a container's log at
  `containerLogMaxSize`, 10 MiB by default) and slices at `offset` here. Once the container has
  restarted, the log of the run that ended (`previous=true`) is the launch's log.
- **stop** deletes the workload (propagationPolicy Foreground) and the launch's pods with
  `gracePeriodSeconds = grace_s` (the kubelet's TERM, grace, KILL), watches until no pod is left,
  then deletes the launch's Secret and Service. The cache PVC stays (warm restarts) unless the
  runtime was built with `keep_cache=False`.
- **engine_pids** is always []: the engine runs on a cluster node, not in this host's PID namespace
  (the host memory watch and OOM attribution do not apply; the pod's OOMKilled reason does).
- **cpu_seconds** integrates metrics.k8s.io usage (PodMetrics, cores averaged over its window) over
  the time between calls. Where there is nothing to measure — no metrics API, no sample yet, or no
  container running yet (scheduling, an image pull) — the interval counts as busy (wall time): the
  supervisor's stall rule (no log progress AND no CPU) then never fires on a guess; the ready budget
  and the startupProbe still bound a hung start. A running engine measured idle does not advance.
- **Reaching the engine**: the controller runs in-cluster and reaches the engine through its
  Service's DNS name (`<service>.<namespace>.svc`), which the pure half's `reach()` puts in
  `spec.host`; readiness stays the supervisor's (the pod's probes only gate the Service).

Every API failure surfaces as EngineRuntimeError with one operator-readable sentence (a missing config,
a missing namespace, RBAC naming the verb and resource to grant, a workload of another launch).
"""

from __future__ import annotations

import base64
import json
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from kubernetes.utils.quantity import parse_quantity

from appliance import settings
from appliance.engine_secret import KEY_FILE_NAME, key_from_config
from appliance.recipe.engine_key import recipe_key
from appliance.recipe.launch_spec import LaunchSpec
from appliance.runtimes.k8s.manifests import KEY_VOLUME, engine_key_secret, manifests
from appliance.runtimes.k8s.names import ENGINE_KEY_ENV, dns_label, label_value
from controller.runtime.base import (
    LABEL_INSTANCE,
    LABEL_LAUNCH_ID,
    LABEL_MANAGED,
    LABEL_RECIPE,
    LABEL_SPEC_HASH,
    EngineHandle,
    EngineRuntimeError,
    ExitInfo,
    RuntimeUnconfigured,
)
from controller.runtime.log_offsets import MAX_CHUNK_BYTES, slice_log
from controller.runtime.registry import RuntimeContext

log = logging.getLogger(__name__)

# The client's config loaders, Watch and quantity parser are untyped (its models are typed).
_load_incluster: Any = k8s_config.load_incluster_config
_load_kubeconfig: Any = k8s_config.load_kube_config
_Watch: Any = k8s_watch.Watch
_parse_quantity: Any = parse_quantity

FIELD_MANAGER = "appliance-controller"
IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
NAMESPACE_ENV = "APPLIANCE_K8S_NAMESPACE"
UNSCHEDULABLE_GRACE_ENV = "APPLIANCE_K8S_UNSCHEDULABLE_GRACE_S"
# Long enough for a cluster autoscaler to add a GPU node (a few minutes on the big clouds), short
# against a cold start's ready budget (DOMAIN §4: 900 s and more), so the scheduler's words still end
# a launch that no node will ever take, well before the budget would.
DEFAULT_UNSCHEDULABLE_GRACE_S = settings.DEFAULT_UNSCHEDULABLE_GRACE_S
WORKLOAD_KINDS = ("Deployment", "StatefulSet")
# adopt() runs at controller start: a configured but unreachable cluster must not hold it up.
ADOPT_TIMEOUT_S = (5.0, 15.0)
# Waiting reasons after which the container will not run as rendered without someone changing
# something (image, config, the engine itself): the launch has ended.
ENDED_WAITING = frozenset({
    "CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "InvalidImageName",
    "CreateContainerConfigError", "CreateContainerError", "RunContainerError",
})
# Apply order: what the workload references exists before it (Secret first: start creates it).
_APPLY_ORDER = {"Secret": 0, "ConfigMap": 1, "PersistentVolumeClaim": 2, "Service": 3,
                "Deployment": 4, "StatefulSet": 4}

Manifests = Callable[[LaunchSpec, str, str], list[dict[str, Any]]]


def render_manifests(spec: LaunchSpec, launch_id: str, key_secret: str) -> list[dict[str, Any]]:
    """The pure half's manifests (appliance/runtimes/k8s/manifests.py), the key Secret named."""
    return manifests(spec, launch_id=launch_id, key_secret=key_secret)


def secret_name(launch_id: str) -> str:
    """The per-launch key Secret (per launch, not per recipe: stopping an old launch never deletes
    the key of the launch that replaced it). A DNS-1123 name: launch ids carry an upper-case `T`."""
    return dns_label(f"appliance-{launch_id}-engine-key", 253)


def launch_selector(launch_id: str) -> str:
    """The label selector of a launch's objects (label values are sanitised by the pure half)."""
    return f"{LABEL_MANAGED}=true,{LABEL_LAUNCH_ID}={label_value(launch_id)}"


# -- pure: pod status → ExitInfo ---------------------------------------------------------------


def _terminated(term: k8s.V1ContainerStateTerminated, reason: str | None = None) -> ExitInfo:
    code = int(term.exit_code)
    # The kubelet reports the signal only on some runtimes; 128+N is the shell convention (docker too).
    sig = term.signal if term.signal else (code - 128 if 128 < code <= 128 + 64 else None)
    why = reason or ": ".join(x for x in (term.reason, term.message) if x) or None
    return ExitInfo(running=False, exit_code=code, signal=sig,
                    oom_killed=term.reason == "OOMKilled", reason=why)


def _unschedulable(cond: k8s.V1PodCondition, now: float | None, grace_s: float) -> ExitInfo:
    """Pending for the scheduler: still starting inside the grace, ended after it (or without a time)."""
    words = f"Unschedulable: {cond.message or ''}".rstrip(": ")
    since = cond.last_transition_time
    pending_s = None if now is None or since is None else max(0.0, now - since.timestamp())
    if pending_s is not None and pending_s < grace_s:
        return ExitInfo(running=True, oom_killed=False,
                        reason=f"{words} (pending {pending_s:.0f} s of a {grace_s:.0f} s grace for the "
                               "cluster to make room)")
    if pending_s is not None and grace_s > 0:
        words += f" (unschedulable for {pending_s:.0f} s, past the {grace_s:.0f} s grace)"
    return ExitInfo(running=False, reason=words)


def pod_exit(pod: k8s.V1Pod, *, now: float | None = None, unschedulable_grace_s: float = 0.0) -> ExitInfo:
    """One pod's status → ExitInfo (pure; tested on recorded pods). `now` (wall-clock seconds, the
    API's timestamps are wall time) and the grace decide whether an unschedulable pod has ended."""
    status = pod.status or k8s.V1PodStatus()
    for cs in status.container_statuses or []:
        state = cs.state or k8s.V1ContainerState()
        last = cs.last_state.terminated if cs.last_state else None
        if state.terminated is not None:
            return _terminated(state.terminated)
        if state.waiting is not None and state.waiting.reason in ENDED_WAITING:
            why = ": ".join(x for x in (state.waiting.reason, state.waiting.message) if x)
            if last is not None:
                return _terminated(last, f"{why} (last run: {last.reason or 'exited'} "
                                         f"with code {last.exit_code})")
            return ExitInfo(running=False, reason=why)
        if (cs.restart_count or 0) > 0 and last is not None:
            # The kubelet already restarted it behind the controller's back (restartPolicy Always).
            return _terminated(last)
    for cond in status.conditions or []:
        if cond.type == "PodScheduled" and cond.status == "False" and cond.reason == "Unschedulable":
            return _unschedulable(cond, now, unschedulable_grace_s)
    if status.phase in ("Failed", "Succeeded"):  # evicted, or ended without container statuses
        why = ": ".join(x for x in (status.phase, status.reason, status.message) if x)
        return ExitInfo(running=False, reason=why)
    return ExitInfo(running=True, oom_killed=False)


def launch_exit(pods: Sequence[k8s.V1Pod], *, now: float | None = None,
                unschedulable_grace_s: float = 0.0) -> ExitInfo | None:
    """The launch's state from all its pods: ended if any pod says so; None when there is no pod."""
    if not pods:
        return None
    infos = [pod_exit(p, now=now, unschedulable_grace_s=unschedulable_grace_s) for p in pods]
    ended = [i for i in infos if not i.running]
    return ended[0] if ended else infos[0]


def api_failure(
    action: str, exc: ApiException, *, verb: str, resource: str, namespace: str
) -> EngineRuntimeError:
    """An API error → one sentence naming what to fix (Status bodies are JSON; see fixtures)."""
    try:
        body = json.loads(exc.body) if exc.body else {}
    except (TypeError, ValueError):
        body = {}
    message = str(body.get("message") or exc.reason or exc)
    details = body.get("details") or {}
    if exc.status == 403:
        return EngineRuntimeError(
            f"kubernetes: {action} was forbidden ({message}); RBAC must grant the controller's "
            f"service account `{verb}` on `{resource}` in namespace {namespace!r}")
    if exc.status == 404 and details.get("kind") == "namespaces":
        return EngineRuntimeError(f"kubernetes: namespace {namespace!r} does not exist "
                             f"(create it, or set {NAMESPACE_ENV}); {action} failed")
    return EngineRuntimeError(f"kubernetes: {action} failed: HTTP {exc.status} {message}")


def _ts(value: datetime | None) -> float:
    return value.timestamp() if value is not None else time.time()


def _model(cls: Any, body: Mapping[str, Any]) -> Any:
    """A manifest dict (camelCase) → the client's typed model, which its create calls require."""
    return cls.from_dict(dict(body))


def _expired(exc: EngineRuntimeError) -> bool:
    """A watch ended by an ERROR event with code 410 (resourceVersion too old)."""
    cause = exc.__cause__
    return isinstance(cause, ApiException) and cause.status == 410


def _split_ref(ref: str) -> tuple[str, str, str]:
    """ref = `namespace/Kind/name` (what EngineHandle.ref holds for this runtime)."""
    parts = ref.split("/")
    if len(parts) != 3 or parts[1] not in WORKLOAD_KINDS:
        raise EngineRuntimeError(f"kubernetes: handle ref {ref!r} is not namespace/Kind/name")
    return parts[0], parts[1], parts[2]


def _created(obj: Any) -> float:
    meta = getattr(obj, "metadata", None)
    stamp = meta.creation_timestamp if meta is not None else None
    return float(stamp.timestamp()) if stamp is not None else 0.0


def _labels(obj: Any) -> dict[str, str]:
    meta = getattr(obj, "metadata", None)
    return dict(meta.labels or {}) if meta is not None else {}


class KubernetesRuntime:
    """Runs LaunchSpecs with a `kubernetes` runtime section as workloads on a cluster."""

    name = "kubernetes"

    def __init__(
        self,
        api_client: k8s.ApiClient | None = None,
        *,
        namespace: str | None = None,
        render: Manifests = render_manifests,
        keep_cache: bool = True,
        delete_wait_s: float = 60.0,
        unschedulable_grace_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        instance_id: str | None = None,
    ) -> None:
        """`api_client`: built from in-cluster config or a kubeconfig on first use when None.
        `namespace`: where launches go when a manifest names none (else $APPLIANCE_K8S_NAMESPACE,
        the service account's namespace in-cluster, then `default`). `keep_cache`: stop keeps the
        cache PVC. `delete_wait_s`: how long stop waits for the pods to go after the grace.
        `unschedulable_grace_s`: how long a pod may wait for a node before the launch has ended (None:
        $APPLIANCE_K8S_UNSCHEDULABLE_GRACE_S, else 300 s). `wall`: the clock the API's timestamps use."""
        self._api = api_client
        # This appliance's id: LABEL_INSTANCE on every object it applies; adopt() takes only
        # workloads that carry it (another appliance may use the namespace). None: unscoped.
        self.instance_id = instance_id
        self._namespace = namespace
        self._render = render
        self.keep_cache = keep_cache
        self._delete_wait_s = delete_wait_s
        self._clock = clock
        self._wall = wall
        self._unschedulable_grace_s = unschedulable_grace_s
        self._cpu: dict[str, tuple[float, float]] = {}  # launch id → (seconds so far, at)
        self._no_metrics = False

    # -- plumbing ----------------------------------------------------------------------------

    @property
    def api_client(self) -> k8s.ApiClient:
        if self._api is None:
            cfg = k8s.Configuration()
            try:
                _load_incluster(client_configuration=cfg)
            except ConfigException:
                try:
                    _load_kubeconfig(client_configuration=cfg)
                except (ConfigException, OSError) as exc:
                    raise RuntimeUnconfigured(
                        "kubernetes: no cluster configuration: not in a pod with a service account "
                        f"and no usable kubeconfig (KUBECONFIG or ~/.kube/config): {exc}") from exc
            self._api = k8s.ApiClient(cfg)
        return self._api

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api_client)

    @property
    def apps(self) -> k8s.AppsV1Api:
        return k8s.AppsV1Api(self.api_client)

    @property
    def namespace(self) -> str:
        if self._namespace is None:
            env = settings.current().k8s_namespace
            if env:
                self._namespace = env
            elif IN_CLUSTER_NAMESPACE.is_file():
                self._namespace = IN_CLUSTER_NAMESPACE.read_text().strip()
            else:
                self._namespace = "default"
        return self._namespace

    @property
    def unschedulable_grace_s(self) -> float:
        if self._unschedulable_grace_s is None:
            try:
                self._unschedulable_grace_s = settings.current().k8s_unschedulable_grace_s
            except settings.SettingsError as exc:
                raise EngineRuntimeError(f"kubernetes: {exc}") from None
        return self._unschedulable_grace_s

    def _exit(self, pods: Sequence[k8s.V1Pod]) -> ExitInfo | None:
        return launch_exit(pods, now=self._wall(), unschedulable_grace_s=self.unschedulable_grace_s)

    @contextmanager
    def _call(self, action: str, verb: str, resource: str, namespace: str,
              *, pass_not_found: bool = True) -> Iterator[None]:
        """API failures → EngineRuntimeError; 404 passes through (a state callers handle) unless told."""
        try:
            yield
        except ApiException as exc:
            if exc.status == 404 and pass_not_found:
                raise
            raise api_failure(action, exc, verb=verb, resource=resource, namespace=namespace) from exc
        except urllib3.exceptions.HTTPError as exc:
            raise EngineRuntimeError(f"kubernetes: cannot {action}: the API server is not reachable "
                                f"({exc.__class__.__name__})") from exc

    @staticmethod
    def parse_ref(handle: EngineHandle) -> tuple[str, str, str]:
        return _split_ref(handle.ref)

    def _pods(self, handle: EngineHandle) -> tuple[list[Any], str | None]:
        ns, _, _ = self.parse_ref(handle)
        selector = launch_selector(handle.launch_id)
        with self._call("list the launch's pods", "list", "pods", ns, pass_not_found=False):
            listed = self.core.list_namespaced_pod(ns, label_selector=selector)
        pods: list[Any] = sorted(listed.items or [], key=_created)
        return pods, listed.metadata.resource_version if listed.metadata else None

    def _pod_events(self, handle: EngineHandle, ns: str, version: str | None, left: float,
                    action: str) -> Iterator[tuple[str, Any]]:
        """One watch of the launch's pods from `version` for at most `left` seconds, server-side
        timed out: (event type, pod). Event-driven, not polled; the watch is closed however the
        caller leaves the loop."""
        watcher = _Watch()
        try:
            with self._call(action, "watch", "pods", ns, pass_not_found=False):
                for event in watcher.stream(
                    self.core.list_namespaced_pod, ns,
                    label_selector=launch_selector(handle.launch_id),
                    resource_version=version, timeout_seconds=max(1, math.ceil(left)),
                    _request_timeout=(10, left + 10),
                ):
                    yield event["type"], event["object"]
        finally:
            watcher.stop()

    def _workload(self, ns: str, kind: str, name: str) -> Any | None:
        read = self.apps.read_namespaced_deployment if kind == "Deployment" \
            else self.apps.read_namespaced_stateful_set
        resource = "deployments" if kind == "Deployment" else "statefulsets"
        try:
            with self._call(f"read {kind} {ns}/{name}", "get", f"{resource}.apps", ns):
                return read(name, ns)
        except ApiException:
            return None

    # -- start -------------------------------------------------------------------------------

    def start(self, spec: LaunchSpec, launch_id: str, engine_key: str | None = None) -> EngineHandle:
        key_secret = secret_name(launch_id)
        objects = sorted(self._render(spec, launch_id, key_secret),
                         key=lambda o: _APPLY_ORDER.get(str(o.get("kind")), 9))
        if self.instance_id is not None:
            objects = [self._with_instance(o) for o in objects]
        workloads = [o for o in objects if o.get("kind") in WORKLOAD_KINDS]
        if len(workloads) != 1:
            raise EngineRuntimeError(f"kubernetes: the manifests of {spec.recipe!r} hold {len(workloads)} "
                                "workloads; one Deployment or StatefulSet is expected")
        workload = workloads[0]
        ns = str(workload["metadata"].get("namespace") or self.namespace)
        name = str(workload["metadata"]["name"])
        for obj in objects:
            if obj.get("kind") in (*WORKLOAD_KINDS, "Service"):
                self._refuse_other_launch(obj, ns, launch_id)
        key = engine_key or recipe_key(spec)
        if not key:
            raise EngineRuntimeError(f"kubernetes: no engine key for launch {launch_id}: the pod's key file "
                                "comes from a Secret, and neither the controller nor the recipe gives one")
        self._create_secret(ns, engine_key_secret(spec, key, launch_id=launch_id, name=key_secret,
                                                  namespace=ns))
        for obj in objects:
            if obj.get("kind") == "PersistentVolumeClaim":
                self._create_if_absent(obj, ns)
            else:
                self._apply(obj, ns)
        log.info("applied %s (launch %s) as %s/%s/%s", spec.recipe, launch_id, ns,
                 workload["kind"], name)
        return EngineHandle(launch_id=launch_id, runtime=self.name, ref=f"{ns}/{workload['kind']}/{name}",
                            recipe=spec.recipe, spec_hash=spec.spec_hash, log_path=None,
                            started_at=time.time(), instance=self.instance_id)

    def _with_instance(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """`obj` with this instance's label (and exact annotation) on it and on a workload's pod
        template (not the selector: a Deployment's selector is immutable)."""
        assert self.instance_id is not None
        value = self.instance_id

        def mark(meta: Mapping[str, Any] | None) -> dict[str, Any]:
            meta = dict(meta or {})
            meta["labels"] = {**(meta.get("labels") or {}), LABEL_INSTANCE: label_value(value)}
            meta["annotations"] = {**(meta.get("annotations") or {}), LABEL_INSTANCE: value}
            return meta

        out = dict(obj)
        out["metadata"] = mark(obj.get("metadata"))
        spec = obj.get("spec")
        if obj.get("kind") in WORKLOAD_KINDS and isinstance(spec, Mapping) and "template" in spec:
            out["spec"] = {**spec, "template": {**spec["template"],
                                                "metadata": mark(spec["template"].get("metadata"))}}
        return out

    def _refuse_other_launch(self, obj: Mapping[str, Any], ns: str, launch_id: str) -> None:
        kind, name = str(obj["kind"]), str(obj["metadata"]["name"])
        if kind == "Service":
            try:
                with self._call(f"read Service {ns}/{name}", "get", "services", ns):
                    existing: Any = self.core.read_namespaced_service(name, ns)
            except ApiException:
                return
        else:
            existing = self._workload(ns, kind, name)
            if existing is None:
                return
        meta = existing.metadata
        owner = (meta.annotations or {}).get(LABEL_LAUNCH_ID) or _labels(existing).get(LABEL_LAUNCH_ID)
        if meta.deletion_timestamp is not None:
            raise EngineRuntimeError(f"kubernetes: {kind} {ns}/{name} of launch {owner} is still being "
                                "deleted; start again once it is gone")
        if owner != launch_id:
            raise EngineRuntimeError(
                f"kubernetes: {kind} {ns}/{name} already exists for launch {owner or '(not ours)'}; "
                "stop that launch first (the appliance never takes over another launch's workload)")

    def _create_secret(self, ns: str, body: dict[str, Any]) -> None:
        """Create the key Secret (immutable: a key is never edited in place). Never logged."""
        name = str(body["metadata"]["name"])
        body = {**body, "immutable": True}
        try:
            with self._call(f"create Secret {ns}/{name}", "create", "secrets", ns, pass_not_found=False):
                self.core.create_namespaced_secret(ns, _model(k8s.V1Secret, body))
        except EngineRuntimeError as exc:
            cause = exc.__cause__
            if not (isinstance(cause, ApiException) and cause.status == 409):
                raise
            # A retried start of the same launch: an immutable Secret is replaced, not patched.
            with self._call(f"replace Secret {ns}/{name}", "delete", "secrets", ns):
                self.core.delete_namespaced_secret(name, ns)
            with self._call(f"create Secret {ns}/{name}", "create", "secrets", ns, pass_not_found=False):
                self.core.create_namespaced_secret(ns, _model(k8s.V1Secret, body))

    def _create_if_absent(self, obj: Mapping[str, Any], ns: str) -> None:
        """Claims outlive launches (the warm cache): created once, never re-applied (a changed size
        or class would be an immutable-field error on a bound claim, not a launch failure)."""
        name = str(obj["metadata"]["name"])
        body = {**obj, "metadata": {**obj["metadata"], "namespace": ns}}
        try:
            with self._call(f"create PersistentVolumeClaim {ns}/{name}", "create",
                            "persistentvolumeclaims", ns, pass_not_found=False):
                self.core.create_namespaced_persistent_volume_claim(
                    ns, _model(k8s.V1PersistentVolumeClaim, body))
        except EngineRuntimeError as exc:
            cause = exc.__cause__
            if not (isinstance(cause, ApiException) and cause.status == 409):
                raise
            log.info("claim %s/%s exists: kept (warm cache)", ns, name)

    def _apply(self, obj: Mapping[str, Any], ns: str) -> None:
        kind, name = str(obj["kind"]), str(obj["metadata"]["name"])
        patch: dict[str, Callable[..., Any]] = {
            "Secret": self.core.patch_namespaced_secret,
            "ConfigMap": self.core.patch_namespaced_config_map,
            "PersistentVolumeClaim": self.core.patch_namespaced_persistent_volume_claim,
            "Service": self.core.patch_namespaced_service,
            "Deployment": self.apps.patch_namespaced_deployment,
            "StatefulSet": self.apps.patch_namespaced_stateful_set,
        }
        resources = {"Secret": "secrets", "ConfigMap": "configmaps",
                     "PersistentVolumeClaim": "persistentvolumeclaims", "Service": "services",
                     "Deployment": "deployments.apps", "StatefulSet": "statefulsets.apps"}
        if kind not in patch:
            raise EngineRuntimeError(f"kubernetes: the runtime cannot apply a {kind} ({name})")
        body = {**obj, "metadata": {**obj["metadata"], "namespace": ns}}
        with self._call(f"apply {kind} {ns}/{name}", "patch", resources[kind], ns, pass_not_found=False):
            patch[kind](name, ns, body, field_manager=FIELD_MANAGER, force=True,
                        _content_type="application/apply-patch+yaml")

    # -- state -------------------------------------------------------------------------------

    def inspect(self, handle: EngineHandle) -> ExitInfo:
        pods, _ = self._pods(handle)
        info = self._exit(pods)
        if info is not None:
            return info
        ns, kind, name = self.parse_ref(handle)
        if self._workload(ns, kind, name) is None:
            return ExitInfo(running=False, reason=f"{kind} {ns}/{name} no longer exists")
        return ExitInfo(running=True, oom_killed=False)  # the pod is not created yet

    def wait(self, handle: EngineHandle, timeout_s: float) -> ExitInfo:
        deadline = self._clock() + timeout_s
        ns, _, _ = self.parse_ref(handle)
        pods, version = self._pods(handle)
        info = self._exit(pods)
        if info is None:
            info = self.inspect(handle)
        if not info.running:
            return info
        current = {p.metadata.name: p for p in pods}
        while (left := deadline - self._clock()) > 0:
            try:
                for kind, pod in self._pod_events(handle, ns, version, left, "watch the launch's pods"):
                    version = pod.metadata.resource_version or version
                    if kind == "DELETED":
                        current.pop(pod.metadata.name, None)
                        if not current:
                            return ExitInfo(running=False, reason=f"pod {pod.metadata.name} deleted")
                        continue
                    current[pod.metadata.name] = pod
                    seen = self._exit(list(current.values()))
                    if seen is not None and not seen.running:
                        return seen
                    if self._clock() >= deadline:
                        break
            except EngineRuntimeError as exc:
                if not _expired(exc):
                    raise
                # 410 Gone: our resourceVersion fell out of the watch cache; list again, go on.
                pods, version = self._pods(handle)
                current = {p.metadata.name: p for p in pods}
                seen = self._exit(pods)
                if seen is not None and not seen.running:
                    return seen
        return self._exit(list(current.values())) or ExitInfo(running=True, oom_killed=False)

    def stop(self, handle: EngineHandle, grace_s: float) -> ExitInfo:
        ns, kind, name = self.parse_ref(handle)
        grace = max(0, math.ceil(grace_s))
        before = self._last_exit(handle)
        delete = self.apps.delete_namespaced_deployment if kind == "Deployment" \
            else self.apps.delete_namespaced_stateful_set
        resource = "deployments.apps" if kind == "Deployment" else "statefulsets.apps"
        opts = k8s.V1DeleteOptions(propagation_policy="Foreground", grace_period_seconds=grace)
        try:
            with self._call(f"delete {kind} {ns}/{name}", "delete", resource, ns):
                delete(name, ns, body=opts)
        except ApiException:
            pass  # already gone
        pods, _ = self._pods(handle)
        for pod in pods:
            try:
                with self._call(f"delete pod {ns}/{pod.metadata.name}", "delete", "pods", ns):
                    self.core.delete_namespaced_pod(pod.metadata.name, ns, body=k8s.V1DeleteOptions(
                        grace_period_seconds=grace))
            except ApiException:
                pass
        gone = self._wait_gone(handle, grace + self._delete_wait_s)
        gone = gone and self._wait_workload_gone(ns, kind, name, self._delete_wait_s)
        self._delete_launch_objects(handle, ns)
        self._cpu.pop(handle.launch_id, None)
        if not gone:
            log.warning("pods of launch %s still present after %ss", handle.launch_id,
                        grace + self._delete_wait_s)
            return ExitInfo(running=True, oom_killed=before.oom_killed, reason="pods still terminating")
        return before if not before.running else ExitInfo(running=False, reason="stopped")

    def _last_exit(self, handle: EngineHandle) -> ExitInfo:
        pods, _ = self._pods(handle)
        return self._exit(pods) or ExitInfo(running=False)

    def _wait_gone(self, handle: EngineHandle, timeout_s: float) -> bool:
        ns, _, _ = self.parse_ref(handle)
        deadline = self._clock() + timeout_s
        pods, version = self._pods(handle)
        names = {p.metadata.name for p in pods}
        while names and (left := deadline - self._clock()) > 0:
            for kind, pod in self._pod_events(handle, ns, version, left, "watch the launch's pods go"):
                version = pod.metadata.resource_version or version
                if kind == "DELETED":
                    names.discard(pod.metadata.name)
                else:
                    names.add(pod.metadata.name)
                if not names or self._clock() >= deadline:
                    break
        return not names

    def _wait_workload_gone(self, ns: str, kind: str, name: str, timeout_s: float) -> bool:
        """Foreground deletion keeps the workload (with a finalizer) until its pods are gone; the
        next launch of the recipe applies the same name, so it must be gone first."""
        deadline = self._clock() + timeout_s
        for _ in range(max(1, math.ceil(timeout_s / 0.5))):  # bounded even if the clock stands still
            if self._workload(ns, kind, name) is None:
                return True
            if self._clock() >= deadline:
                break
            time.sleep(0.5)
        return False

    def _delete_launch_objects(self, handle: EngineHandle, ns: str) -> None:
        """The launch's Secret and Service (by launch label); the recipe's claims too unless
        keep_cache (claims carry no launch id: they belong to the recipe, across launches)."""
        selector = launch_selector(handle.launch_id)
        groups: list[tuple[str, str, Callable[..., Any], Callable[..., Any]]] = [
            ("secrets", selector, self.core.list_namespaced_secret, self.core.delete_namespaced_secret),
            ("services", selector, self.core.list_namespaced_service, self.core.delete_namespaced_service),
        ]
        if not self.keep_cache:
            groups.append(("persistentvolumeclaims",
                           f"{LABEL_MANAGED}=true,{LABEL_RECIPE}={label_value(handle.recipe)}",
                           self.core.list_namespaced_persistent_volume_claim,
                           self.core.delete_namespaced_persistent_volume_claim))
        for resource, selector, lister, deleter in groups:
            with self._call(f"list the launch's {resource}", "list", resource, ns, pass_not_found=False):
                items = lister(ns, label_selector=selector).items or []
            for item in items:
                try:
                    with self._call(f"delete {resource} {ns}/{item.metadata.name}", "delete", resource, ns):
                        deleter(item.metadata.name, ns)
                except ApiException:
                    pass

    # -- logs, adoption, accounting ----------------------------------------------------------

    def read_logs(self, handle: EngineHandle, offset: int) -> tuple[str, int]:
        ns, _, _ = self.parse_ref(handle)
        pods, _ = self._pods(handle)
        if not pods:
            return "", offset
        pod = pods[0]  # the launch's first pod: the run the controller started
        statuses = (pod.status.container_statuses if pod.status else None) or []
        previous = bool(statuses and (statuses[0].restart_count or 0) > 0)
        container = pod.spec.containers[0].name if pod.spec and pod.spec.containers else None
        try:
            with self._call(f"read logs of pod {ns}/{pod.metadata.name}", "get", "pods/log", ns):
                resp = self.core.read_namespaced_pod_log(
                    pod.metadata.name, ns, container=container, previous=previous or None,
                    limit_bytes=offset + MAX_CHUNK_BYTES, _preload_content=False)
                blob = bytes(cast(Any, resp).data)
        except ApiException:
            return "", offset  # 404: the pod is gone
        except EngineRuntimeError as exc:
            cause = exc.__cause__
            if isinstance(cause, ApiException) and cause.status == 400:
                return "", offset  # "is waiting to start": no log yet
            raise
        return slice_log(blob, offset)

    def read_engine_key(self, handle: EngineHandle) -> str | None:
        return self.engine_key_at(handle.ref)

    def engine_key_at(self, ref: str) -> str | None:
        """The engine's key, read back from the Secret its pod mounts as the key file (or, for a
        workload an older controller applied, the Secret its VLLM_API_KEY refers to)."""
        ns, kind, wname = _split_ref(ref)
        workload = self._workload(ns, kind, wname)
        if workload is None:
            return None
        pod_spec = workload.spec.template.spec if workload.spec else None
        for volume in (pod_spec.volumes or []) if pod_spec else []:
            if volume.name == KEY_VOLUME and volume.secret is not None:
                text = self._secret_value(ns, str(volume.secret.secret_name), KEY_FILE_NAME)
                return key_from_config(text) if text is not None else None
        containers = pod_spec.containers if pod_spec else []
        for var in (containers[0].env or []) if containers else []:
            ref_ = var.value_from.secret_key_ref if var.name == ENGINE_KEY_ENV and var.value_from else None
            if ref_ is not None:
                return self._secret_value(ns, str(ref_.name), str(ref_.key))
        return None

    def _secret_value(self, ns: str, name: str, key: str) -> str | None:
        try:
            with self._call(f"read Secret {ns}/{name}", "get", "secrets", ns):
                secret = self.core.read_namespaced_secret(name, ns)
        except ApiException:
            return None
        value = (secret.data or {}).get(key)
        return base64.b64decode(value).decode() if value is not None else None

    def adopt(self) -> list[EngineHandle]:
        """Workloads labelled appliance.managed=true in the namespace. With no cluster configured at
        all this raises RuntimeUnconfigured: the registry leaves the runtime out quietly (most hosts
        have no cluster) and a kubernetes recipe is refused with that reason. A configured cluster
        that does not answer raises EngineRuntimeError (the registry reports it as a fault)."""
        _ = self.api_client
        ns = self.namespace
        selector = f"{LABEL_MANAGED}=true"
        found: list[tuple[str, Any]] = []
        with self._call("list managed deployments", "list", "deployments.apps", ns, pass_not_found=False):
            found += [("Deployment", d) for d in
                      self.apps.list_namespaced_deployment(
                          ns, label_selector=selector, _request_timeout=ADOPT_TIMEOUT_S).items or []]
        # Deployments only: the pure half renders nothing else (k8s/manifests.py says why), and
        # listing StatefulSets too would make RBAC for a kind never used a condition of adoption.
        handles: list[EngineHandle] = []
        for kind, obj in found:
            # Label values are sanitised; the pure half keeps the exact values in annotations.
            labels = {**_labels(obj), **(obj.metadata.annotations or {})}
            if LABEL_LAUNCH_ID not in labels:
                log.warning("%s %s has %s but no %s: not adopted", kind, obj.metadata.name,
                            LABEL_MANAGED, LABEL_LAUNCH_ID)
                continue
            if obj.metadata.deletion_timestamp is not None:
                continue  # being deleted: not running
            # Unlabelled (applied before instance ids): the driver adopts it only if it is on record.
            if self.instance_id is not None and labels.get(LABEL_INSTANCE) not in (None, self.instance_id):
                log.info("%s %s belongs to appliance instance %s, not this one: not adopted", kind,
                         obj.metadata.name, labels.get(LABEL_INSTANCE, "(none)"))
                continue
            handles.append(EngineHandle(
                launch_id=labels[LABEL_LAUNCH_ID], runtime=self.name,
                ref=f"{ns}/{kind}/{obj.metadata.name}", recipe=labels.get(LABEL_RECIPE, ""),
                spec_hash=labels.get(LABEL_SPEC_HASH, ""), log_path=None,
                started_at=_ts(obj.metadata.creation_timestamp), instance=labels.get(LABEL_INSTANCE)))
        return sorted(handles, key=lambda h: h.started_at)

    def engine_pids(self, handle: EngineHandle) -> list[int]:
        """Always []: the engine's processes live on a cluster node, in no PID namespace of ours."""
        return []

    def cpu_seconds(self, handle: EngineHandle) -> float:
        now = self._clock()
        total, at = self._cpu.get(handle.launch_id, (0.0, now))
        cores = None if self._no_metrics else self._usage_cores(handle)
        if cores is None:
            total += now - at  # no metrics: "always busy" (module docstring)
        else:
            total += cores * (now - at)
        self._cpu[handle.launch_id] = (total, now)
        return total

    def _usage_cores(self, handle: EngineHandle) -> float | None:
        """Cores in use now by the launch's running containers, from metrics.k8s.io. None — "count
        this interval as busy" — when no container runs yet (scheduling, a 10 GB image pull: the
        runtime's progress, not an engine stall), when no sample exists yet (metrics-server scrapes
        every 15–60 s), or when the metrics API is not served. Never raises: a stall guess must not
        break log following."""
        ns, _, _ = self.parse_ref(handle)
        pods, _ = self._pods(handle)
        running = [p for p in pods if any(cs.state is not None and cs.state.running is not None
                                          for cs in (p.status.container_statuses or []))]
        if not running:
            return None
        custom = k8s.CustomObjectsApi(self.api_client)
        cores, samples = 0.0, 0
        for pod in running:
            try:
                m: Any = custom.get_namespaced_custom_object("metrics.k8s.io", "v1beta1", ns, "pods",
                                                             pod.metadata.name)
            except ApiException as exc:
                if exc.status == 404 and "podmetrics" in str(exc.body or ""):
                    continue  # the API is served; this pod has no sample yet
                log.info("metrics.k8s.io not usable (HTTP %s): cpu_seconds falls back to wall time",
                         exc.status)
                self._no_metrics = exc.status in (403, 404, 503)  # absent or not granted: stop asking
                return None
            except urllib3.exceptions.HTTPError:
                return None
            samples += 1
            for c in m.get("containers") or []:
                cores += float(_parse_quantity(c.get("usage", {}).get("cpu", "0")))
        return cores if samples else None


def make(ctx: RuntimeContext) -> KubernetesRuntime:
    """The registry's constructor (controller/runtime/registry.py); the cluster is reached lazily."""
    return KubernetesRuntime(instance_id=ctx.instance_id)


def engine_key_of(ref: str) -> str | None:
    """The engine's key by ref (`namespace/Kind/name`), for the CLI."""
    return KubernetesRuntime().engine_key_at(ref)
