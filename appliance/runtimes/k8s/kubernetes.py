"""The Kubernetes runtime's pure half: a recipe that runs as one engine replica on a cluster.

Its effectful half is controller/runtime/kubernetes.py (the official `kubernetes` client), which applies
`manifests(spec, launch_id=…)` — the same objects `appliance recipes render NAME --format k8s` prints.
The pieces, each a small module beside this one:
- model.py: the recipe section (`runtime: {kind: kubernetes, image, namespace, cache, model,
  node_selector, …}`) and the LaunchSpec sub-model;
- spec.py: what the render reads from a spec (cluster options of any spec with an image, TP, model);
- names.py: object names and labels (sanitised to Kubernetes syntax);
- manifests.py: spec → PVCs, Deployment (why not a StatefulSet: its docstring), Service;
- needs.py: what Kubernetes cannot express (memlock, swap, swappiness, ACS, boot parameters, a
  LimitRange's memory limit) → YAML comments, lint findings and host-plan notes;
- helm.py: the same launch as vLLM production-stack Helm values;
- rbac.py: the controller's ServiceAccount, Role and RoleBinding for the recipe's namespace.

Both formats accept any spec with an image (docker and kubernetes recipes); a process recipe has none
and is refused unless the caller names one (`--image`, `render_with_image`).

Pure: no client, no I/O (import-linter's purity contract); `kubernetes` is imported only in controller/.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import yaml

from appliance.engine_secret import KEY_FILE_NAME
from appliance.recipe_terms import Finding
from appliance.runtimes.base import Format, FormatError, Placement, RuntimeTraits
from appliance.runtimes.k8s.helm import comment_lines as helm_comments
from appliance.runtimes.k8s.helm import helm_values, memory_request
from appliance.runtimes.k8s.manifests import (
    PROBE_PERIOD_S,
    engine_key_secret,
    manifests,
    startup_failure_threshold,
)
from appliance.runtimes.k8s.model import KubernetesLaunch, KubernetesSection
from appliance.runtimes.k8s.names import (
    ENGINE_KEY_ENV,
    dns_label,
    key_secret_name,
    label_value,
    labels,
    workload_name,
)
from appliance.runtimes.k8s.needs import LINT_RULES, needs, node_requirements
from appliance.runtimes.k8s.needs import comment_lines as needs_comments
from appliance.runtimes.k8s.rbac import DEFAULT_NAMESPACE as RBAC_DEFAULT_NAMESPACE
from appliance.runtimes.k8s.rbac import comment_lines as rbac_comments
from appliance.runtimes.k8s.rbac import namespace_of as rbac_namespace
from appliance.runtimes.k8s.rbac import rbac_manifests
from appliance.runtimes.k8s.spec import (
    ANY_ADDRESS,
    GPU_RESOURCE,
    K8sRenderError,
    cluster_target,
    gpu_resource,
)

if TYPE_CHECKING:
    from appliance.host_facts import HostFacts
    from appliance.recipe.launch_spec import LaunchSpec
    from appliance.recipe.recipe_model import Recipe


def _section(recipe: Recipe) -> KubernetesSection:
    section = recipe.runtime
    if not isinstance(section, KubernetesSection):
        raise TypeError(f"recipe {recipe.name!r} is not a kubernetes recipe ({section.kind})")
    return section


# -- render formats ----------------------------------------------------------------------------------

# Why-comments written above the first line of a key in the Deployment (see manifests' docstring).
_NOTES = {
    "command": "the recipe's command; --host is 0.0.0.0 in a pod (probes and the Service reach the pod IP, "
               "DOMAIN §5)",
    "env": "HIP_/CUDA_VISIBLE_DEVICES dropped: the device plugin assigns the cards. The engine key is a "
           "Secret mounted as vLLM's --config file, never in this file nor a VLLM_* variable (it would "
           "enter vLLM's compile-cache key)",
    "resources": "GPUs as extended resources, count = tensor_parallel_size; memory: a request, never a "
                 "limit (DOMAIN §3: a cgroup limit counts page cache)",
    "startupProbe": "failureThreshold × periodSeconds covers the recipe's ready budget (DOMAIN §4); "
                    "liveness starts only after it",
    "volumeMounts": "compile caches on a claim that outlives the pod (warm restarts, DOMAIN §4); the "
                    "model read-only; /dev/shm memory-backed",
    "hostIPC": "the recipe uses host IPC (RCCL/NCCL all-reduce through SHM, S12)",
    "strategy": "Recreate: the old pod frees its GPUs and the RWO cache claim before the new one starts",
    "nodeSelector": "the platform's GPU nodes (vendor node-labeller labels) unless the recipe names its own",
}


class _Dumper(yaml.SafeDumper):
    """Plain YAML: no `&id001` anchors for dicts the manifests share (labels, probes)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump(doc: Any) -> str:
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=200, allow_unicode=True)


def _annotate(text: str, notes: Mapping[str, str]) -> str:
    """Put each note as a comment above the first line that starts the key."""
    lines = text.splitlines()
    out: list[str] = []
    done: set[str] = set()
    for line in lines:
        m = re.match(r"^(\s*)(?:- )?([A-Za-z]+):", line)
        if m and m.group(2) in notes and m.group(2) not in done:
            done.add(m.group(2))
            out.append(f"{m.group(1)}# {notes[m.group(2)]}")
        out.append(line)
    return "\n".join(out) + "\n"


def k8s_text(spec: LaunchSpec, recipe: Recipe | None, *, image: str | None = None) -> str:
    """`render --format k8s`: multi-document YAML, with what the manifests cannot say as comments."""
    docs = manifests(spec, image=image, memory_request=memory_request(recipe))
    target = cluster_target(spec, image)
    budget = startup_failure_threshold(spec.ready_budget_s) * PROBE_PERIOD_S
    head = [
        f"# Kubernetes manifests for recipe '{spec.recipe}' (spec {spec.spec_hash}): one engine replica.",
        f"# Apply after creating the Secret '{key_secret_name(spec)}' with key {KEY_FILE_NAME} "
        "(a vLLM config file, 'api-key: KEY') "
        f"(the appliance's Kubernetes runtime does both).",
        f"# GPUs: {spec.tensor_parallel_size} × {gpu_resource(spec)}." if gpu_resource(spec) else
        "# GPUs: none (a CPU recipe).",
        f"# Start-up: the startup probe allows {budget} s ≥ the ready budget {spec.ready_budget_s} s "
        f"(the controller judges a slow start first).",
        f"# Image: {target.image_ref}.",
    ]
    requests = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"][
        "containers"][0]["resources"]["requests"]
    if "memory" not in requests:
        head.append("# No memory request (the recipe has no memory model): the pod is BestEffort, the first "
                    "the kubelet evicts under node memory pressure; give the recipe `memory:` or the "
                    "kubernetes section `memory_request`.")
    if image is not None:
        head.append(f"# The image was given with --image ({image}): the recipe runs as a process and names "
                    f"none; its paths under the appliance home refer to that host.")
    head += needs_comments(recipe) if recipe is not None else \
        ["# (the recipe was not given: its host needs are not listed here)"]
    parts = ["\n".join(head) + "\n"]
    for doc in docs:
        body = dump(doc)
        parts.append("---\n" + (_annotate(body, _NOTES) if doc["kind"] == "Deployment" else body))
    return "".join(parts)


def helm_text(spec: LaunchSpec, recipe: Recipe | None, *, image: str | None = None) -> str:
    """`render --format helm-values`: values for vLLM production-stack's chart."""
    values = helm_values(spec, recipe, image=image)
    return "\n".join(helm_comments(spec, recipe)) + "\n" + dump(values)


def _k8s(spec: LaunchSpec, recipe: Recipe | None) -> str:
    return k8s_text(spec, recipe)


def rbac_text(spec: LaunchSpec, recipe: Recipe | None) -> str:
    """`render --format k8s-rbac`: the controller's ServiceAccount, Role and RoleBinding."""
    named = rbac_namespace(spec)
    namespace = named or RBAC_DEFAULT_NAMESPACE
    parts = ["\n".join(rbac_comments(spec, namespace, named=named is not None)) + "\n"]
    parts += ["---\n" + dump(doc) for doc in rbac_manifests(namespace)]
    return "".join(parts)


def _helm(spec: LaunchSpec, recipe: Recipe | None) -> str:
    return helm_text(spec, recipe)


_WITH_IMAGE = {"k8s": k8s_text, "helm-values": helm_text}


def render_with_image(fmt: str, spec: LaunchSpec, recipe: Recipe | None, image: str) -> str:
    """A Kubernetes format for a spec with an image given by the caller (`render --image`): a
    process recipe has none of its own."""
    if fmt not in _WITH_IMAGE:
        raise FormatError(f"--image applies to --format {' / '.join(_WITH_IMAGE)}, not '{fmt}'")
    return _WITH_IMAGE[fmt](spec, recipe, image=image)


# -- the plug-in -------------------------------------------------------------------------------------


class KubernetesPlugin:
    kind = "kubernetes"
    section = KubernetesSection
    launch = KubernetesLaunch
    # The engine's limits are fixed where the pod is created (the node's container runtime), not
    # inherited from this controller — but not from the spec either: a pod has no ulimits, so this
    # host's admission cannot judge memlock; lint (k8s-memlock) and the host-plan notes say what the
    # node must give. The pod has a cgroup of its own; another node runs it (placement REMOTE).
    traits = RuntimeTraits(sets_own_memlock=True, own_cgroup=True, placement=Placement.REMOTE,
                           console_script=True)
    formats: Mapping[str, Format] = {"k8s": _k8s, "helm-values": _helm, "k8s-rbac": rbac_text}
    default_format = "k8s"
    lint_rules: tuple[str, ...] = (*LINT_RULES, "k8s-devices-vs-tp")

    def render_launch(self, recipe: Recipe, facts: HostFacts, root: str,
                      env: Mapping[str, str]) -> KubernetesLaunch:
        section = _section(recipe)
        data: dict[str, Any] = section.model_dump(exclude={"kind"})
        if data["memory_request"] is None:
            data["memory_request"] = memory_request(recipe)
        return KubernetesLaunch.model_validate(data)

    def listen(self, recipe: Recipe) -> str:
        return ANY_ADDRESS  # the pod IP: the kubelet's probes and the Service come from outside the pod

    def reach(self, recipe: Recipe) -> str:
        """The Service's cluster DNS name (the controller reaches it from inside the cluster, or through
        a port-forward the effectful half opens)."""
        ns = _section(recipe).namespace or "default"
        return f"{dns_label(f'appliance-{recipe.name}')}.{ns}.svc"

    def interpreter(self, recipe: Recipe, facts: HostFacts) -> str:
        return "python"  # in the image, the interpreter its environment puts first on PATH

    def workdir(self, recipe: Recipe, facts: HostFacts) -> str | None:
        return None

    def cache_key_inputs(self, recipe: Recipe) -> dict[str, object]:
        section = _section(recipe)
        return {"kind": self.kind, "image": section.image, "digest": section.digest}

    def lint(self, recipe: Recipe) -> list[Finding]:
        found = [Finding(rule=n.rule, severity="warning", field=n.field,
                         message=f"{n.message}; the node must provide: {n.node}", fact=n.fact)
                 for n in needs(recipe) if n.rule in LINT_RULES]
        if recipe.platform.value in GPU_RESOURCE and recipe.devices and len(recipe.devices) != recipe.workers:
            found.append(Finding(
                rule="k8s-devices-vs-tp", severity="info", field="devices",
                message=f"on a cluster the device plugin assigns {recipe.workers} card(s) "
                        f"(tensor_parallel_size); the recipe's devices {list(recipe.devices)} are not used",
                fact="DOMAIN §2: HIP_VISIBLE_DEVICES always explicit on a host; in a pod the plugin's "
                     "allocation is the explicit list"))
        return found

    def host_plan_notes(self, recipe: Recipe) -> list[str]:
        gpu = GPU_RESOURCE.get(recipe.platform.value)
        plugin = [f"the node needs a GPU device plugin advertising {gpu} (≥ {recipe.workers} on one node)"] \
            if gpu else []
        return plugin + node_requirements(recipe)

    def host_cache_dirs(self, spec: LaunchSpec) -> list[str]:
        return []  # the caches live on a cluster volume, nothing on this host


PLUGIN = KubernetesPlugin()

__all__ = ["ENGINE_KEY_ENV", "PLUGIN", "K8sRenderError", "KubernetesLaunch", "KubernetesSection",
           "engine_key_secret", "helm_values", "label_value", "labels", "manifests", "render_with_image",
           "workload_name"]
