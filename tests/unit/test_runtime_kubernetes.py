"""KubernetesRuntime against recorded API responses at the client's HTTP seam (k8s_recorded.py).

The real `kubernetes` client runs above a scripted urllib3 pool: requests are checked (method, path,
query, order, body) and answered with recorded bodies from tests/fixtures/k8s_api/. What this does
not prove: that a real API server accepts the applied objects (the pure half's tests validate them
against the Kubernetes schemas) or how a real kubelet times things.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client as k8s

from appliance.recipe.launch_spec import LaunchSpec
from controller.runtime.base import EngineHandle, EngineRuntimeError, ExitInfo, RuntimeUnconfigured
from controller.runtime.kubernetes import KubernetesRuntime, pod_exit, secret_name
from tests.unit.k8s_recorded import FIXTURES, RecordedCluster, events, fixture, pod_list
from tests.unit.spec_helpers import launch_spec

LAUNCH = "20261130T101500-cpu-smollm2-3fa2c1"
NAME = "appliance-cpu-smollm2"  # the pure half's workload_name: one per recipe
SECRET = "appliance-20261130t101500-cpu-smollm2-3fa2c1-engine-key"  # per launch
NS = "llm"
KEY = "sk-launch-key-0001"  # what secret_key.json holds (base64)
PODS = rf"/api/v1/namespaces/{NS}/pods"
DEPLOY = rf"/apis/apps/v1/namespaces/{NS}/deployments/{NAME}"
SELECTOR = f"appliance.managed=true,appliance.launch_id={LAUNCH}"


def spec(**common: Any) -> LaunchSpec:
    fields: dict[str, Any] = {
        "recipe": "cpu-smollm2", "spec_hash": "0f3a9b2c7d1e4f56",
        "argv": ("vllm", "serve", "HuggingFaceTB/SmolLM2-135M-Instruct"),
        "env": {"VLLM_LOGGING_LEVEL": "INFO"}, "cache_root": "/cache/cpu-smollm2/v1",
        "ready_budget_s": 900, "stall_window_s": 300, "host": "appliance-cpu-smollm2.llm.svc",
    }
    return launch_spec("kubernetes", {"image": "vllm-cpu:0.11.0"}, **(fields | common))


@pytest.fixture
def cluster() -> RecordedCluster:
    return RecordedCluster()


def runtime(cluster: RecordedCluster, **kw: Any) -> KubernetesRuntime:
    return KubernetesRuntime(cluster.api_client(), namespace=NS, **kw)


def handle() -> EngineHandle:
    return EngineHandle(launch_id=LAUNCH, runtime="kubernetes", ref=f"{NS}/Deployment/{NAME}",
                        recipe="cpu-smollm2", spec_hash="0f3a9b2c7d1e4f56", started_at=0.0)


# -- start ---------------------------------------------------------------------------------------


def expect_free_names(cluster: RecordedCluster) -> None:
    cluster.expect("GET", rf"/api/v1/namespaces/{NS}/services/{NAME}", "status_404_service.json",
                   status=404)
    cluster.expect("GET", DEPLOY, "status_404_deployment.json", status=404)


def test_start_creates_the_secret_then_applies_in_order(
    cluster: RecordedCluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    expect_free_names(cluster)
    cluster.expect("POST", rf"/api/v1/namespaces/{NS}/secrets", "secret_key.json", status=201)
    claims = rf"/api/v1/namespaces/{NS}/persistentvolumeclaims"
    cluster.expect("POST", claims, echo=True, status=201)  # the cache claim: new
    cluster.expect("POST", claims, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                    "status": "Failure", "reason": "AlreadyExists", "code": 409,
                                    "message": "persistentvolumeclaims \"appliance-cpu-smollm2-model\" "
                                               "already exists",
                                    "details": {"name": "appliance-cpu-smollm2-model",
                                                "kind": "persistentvolumeclaims"}}, status=409)
    cluster.expect("PATCH", rf"/api/v1/namespaces/{NS}/services/{NAME}", echo=True,
                   query={"fieldManager": "appliance-controller", "force": "true"})
    cluster.expect("PATCH", DEPLOY, echo=True)
    h = runtime(cluster).start(spec(), LAUNCH, KEY)
    cluster.done()

    assert h.ref == f"{NS}/Deployment/{NAME}" and h.runtime == "kubernetes"
    secret = cluster.requests[2].json()
    assert secret["metadata"]["name"] == secret_name(LAUNCH) == SECRET
    assert secret["immutable"] is True and secret["stringData"] == {"engine-key.yaml": f"api-key: {KEY}\n"}
    assert secret["metadata"]["labels"]["appliance.launch_id"] == LAUNCH
    assert [r.json()["metadata"]["name"] for r in cluster.requests[3:5]] == [
        "appliance-cpu-smollm2-cache", "appliance-cpu-smollm2-model"]
    for req in cluster.requests[3:]:
        assert KEY not in (req.body or b"").decode()  # the manifests only name the Secret
        assert req.json()["metadata"]["namespace"] == NS
    for req in cluster.requests[5:]:
        assert req.headers["Content-Type"] == "application/apply-patch+yaml"
    deployment = cluster.requests[6].json()
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    # The key is vLLM's --config file from the Secret, never VLLM_API_KEY (vLLM 0.26.0
    # hashes that variable into its compile-cache key).
    assert all(e["name"] != "VLLM_API_KEY" for e in container["env"])
    assert container["command"][-2:] == ["--config", "/run/appliance-engine/engine-key.yaml"]
    mount = {"name": "engine-key", "mountPath": "/run/appliance-engine", "readOnly": True}
    assert mount in container["volumeMounts"]
    assert {"name": "engine-key", "secret": {"secretName": SECRET, "defaultMode": 0o400, "items": [
        {"key": "engine-key.yaml", "path": "engine-key.yaml"}]}} in pod["volumes"]
    assert KEY not in caplog.text


def test_start_puts_the_recipes_own_key_in_the_secret(cluster: RecordedCluster) -> None:
    """`launch_key` delivers no key when the recipe brings its own; the pod still needs its file."""
    expect_free_names(cluster)
    cluster.expect("POST", rf"/api/v1/namespaces/{NS}/secrets", "secret_key.json", status=201)
    for _ in range(2):
        cluster.expect("POST", rf"/api/v1/namespaces/{NS}/persistentvolumeclaims", echo=True, status=201)
    cluster.expect("PATCH", rf"/api/v1/namespaces/{NS}/services/{NAME}", echo=True)
    cluster.expect("PATCH", DEPLOY, echo=True)
    runtime(cluster).start(spec(env={"VLLM_API_KEY": "recipe-own-key"}), LAUNCH, None)
    assert cluster.requests[2].json()["stringData"] == {"engine-key.yaml": "api-key: recipe-own-key\n"}
    assert "recipe-own-key" not in (cluster.requests[6].body or b"").decode()


def test_start_without_any_key_is_refused(cluster: RecordedCluster) -> None:
    expect_free_names(cluster)
    with pytest.raises(EngineRuntimeError, match="no engine key"):
        runtime(cluster).start(spec(), LAUNCH, None)
    cluster.done()


def test_start_refuses_a_workload_of_another_launch(cluster: RecordedCluster) -> None:
    cluster.expect("GET", rf"/api/v1/namespaces/{NS}/services/{NAME}", "status_404_service.json",
                   status=404)
    cluster.expect("GET", DEPLOY, "deployment_other_launch.json")
    with pytest.raises(EngineRuntimeError, match="already exists for launch 20261129T220000"):
        runtime(cluster).start(spec(), LAUNCH, KEY)
    cluster.done()  # nothing created


def test_start_names_the_rbac_grant_on_403(cluster: RecordedCluster) -> None:
    expect_free_names(cluster)
    cluster.expect("POST", rf"/api/v1/namespaces/{NS}/secrets", "status_403_create_secrets.json",
                   status=403)
    with pytest.raises(EngineRuntimeError) as err:
        runtime(cluster).start(spec(), LAUNCH, KEY)
    msg = str(err.value)
    assert "`create` on `secrets`" in msg and "'llm'" in msg and "forbidden" in msg
    cluster.done()


def test_start_says_the_namespace_is_missing(cluster: RecordedCluster) -> None:
    expect_free_names(cluster)
    cluster.expect("POST", rf"/api/v1/namespaces/{NS}/secrets", "status_404_namespace.json",
                   status=404)
    with pytest.raises(EngineRuntimeError, match="namespace 'llm' does not exist"):
        runtime(cluster).start(spec(), LAUNCH, KEY)


def test_no_cluster_config_is_one_sentence(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    rt = KubernetesRuntime(namespace=NS)
    with pytest.raises(EngineRuntimeError, match="no cluster configuration"):
        rt.inspect(handle())
    with pytest.raises(EngineRuntimeError, match="no cluster configuration"):
        rt.start(spec(), LAUNCH, KEY)
    # Not configured is its own kind of refusal: the registry leaves the runtime out quietly.
    with pytest.raises(RuntimeUnconfigured, match="no cluster configuration"):
        rt.adopt()


def test_a_host_without_a_cluster_offers_no_kubernetes_runtime_and_says_why_on_apply(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from controller.runtime.registry import available_runtimes

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    runtimes, missing = available_runtimes(tmp_path, skip=("docker",))
    assert "kubernetes" not in runtimes and "process" in runtimes
    gap = missing["kubernetes"]
    assert not gap.fault and "no cluster configuration" in gap.reason  # not a warning at every start
    assert not missing["docker"].fault  # turned off by the operator


# -- state ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("pod", "expected"), [
    ("pod_running.json", ExitInfo(running=True, oom_killed=False)),
    ("pod_pending_new.json", ExitInfo(running=True, oom_killed=False)),
    ("pod_terminated_oomkilled.json",
     ExitInfo(running=False, exit_code=137, signal=9, oom_killed=True, reason="OOMKilled")),
    ("pod_restarted_error.json",
     ExitInfo(running=False, exit_code=1, signal=None, oom_killed=False, reason="Error")),
])
def test_inspect_reads_the_pod(cluster: RecordedCluster, pod: str, expected: ExitInfo) -> None:
    cluster.expect("GET", PODS, pod_list(fixture(pod)), query={"labelSelector": SELECTOR})
    assert runtime(cluster).inspect(handle()) == expected
    cluster.done()


def test_crashloop_after_oom_is_an_ended_oom(cluster: RecordedCluster) -> None:
    cluster.expect("GET", PODS, pod_list(fixture("pod_crashloop_oomkilled.json")))
    info = runtime(cluster).inspect(handle())
    assert (info.running, info.exit_code, info.signal, info.oom_killed) == (False, 137, 9, True)
    assert info.reason is not None and info.reason.startswith("CrashLoopBackOff: back-off 40s")
    assert "last run: OOMKilled with code 137" in info.reason


# The recorded pod's PodScheduled=False lastTransitionTime (2026-11-30T10:15:02Z), in wall seconds.
UNSCHEDULABLE_SINCE = datetime(2026, 11, 30, 10, 15, 2, tzinfo=UTC).timestamp()


def test_unschedulable_past_the_grace_carries_the_scheduler_message(cluster: RecordedCluster) -> None:
    cluster.expect("GET", PODS, pod_list(fixture("pod_pending_unschedulable.json")))
    info = runtime(cluster, wall=lambda: UNSCHEDULABLE_SINCE + 301).inspect(handle())
    assert not info.running and info.exit_code is None
    assert info.reason is not None
    assert info.reason.startswith("Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu")
    assert info.reason.endswith("(unschedulable for 301 s, past the 300 s grace)")


def test_unschedulable_inside_the_grace_is_still_starting(cluster: RecordedCluster) -> None:
    """A cluster autoscaler answers a pending GPU pod by adding a node: minutes, not a failure."""
    cluster.expect("GET", PODS, pod_list(fixture("pod_pending_unschedulable.json")))
    info = runtime(cluster, wall=lambda: UNSCHEDULABLE_SINCE + 30).inspect(handle())
    assert info.running and info.reason is not None
    assert info.reason.startswith("Unschedulable: 0/3 nodes are available")
    assert "pending 30 s of a 300 s grace" in info.reason


def test_a_zero_grace_ends_an_unschedulable_launch_at_once(cluster: RecordedCluster) -> None:
    cluster.expect("GET", PODS, pod_list(fixture("pod_pending_unschedulable.json")))
    rt = runtime(cluster, unschedulable_grace_s=0.0, wall=lambda: UNSCHEDULABLE_SINCE)
    info = rt.inspect(handle())
    assert not info.running and "grace" not in (info.reason or "")


def test_the_grace_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, cluster: RecordedCluster,
) -> None:
    monkeypatch.setenv("APPLIANCE_K8S_UNSCHEDULABLE_GRACE_S", "900")
    rt = runtime(cluster, wall=lambda: UNSCHEDULABLE_SINCE + 600)
    cluster.expect("GET", PODS, pod_list(fixture("pod_pending_unschedulable.json")))
    assert rt.unschedulable_grace_s == 900.0 and rt.inspect(handle()).running
    for bad in ("five minutes", "-1", "inf", "nan"):
        monkeypatch.setenv("APPLIANCE_K8S_UNSCHEDULABLE_GRACE_S", bad)
        with pytest.raises(EngineRuntimeError, match=r"UNSCHEDULABLE_GRACE_S=.* is not a number of seconds"):
            _ = runtime(cluster).unschedulable_grace_s


def test_wait_ends_an_unschedulable_launch_when_its_grace_runs_out(cluster: RecordedCluster) -> None:
    # No event comes while a pod waits for a node: the watch ends quietly at its deadline, and the
    # state is judged again with the wall clock past the grace.
    walls = iter([UNSCHEDULABLE_SINCE + 290])
    ticks = iter([0.0, 0.0, 15.0])
    cluster.expect("GET", PODS, pod_list(fixture("pod_pending_unschedulable.json")))
    cluster.expect("GET", PODS, b"", query={"watch": "true", "timeoutSeconds": "15"})
    rt = runtime(cluster, clock=lambda: next(ticks, 15.0),
                 wall=lambda: next(walls, UNSCHEDULABLE_SINCE + 305))
    info = rt.wait(handle(), 15.0)
    assert not info.running and "past the 300 s grace" in (info.reason or "")
    cluster.done()


def test_image_pull_backoff_is_an_error_to_show(cluster: RecordedCluster) -> None:
    cluster.expect("GET", PODS, pod_list(fixture("pod_imagepullbackoff.json")))
    info = runtime(cluster).inspect(handle())
    assert not info.running and info.reason is not None
    assert info.reason.startswith("ImagePullBackOff: Back-off pulling image")


def test_no_pod_and_no_deployment_is_ended(cluster: RecordedCluster) -> None:
    cluster.expect("GET", PODS, pod_list())
    cluster.expect("GET", DEPLOY, "status_404_deployment.json", status=404)
    info = runtime(cluster).inspect(handle())
    assert not info.running and "no longer exists" in (info.reason or "")


def test_no_pod_yet_is_starting(cluster: RecordedCluster) -> None:
    cluster.expect("GET", PODS, pod_list())
    cluster.expect("GET", DEPLOY, "deployment.json")
    assert runtime(cluster).inspect(handle()).running


def test_pod_exit_from_a_model_built_in_code() -> None:
    """The same mapping on a client-side model (what a watch event deserialises into)."""
    pod = k8s.V1Pod(status=k8s.V1PodStatus(phase="Failed", reason="Evicted",
                                           message="The node was low on resource: memory."))
    info = pod_exit(pod)
    assert not info.running and info.reason == "Failed: Evicted: The node was low on resource: memory."


# -- wait (watch) --------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_wait_returns_on_the_watch_event_that_ends_it(cluster: RecordedCluster) -> None:
    cluster.expect("GET", PODS, pod_list(fixture("pod_running.json"), resource_version="481600"))
    cluster.expect("GET", PODS, events(("MODIFIED", fixture("pod_running.json")),
                                       ("MODIFIED", fixture("pod_terminated_oomkilled.json"))),
                   query={"watch": "true", "resourceVersion": "481600", "labelSelector": SELECTOR,
                          "timeoutSeconds": "30"})
    info = runtime(cluster, clock=FakeClock()).wait(handle(), 30.0)
    assert (info.running, info.exit_code, info.oom_killed) == (False, 137, True)
    cluster.done()


def test_wait_times_out_running_when_the_watch_ends_quietly(cluster: RecordedCluster) -> None:
    # The server ends the watch at timeoutSeconds with no event; by then the deadline has passed.
    ticks = iter([0.0, 0.0, 5.0])
    cluster.expect("GET", PODS, pod_list(fixture("pod_running.json")))
    cluster.expect("GET", PODS, b"", query={"watch": "true", "timeoutSeconds": "5"})
    rt = runtime(cluster, clock=lambda: next(ticks, 5.0))
    assert rt.wait(handle(), 5.0) == ExitInfo(running=True, oom_killed=False)
    cluster.done()


def test_wait_rewatches_until_the_deadline(cluster: RecordedCluster) -> None:
    ticks = iter([0.0, 0.0, 1.0, 4.0, 9.0])
    cluster.expect("GET", PODS, pod_list(fixture("pod_running.json"), resource_version="481600"))
    cluster.expect("GET", PODS, events(("MODIFIED", fixture("pod_restarted_error.json") | {
        "status": fixture("pod_running.json")["status"]})), query={"timeoutSeconds": "9"})
    cluster.expect("GET", PODS, b"", query={"timeoutSeconds": "5", "resourceVersion": "481655"})
    rt = runtime(cluster, clock=lambda: next(ticks, 9.0))
    assert rt.wait(handle(), 9.0).running
    cluster.done()


def test_wait_relists_when_the_watch_expires(cluster: RecordedCluster) -> None:
    expired = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": "too old resource version: 481600 (481900)", "reason": "Expired", "code": 410}
    cluster.expect("GET", PODS, pod_list(fixture("pod_running.json"), resource_version="481600"))
    cluster.expect("GET", PODS, events(("ERROR", expired)), query={"resourceVersion": "481600"})
    cluster.expect("GET", PODS, pod_list(fixture("pod_crashloop_oomkilled.json"), resource_version="481905"))
    info = runtime(cluster, clock=FakeClock()).wait(handle(), 30.0)
    assert (info.running, info.oom_killed) == (False, True)
    cluster.done()


def test_wait_sees_the_pod_deleted(cluster: RecordedCluster) -> None:
    cluster.expect("GET", PODS, pod_list(fixture("pod_running.json")))
    cluster.expect("GET", PODS, events(("DELETED", fixture("pod_running.json"))))
    info = runtime(cluster, clock=FakeClock()).wait(handle(), 30.0)
    assert not info.running and "deleted" in (info.reason or "")


def test_wait_returns_at_once_for_an_ended_engine(cluster: RecordedCluster) -> None:
    cluster.expect("GET", PODS, pod_list(fixture("pod_crashloop_oomkilled.json")))
    assert runtime(cluster).wait(handle(), 30.0).oom_killed is True
    cluster.done()  # no watch opened


# -- logs ----------------------------------------------------------------------------------------


def test_logs_by_byte_offset(cluster: RecordedCluster) -> None:
    log_name = "engine_log.txt"
    blob = (FIXTURES / log_name).read_bytes()
    cut = blob.index("été".encode()) + 1  # mid-character: the first read stops before it
    pod = rf"{PODS}/appliance-cpu-smollm2-7d9c6b5f4-x2kqp/log"
    rt = runtime(cluster)
    cluster.expect("GET", PODS, pod_list(fixture("pod_running.json")))
    cluster.expect("GET", pod, blob[:cut], query={"container": "engine", "limitBytes": str(4 * 1024 * 1024)})
    text, offset = rt.read_logs(handle(), 0)
    assert offset == cut - 1 and text.endswith("— ")
    cluster.expect("GET", PODS, pod_list(fixture("pod_running.json")))
    cluster.expect("GET", pod, blob, query={"limitBytes": str(offset + 4 * 1024 * 1024)})
    text2, offset2 = rt.read_logs(handle(), offset)
    assert offset2 == len(blob) and (text + text2).encode() == blob
    assert "previous" not in cluster.requests[-1].query
    cluster.done()


def test_logs_of_a_restarted_container_are_the_previous_run(cluster: RecordedCluster) -> None:
    cluster.expect("GET", PODS, pod_list(fixture("pod_crashloop_oomkilled.json")))
    cluster.expect("GET", rf"{PODS}/.*/log", b"Loading weights\nKilled\n", query={"previous": "true"})
    assert runtime(cluster).read_logs(handle(), 0) == ("Loading weights\nKilled\n", 23)


def test_logs_of_a_container_not_started_yet_are_empty(cluster: RecordedCluster) -> None:
    cluster.expect("GET", PODS, pod_list(fixture("pod_pending_new.json")))
    cluster.expect("GET", rf"{PODS}/.*/log", "status_400_log_waiting.json", status=400)
    assert runtime(cluster).read_logs(handle(), 7) == ("", 7)


def test_logs_forbidden_names_pods_log(cluster: RecordedCluster) -> None:
    body = fixture("status_403_create_secrets.json") | {"message": "pods \"x\" is forbidden: User "
                                                        "\"system:serviceaccount:llm:appliance\" cannot get "
                                                        "resource \"pods/log\" in API group \"\""}
    cluster.expect("GET", PODS, pod_list(fixture("pod_running.json")))
    cluster.expect("GET", rf"{PODS}/.*/log", body, status=403)
    with pytest.raises(EngineRuntimeError, match="`get` on `pods/log`"):
        runtime(cluster).read_logs(handle(), 0)


# -- stop ----------------------------------------------------------------------------------------


def test_stop_deletes_with_grace_waits_for_the_pods_and_keeps_the_cache(cluster: RecordedCluster) -> None:
    running = fixture("pod_running.json")
    cluster.expect("GET", PODS, pod_list(running))  # the state before stopping
    cluster.expect("DELETE", DEPLOY, "status_success_delete.json")
    cluster.expect("GET", PODS, pod_list(running))
    cluster.expect("DELETE", rf"{PODS}/{running['metadata']['name']}", running)
    cluster.expect("GET", PODS, pod_list(running, resource_version="481700"))
    cluster.expect("GET", PODS, events(("MODIFIED", running), ("DELETED", running)),
                   query={"watch": "true", "resourceVersion": "481700"})
    cluster.expect("GET", DEPLOY, "status_404_deployment.json", status=404)  # finalizer done
    cluster.expect("GET", rf"/api/v1/namespaces/{NS}/secrets", {"kind": "SecretList", "apiVersion": "v1",
                   "metadata": {}, "items": [fixture("secret_key.json")]}, query={"labelSelector": SELECTOR})
    cluster.expect("DELETE", rf"/api/v1/namespaces/{NS}/secrets/{SECRET}", "status_success_delete.json")
    service = {"metadata": {"name": NAME, "namespace": NS, "labels": {
        "appliance.managed": "true", "appliance.launch_id": LAUNCH}},
        "spec": {"selector": {"appliance.managed": "true", "appliance.recipe": "cpu-smollm2"},
                 "ports": [{"name": "http", "port": 8000, "targetPort": 8000}]}}
    cluster.expect("GET", rf"/api/v1/namespaces/{NS}/services", {"kind": "ServiceList", "apiVersion": "v1",
                   "metadata": {}, "items": [service]}, query={"labelSelector": SELECTOR})
    # DELETE of a Service answers with the Service (API reference: 200 Service), not a Status.
    cluster.expect("DELETE", rf"/api/v1/namespaces/{NS}/services/{NAME}",
                   {"kind": "Service", "apiVersion": "v1", **service})
    info = runtime(cluster, clock=FakeClock()).stop(handle(), 12.5)
    cluster.done()  # the launch's Secret and Service deleted; no PVC listed or deleted
    assert info == ExitInfo(running=False, reason="stopped")
    dep_delete = cluster.requests[1].json()
    assert dep_delete["propagationPolicy"] == "Foreground" and dep_delete["gracePeriodSeconds"] == 13
    assert cluster.requests[3].json()["gracePeriodSeconds"] == 13


def test_stop_of_a_gone_launch_is_quiet_and_drops_the_cache_when_asked(cluster: RecordedCluster) -> None:
    cluster.expect("GET", PODS, pod_list())
    cluster.expect("DELETE", DEPLOY, "status_404_deployment.json", status=404)
    cluster.expect("GET", PODS, pod_list())
    cluster.expect("GET", PODS, pod_list())
    cluster.expect("GET", DEPLOY, "status_404_deployment.json", status=404)
    for res in ("secrets", "services"):
        cluster.expect("GET", rf"/api/v1/namespaces/{NS}/{res}", {"metadata": {}, "items": []},
                       query={"labelSelector": SELECTOR})
    claims = rf"/api/v1/namespaces/{NS}/persistentvolumeclaims"
    cluster.expect("GET", claims, {"kind": "PersistentVolumeClaimList", "apiVersion": "v1", "metadata": {},
                                   "items": [{"metadata": {"name": "appliance-cpu-smollm2-cache"}}]},
                   query={"labelSelector": "appliance.managed=true,appliance.recipe=cpu-smollm2"})
    cluster.expect("DELETE", f"{claims}/appliance-cpu-smollm2-cache", {"kind": "PersistentVolumeClaim"})
    info = runtime(cluster, keep_cache=False).stop(handle(), 5)
    assert not info.running
    cluster.done()


# -- adopt, key, pids, cpu -----------------------------------------------------------------------


def test_adopt_lists_managed_workloads_by_label(cluster: RecordedCluster) -> None:
    cluster.expect("GET", rf"/apis/apps/v1/namespaces/{NS}/deployments", "deployment_list_managed.json",
                   query={"labelSelector": "appliance.managed=true"})
    handles = runtime(cluster).adopt()
    assert [h.launch_id for h in handles] == ["20261129T220000-cpu-smollm2-aa11bb", LAUNCH]  # by age
    assert handles[1].ref == f"{NS}/Deployment/{NAME}" and handles[1].recipe == "cpu-smollm2"
    assert handles[1].spec_hash == "0f3a9b2c7d1e4f56"
    cluster.done()


def test_adopt_leaves_out_another_instances_workloads_and_hands_on_unlabelled_ones(
    cluster: RecordedCluster,
) -> None:
    """The recorded workloads carry no instance label (applied before instance ids): they are handed
    to the driver marked so (instance None), which adopts them only when they are on its own record;
    a workload labelled with another appliance's id is never returned."""
    cluster.expect("GET", rf"/apis/apps/v1/namespaces/{NS}/deployments", "deployment_list_managed.json",
                   query={"labelSelector": "appliance.managed=true"})
    unlabelled = runtime(cluster, instance_id="i-mine").adopt()
    assert len(unlabelled) == 2 and all(h.instance is None for h in unlabelled)
    cluster.done()


def test_applied_objects_carry_the_instance_label_on_the_workload_and_its_pods() -> None:
    rt = KubernetesRuntime(k8s.ApiClient(), namespace=NS, instance_id="i-mine")
    deployment: dict[str, Any] = {"kind": "Deployment", "metadata": {"name": NAME, "labels": {"a": "b"}},
                  "spec": {"selector": {"matchLabels": {"a": "b"}},
                           "template": {"metadata": {"labels": {"a": "b"}}, "spec": {}}}}
    out = rt._with_instance(deployment)
    assert out["metadata"]["labels"] == {"a": "b", "appliance.instance": "i-mine"}
    assert out["spec"]["template"]["metadata"]["labels"]["appliance.instance"] == "i-mine"
    assert out["spec"]["selector"] == {"matchLabels": {"a": "b"}}  # immutable: untouched
    assert deployment["metadata"]["labels"] == {"a": "b"}  # the rendered object is not changed


def test_engine_key_is_read_back_through_the_workloads_key_file_secret(cluster: RecordedCluster) -> None:
    cluster.expect("GET", DEPLOY, "deployment_keyfile.json")
    cluster.expect("GET", rf"/api/v1/namespaces/{NS}/secrets/{SECRET}", "secret_keyfile.json")
    assert runtime(cluster).read_engine_key(handle()) == KEY
    cluster.done()


def test_engine_key_of_a_workload_applied_before_issue_19_is_read_through_its_secret_ref(
    cluster: RecordedCluster,
) -> None:
    cluster.expect("GET", DEPLOY, "deployment.json")
    cluster.expect("GET", rf"/api/v1/namespaces/{NS}/secrets/{SECRET}", "secret_key.json")
    assert runtime(cluster).read_engine_key(handle()) == KEY
    cluster.done()


def test_engine_key_of_a_deleted_workload_is_unknown(cluster: RecordedCluster) -> None:
    cluster.expect("GET", DEPLOY, "status_404_deployment.json", status=404)
    assert runtime(cluster).read_engine_key(handle()) is None


def test_engine_pids_are_never_this_hosts() -> None:
    assert KubernetesRuntime().engine_pids(handle()) == []


def test_cpu_seconds_integrates_pod_metrics(cluster: RecordedCluster) -> None:
    clock = FakeClock()
    rt = runtime(cluster, clock=clock)
    metrics = r"/apis/metrics.k8s.io/v1beta1/namespaces/llm/pods/.*"
    cluster.expect("GET", PODS, pod_list(fixture("pod_running.json")))
    cluster.expect("GET", metrics, "podmetrics.json")
    assert rt.cpu_seconds(handle()) == 0.0
    clock.now = 10.0
    cluster.expect("GET", PODS, pod_list(fixture("pod_running.json")))
    cluster.expect("GET", metrics, "podmetrics.json")
    assert rt.cpu_seconds(handle()) == pytest.approx(19.84310562)  # 1.984 cores for 10 s


def test_cpu_seconds_without_metrics_api_always_advances(cluster: RecordedCluster) -> None:
    """No metrics.k8s.io: CPU reads as busy (wall time), so the stall rule never fires on a guess."""
    clock = FakeClock()
    rt = runtime(cluster, clock=clock)
    cluster.expect("GET", PODS, pod_list(fixture("pod_running.json")))
    cluster.expect("GET", r"/apis/metrics.k8s.io/.*", "status_404_podmetrics_no_api.json", status=404)
    first = rt.cpu_seconds(handle())
    clock.now = 7.0
    assert rt.cpu_seconds(handle()) - first == 7.0
    cluster.done()  # the second call asked nothing: the API is known absent


def test_cpu_seconds_counts_a_pod_not_running_yet_as_busy(cluster: RecordedCluster) -> None:
    """An image pull or scheduling is the runtime's progress: the stall rule must not fire on it."""
    clock = FakeClock()
    rt = runtime(cluster, clock=clock)
    for _ in range(2):
        cluster.expect("GET", PODS, pod_list(fixture("pod_pending_new.json")))
    first = rt.cpu_seconds(handle())
    clock.now = 30.0
    assert rt.cpu_seconds(handle()) - first == 30.0
    cluster.done()  # no metrics asked for a pod with no running container


def test_cpu_seconds_of_an_idle_engine_does_not_advance(cluster: RecordedCluster) -> None:
    """With metrics served, an engine using no CPU reads as no progress (the stall rule can fire)."""
    idle = fixture("podmetrics.json")
    idle["containers"][0]["usage"]["cpu"] = "0"
    clock = FakeClock()
    rt = runtime(cluster, clock=clock)
    for _ in range(2):
        cluster.expect("GET", PODS, pod_list(fixture("pod_running.json")))
        cluster.expect("GET", r"/apis/metrics.k8s.io/v1beta1/namespaces/llm/pods/.*", idle)
    first = rt.cpu_seconds(handle())
    clock.now = 30.0
    assert rt.cpu_seconds(handle()) == first
