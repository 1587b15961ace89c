"""`render --format k8s`: the Kubernetes runtime's manifests, validated offline against the Kubernetes
OpenAPI schemas (the `kubernetes-validate` package ships them; strict = unknown fields are errors) for
every shipped recipe. No cluster runs here: what a cluster would do with them is not tested.

Golden files: tests/fixtures/k8s/<recipe>.yaml (the whole `--format k8s` text). To regenerate after an
intended change: `APPLIANCE_REGEN_GOLDEN=1 pytest tests/unit/test_k8s_render.py` — that run writes the
files and skips; the next run compares. Review their diff like code.
"""

from __future__ import annotations

import os
import re
from typing import Any

import kubernetes_validate
import pytest
import yaml

from appliance.recipe.launch_spec import LaunchSpec
from appliance.recipe.lint import lint
from appliance.recipe.render import render
from appliance.runtimes.base import FormatError
from appliance.runtimes.k8s import kubernetes as k8s
from appliance.runtimes.k8s.manifests import startup_failure_threshold
from appliance.runtimes.k8s.model import LABEL_KEY_RE, LABEL_VALUE_RE
from appliance.runtimes.k8s.spec import DEVICE_ENV
from tests.unit.recipe_helpers import REPO, fixed_facts, shipped, with_changes

GOLDEN = REPO / "tests" / "fixtures" / "k8s"
REGEN = os.environ.get("APPLIANCE_REGEN_GOLDEN") == "1"
GOLDEN_RECIPES = ("gfx906-b-tp4-eager-k8s", "cuda-generic")
# The oldest Kubernetes the manifests must suit, and the newest whose schemas the package ships.
K8S_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
K8S_RECIPE = "gfx906-b-tp4-eager-k8s"
AN_IMAGE = "vllm/vllm-openai:v0.11.0"
LAUNCH_ID = "20261129T101500-gfx906-b-tp4-eager-k8s-3fa2c1"


def _launchable() -> list[str]:
    return sorted(n for n, r in shipped().items() if not r.abstract)


def _spec(name: str) -> LaunchSpec:
    return render(shipped()[name], fixed_facts())


def _has_image(name: str) -> bool:
    return getattr(_spec(name).runtime, "image", None) is not None


def _docs(name: str, launch_id: str = LAUNCH_ID, image: str | None = None) -> list[dict[str, Any]]:
    return k8s.manifests(_spec(name), launch_id=launch_id, image=image)


def _kind(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind)


def _container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    container: dict[str, Any] = _kind(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    return container


def _validate(doc: dict[str, Any]) -> None:
    for version in K8S_VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:  # the full message is pages of schema
            pytest.fail(f"{doc['kind']} {doc['metadata']['name']} invalid for Kubernetes {version}: "
                        f"{exc.message} at {list(exc.absolute_path)}")


@pytest.mark.parametrize("name", _launchable())
def test_every_shipped_recipe_renders_schema_valid_manifests(name: str) -> None:
    """Recipes with an image render as they are; process recipes with an image given (`--image`)."""
    image = None if _has_image(name) else AN_IMAGE
    docs = _docs(name, image=image)
    assert [d["kind"] for d in docs][-2:] == ["Deployment", "Service"]
    for doc in docs:
        _validate(doc)
    # and the text format parses back to the same objects
    text = k8s.render_with_image("k8s", _spec(name), shipped()[name], image) if image else \
        k8s.PLUGIN.formats["k8s"](_spec(name), shipped()[name])
    parsed = [d for d in yaml.safe_load_all(text) if d is not None]
    assert [d["kind"] for d in parsed] == [d["kind"] for d in docs]


@pytest.mark.parametrize("name", GOLDEN_RECIPES)
def test_k8s_render_matches_golden(name: str) -> None:
    got = k8s.PLUGIN.formats["k8s"](_spec(name), shipped()[name])
    path = GOLDEN / f"{name}.yaml"
    if REGEN:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(got)
        pytest.skip(f"regenerated {path}")
    assert path.exists(), f"no golden file {path}: run with APPLIANCE_REGEN_GOLDEN=1 once and review it"
    assert got == path.read_text()


def test_the_kubernetes_recipe_renders_a_kubernetes_launch() -> None:
    spec = _spec(K8S_RECIPE)
    assert spec.runtime.kind == "kubernetes"
    assert spec.argv[spec.argv.index("--host") + 1] == "0.0.0.0"  # the pod IP
    assert spec.host == "appliance-gfx906-b-tp4-eager-k8s.llm.svc"  # the Service, for the controller
    assert isinstance(spec.runtime, k8s.KubernetesLaunch)
    # S14d: B's RAM demand 4 × (4.52 + 0.19) + 3.1 + 2.62 = 24.56 GiB → a 25Gi request
    assert spec.runtime.memory_request == "25Gi"
    assert _container(_docs(K8S_RECIPE))["resources"]["requests"]["memory"] == "25Gi"
    docs = _docs(K8S_RECIPE)
    kinds = [d["kind"] for d in docs]
    # the model comes from an existing claim: only the cache claim is created
    assert kinds == ["PersistentVolumeClaim", "Deployment", "Service"]
    assert all(d["metadata"]["namespace"] == "llm" for d in docs)
    pod = _kind(docs, "Deployment")["spec"]["template"]["spec"]
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]
              if "persistentVolumeClaim" in v}
    assert claims == {"cache": "appliance-gfx906-b-tp4-eager-k8s-cache", "model": "qwen3-8-27b-w8a8"}


@pytest.mark.parametrize("budget", [60, 600, 900, 2700, 2701])
def test_startup_probe_covers_the_ready_budget(budget: int) -> None:
    """DOMAIN §4: a 900 s cold start must not be killed at 5 minutes; default graph needs ≥ 2700 s."""
    recipe = with_changes(shipped()["cuda-generic"], expect__ready_budget_s=budget)
    probe = _container(k8s.manifests(render(recipe, fixed_facts())))["startupProbe"]
    assert probe["failureThreshold"] * probe["periodSeconds"] >= budget
    assert probe["failureThreshold"] == startup_failure_threshold(budget)


@pytest.mark.parametrize("name", _launchable())
def test_startup_probe_of_every_shipped_recipe_covers_its_budget(name: str) -> None:
    probe = _container(_docs(name, image=None if _has_image(name) else AN_IMAGE))["startupProbe"]
    assert probe["failureThreshold"] * probe["periodSeconds"] >= shipped()[name].expect.ready_budget_s
    assert probe["httpGet"]["path"] == "/health"


@pytest.mark.parametrize(("name", "resource", "count"), [
    ("gfx906-b-tp4-eager", "amd.com/gpu", 4),
    ("gfx906-a-tp2-graph", "amd.com/gpu", 2),
    (K8S_RECIPE, "amd.com/gpu", 4),
    ("cuda-generic", "nvidia.com/gpu", 1),
])
def test_gpus_are_extended_resources_counted_from_tp(name: str, resource: str, count: int) -> None:
    container = _container(_docs(name))
    assert container["resources"]["limits"] == {resource: count}
    assert container["resources"]["requests"][resource] == count
    # The device plugin assigns the cards: the host indices are not passed. On gfx906 the variable is
    # still given, renumbered for the pod (seed 000 chapter 一 §8: never unset = every card).
    env = {e["name"]: e["value"] for e in container["env"] if e["name"] in DEVICE_ENV}
    cards = ",".join(str(i) for i in range(count))
    expected = {"HIP_VISIBLE_DEVICES": cards} if resource == "amd.com/gpu" else {}
    assert env == expected


def test_a_missing_memory_request_is_said() -> None:
    """Without a request the pod is BestEffort: evicted first on a memory-starved node (DOMAIN §3)."""
    assert "No memory request" in k8s.PLUGIN.formats["k8s"](_spec("cuda-generic"), shipped()["cuda-generic"])
    assert "No memory request" not in k8s.PLUGIN.formats["k8s"](_spec(K8S_RECIPE), shipped()[K8S_RECIPE])


def test_cpu_recipe_asks_for_no_gpu() -> None:
    container = _container(_docs("cpu-smollm2-docker"))
    assert "limits" not in container["resources"]
    assert not any("gpu" in key for key in container["resources"]["requests"])


@pytest.mark.parametrize("name", _launchable())
def test_no_memory_limit_ever(name: str) -> None:
    """DOMAIN §3: a cgroup memory limit counts page cache and kills TP=4 workers."""
    container = _container(_docs(name, image=None if _has_image(name) else AN_IMAGE))
    assert "memory" not in container["resources"].get("limits", {})


def test_the_engine_key_comes_from_a_secret_and_never_appears() -> None:
    secret = "eng_do-not-print-this-key-1234567890"
    recipe = shipped()["cuda-generic"]
    env = {**{n: v.value for n, v in recipe.env.vars.items()}, "VLLM_API_KEY": secret}
    recipe = with_changes(recipe, env__vars={n: {"value": v} for n, v in env.items()})
    spec = render(recipe, fixed_facts())
    assert spec.env["VLLM_API_KEY"] == secret
    docs = k8s.manifests(spec, launch_id=LAUNCH_ID)
    assert secret not in repr(docs)
    for fmt in ("k8s", "helm-values"):
        assert secret not in k8s.PLUGIN.formats[fmt](spec, recipe)
    # No VLLM_API_KEY at all (vLLM 0.26.0 hashes it into its compile-cache key): the key
    # is the Secret's vLLM config file, mounted and given with --config at one path.
    container = _container(docs)
    assert all(e["name"] != "VLLM_API_KEY" for e in container["env"])
    assert container["command"][-2:] == ["--config", "/run/appliance-engine/engine-key.yaml"]
    volumes = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["volumes"]
    items = [{"key": "engine-key.yaml", "path": "engine-key.yaml"}]
    assert {"name": "engine-key", "secret": {"secretName": "appliance-cuda-generic-engine-key",
            "defaultMode": 0o400, "items": items}} in volumes
    # the effectful half's Secret carries the key under the name the Deployment refers to
    made = k8s.engine_key_secret(spec, secret, launch_id=LAUNCH_ID)
    assert made["metadata"]["name"] == "appliance-cuda-generic-engine-key"
    assert made["stringData"] == {"engine-key.yaml": f"api-key: {secret}\n"}
    _validate(made)


def test_cache_env_paths_point_into_the_cache_claim() -> None:
    """Warm restarts across pods (DOMAIN §4): every pinned cache directory is on the claim, including the
    recipe's fixed Triton volume outside the variant root (DOMAIN §2)."""
    for name in ("gfx906-c-tp4-graph-piecewise", K8S_RECIPE, "cpu-smollm2-docker"):
        spec = _spec(name)
        container = _container(k8s.manifests(spec))
        on_claim = [m["mountPath"] for m in container["volumeMounts"] if m["name"] == "cache"]
        for path in spec.cache_dirs():
            assert any(path == p or path.startswith(p + "/") for p in on_claim), (name, path)


def test_shm_ipc_seccomp_and_node_selection_follow_the_recipe() -> None:
    pod = _kind(_docs("gfx906-c-tp4-graph-piecewise"), "Deployment")["spec"]["template"]["spec"]
    assert pod["hostIPC"] is True  # RCCL SHM (S12)
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}  # docker's 16g
    assert pod["containers"][0]["securityContext"] == {"seccompProfile": {"type": "Unconfined"}}
    assert pod["nodeSelector"]["amd.com/gpu.family"] == "AI"
    strategy = _kind(_docs("gfx906-c-tp4-graph-piecewise"), "Deployment")["spec"]["strategy"]
    assert strategy == {"type": "Recreate"}


def test_loopback_bind_becomes_the_pod_address() -> None:
    """cpu-smollm2-docker listens on 127.0.0.1 (host network); in a pod the kubelet and the Service
    reach the pod IP, so the engine must bind 0.0.0.0 (DOMAIN §5)."""
    spec = _spec("cpu-smollm2-docker")
    assert spec.argv[spec.argv.index("--host") + 1] == "127.0.0.1"
    command = _container(k8s.manifests(spec))["command"]
    assert command[command.index("--host") + 1] == "0.0.0.0"


def test_labels_are_label_syntax_and_find_the_launch_again() -> None:
    long_id = "20261129T101500-" + "a-very-long-recipe-name-" * 4 + "3fa2c1"
    docs = _docs(K8S_RECIPE, launch_id=long_id)
    for doc in docs:
        for key, value in doc["metadata"]["labels"].items():
            assert LABEL_KEY_RE.fullmatch(key) and LABEL_VALUE_RE.fullmatch(value), (key, value)
        if doc["kind"] != "PersistentVolumeClaim":
            assert doc["metadata"]["annotations"]["appliance.launch_id"] == long_id
    deployment = _kind(docs, "Deployment")
    assert deployment["metadata"]["labels"]["appliance.launch_id"] == k8s.label_value(long_id)
    assert deployment["spec"]["template"]["metadata"]["labels"]["appliance.managed"] == "true"
    # the claims outlive launches: no launch id on them
    assert all("appliance.launch_id" not in d["metadata"]["labels"]
               for d in docs if d["kind"] == "PersistentVolumeClaim")


@pytest.mark.parametrize("name", ["cpu-smollm2", "cuda-smollm2-graph"])
def test_process_recipes_are_refused_without_an_image(name: str) -> None:
    with pytest.raises(FormatError) as caught:
        k8s.PLUGIN.formats["k8s"](_spec(name), shipped()[name])
    message = str(caught.value)
    assert "--image" in message and name in message
    assert message.count(". ") == 0 and message.endswith(".")  # one sentence
    with pytest.raises(FormatError):
        k8s.PLUGIN.formats["helm-values"](_spec(name), shipped()[name])


def test_a_process_recipe_with_an_image_runs_the_image_python() -> None:
    spec = _spec("cuda-smollm2-graph")
    command = _container(k8s.manifests(spec, image=AN_IMAGE))["command"]
    assert command[0] == "python"
    assert _container(k8s.manifests(spec, image=AN_IMAGE))["image"] == AN_IMAGE


def test_not_expressible_needs_are_comments_findings_and_node_notes() -> None:
    recipe = shipped()["gfx906-c-tp4-graph-piecewise"]
    text = k8s.PLUGIN.formats["k8s"](_spec("gfx906-c-tp4-graph-piecewise"), recipe)
    for rule in ("k8s-memlock", "k8s-swap", "k8s-swappiness", "k8s-pcie-acs", "k8s-memory-limit",
                 "k8s-boot-params"):
        assert re.search(rf"^#  - \[{rule}\] host\.", text, re.M), rule
    k8s_recipe = shipped()[K8S_RECIPE]
    findings = {f.rule: f for f in lint(k8s_recipe)}
    memlock = findings["k8s-memlock"]
    assert memlock.field == "host.memlock_unlimited" and "S11f §10.1" in memlock.fact
    assert findings["k8s-memory-limit"].field == "host.no_cgroup_memory_limit"
    assert "DOMAIN §3" in findings["k8s-memory-limit"].fact
    assert not [f for f in lint(k8s_recipe) if f.severity == "error"]
    notes = k8s.PLUGIN.host_plan_notes(k8s_recipe)
    assert notes[0].startswith("the node needs a GPU device plugin advertising amd.com/gpu (≥ 4")
    assert any("LimitMEMLOCK=infinity" in n for n in notes)


def test_docker_only_options_are_findings_only_for_docker_sections() -> None:
    """group_add/device_paths have no pod twin: named in the k8s render of a docker recipe."""
    text = k8s.PLUGIN.formats["k8s"](_spec("gfx906-b-tp4-eager"), shipped()["gfx906-b-tp4-eager"])
    assert "[k8s-group-add] runtime.group_add" in text
    assert "[k8s-device-paths] runtime.device_paths: device nodes /dev/mkfd" in text
    assert "[k8s-group-add]" not in k8s.PLUGIN.formats["k8s"](_spec(K8S_RECIPE), shipped()[K8S_RECIPE])


def test_cli_renders_k8s_refuses_a_process_recipe_in_one_sentence_and_takes_image(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import typer
    from typer.testing import CliRunner

    from controller.cli import recipes_cmd
    from tests.unit.recipe_helpers import HOSTS, RECIPES_DIR

    monkeypatch.setenv("APPLIANCE_RECIPES", str(RECIPES_DIR))
    monkeypatch.setenv("APPLIANCE_HOME", "/var/lib/appliance")
    app = typer.Typer()
    recipes_cmd.register(app)
    runner = CliRunner()
    host = ["--host-root", str(HOSTS / "reference")]

    ok = runner.invoke(app, ["recipes", "render", K8S_RECIPE, *host])  # the kind's default: k8s
    assert ok.exit_code == 0 and [d["kind"] for d in yaml.safe_load_all(ok.stdout)][-1] == "Service"
    refused = runner.invoke(app, ["recipes", "render", "cuda-smollm2-graph", "-f", "k8s", *host])
    assert refused.exit_code == 2
    assert refused.stderr.count("\n") == 1 and "--image" in refused.stderr
    given = runner.invoke(app, ["recipes", "render", "cuda-smollm2-graph", "-f", "helm-values",
                                "--image", AN_IMAGE, *host])
    assert given.exit_code == 0
    (model,) = yaml.safe_load(given.stdout)["servingEngineSpec"]["modelSpec"]
    assert model["repository"] == "vllm/vllm-openai"
    wrong = runner.invoke(app, ["recipes", "render", "cuda-generic", "-f", "docker", "--image", "x", *host])
    assert wrong.exit_code == 2 and "--image applies to" in wrong.stderr


def test_every_section_option_renders_schema_valid() -> None:
    runtime = {
        "kind": "kubernetes", "image": "registry.example:5000/vllm", "digest": "sha256:" + "a" * 64,
        "namespace": "serving", "cache": {"claim": "shared-cache"},
        "model": {"size": "200Gi", "storage_class": "fast-ssd", "access_mode": "ReadOnlyMany",
                  "sub_path": "qwen"},
        "node_selector": {"example.com/pool": "gpu"},
        "tolerations": [{"key": "gpu", "operator": "Equal", "value": "yes", "effect": "NoSchedule"}],
        "shm_size": "8Gi", "host_ipc": False, "runtime_class": "nvidia", "service_type": "NodePort",
        "cpu_request": "6", "memory_request": "40Gi", "image_pull_secret": "regcred",
    }
    recipe = with_changes(shipped()["cuda-generic"], runtime=runtime, model__host_path=None)
    docs = k8s.manifests(render(recipe, fixed_facts()), launch_id=LAUNCH_ID)
    for doc in docs:
        _validate(doc)
    assert [d["kind"] for d in docs] == ["PersistentVolumeClaim", "Deployment", "Service"]
    claim = docs[0]["spec"]
    assert (claim["storageClassName"], claim["accessModes"]) == ("fast-ssd", ["ReadOnlyMany"])
    pod = docs[1]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"example.com/pool": "gpu"}  # replaces the platform default
    assert pod["containers"][0]["image"] == "registry.example:5000/vllm@sha256:" + "a" * 64
    assert pod["containers"][0]["resources"]["requests"]["cpu"] == "6"
    assert "hostIPC" not in pod
    assert next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "model")["subPath"] == "qwen"
    assert next(v for v in pod["volumes"] if v["name"] == "cache")["persistentVolumeClaim"] == {
        "claimName": "shared-cache"}
    assert docs[2]["spec"]["type"] == "NodePort"


@pytest.mark.parametrize(("storage", "message"), [
    ({"claim": "a", "size": "1Gi"}, "exactly one"),
    ({}, "exactly one"),
    ({"claim": "a", "storage_class": "x"}, "storage_class"),
    ({"size": "lots"}, "pattern"),
])
def test_storage_is_an_existing_claim_or_a_size(storage: dict[str, str], message: str) -> None:
    from pydantic import ValidationError

    from appliance.runtimes.k8s.model import Storage

    with pytest.raises(ValidationError, match=message):
        Storage.model_validate(storage)


def test_node_selector_must_be_labels() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="not a Kubernetes label"):
        k8s.KubernetesSection.model_validate({"image": "x", "node_selector": {"bad key!": "v"}})


def test_a_new_launch_mounts_the_same_cache_claim() -> None:
    """Warm restarts across launches (DOMAIN §4: C ready 230 s warm vs 352 s cold): the claim and its
    mount are the same objects whatever the launch id; only the workload's launch label changes."""
    first = _docs(K8S_RECIPE, launch_id="20261129T101500-b-000001")
    second = _docs(K8S_RECIPE, launch_id="20261130T080000-b-000002")
    assert first[0] == second[0] and first[0]["kind"] == "PersistentVolumeClaim"
    assert _container(first)["volumeMounts"] == _container(second)["volumeMounts"]
    assert _kind(first, "Deployment")["spec"]["selector"] == _kind(second, "Deployment")["spec"]["selector"]
    assert _kind(first, "Deployment")["metadata"]["labels"]["appliance.launch_id"] != \
        _kind(second, "Deployment")["metadata"]["labels"]["appliance.launch_id"]
