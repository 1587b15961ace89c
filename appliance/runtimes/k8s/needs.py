"""What a recipe needs that a Kubernetes manifest cannot say. Pure.

A pod spec has no ulimits, no swap, no node-level sysctls, no PCIe or boot settings, and cannot
forbid a memory limit that a namespace LimitRange injects at admission. Each such need becomes one
`Need`: a YAML comment in `render --format k8s`, a lint finding (field + rule + fact) for a kubernetes
recipe, and a line of the host plan naming what the node must have.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from appliance.recipe.recipe_model import Recipe

# The rules `needs` produces from the recipe's host requirements: lint findings of a kubernetes recipe
# (listed with the generic lint rules in appliance/recipe/lint.py). The docker-only ones (k8s-group-add,
# k8s-device-paths) appear only as comments when a docker recipe is rendered for a cluster.
LINT_RULES = ("k8s-memlock", "k8s-memory-limit", "k8s-swap", "k8s-swappiness", "k8s-pcie-acs",
              "k8s-boot-params", "k8s-kernel-module", "k8s-dcu-mkfd")
# The device nodes the GPU device plugins hand to a container with its cards.
PLUGIN_DEVICES = ("/dev/kfd", "/dev/dri")


class Need(BaseModel):
    model_config = ConfigDict(frozen=True)

    rule: str
    field: str
    message: str  # what Kubernetes cannot express, and what happens without it
    node: str  # what the node must have instead
    fact: str


def needs(recipe: Recipe) -> list[Need]:
    """Every need of `recipe` that the manifests cannot carry, in a fixed order."""
    h = recipe.host
    out: list[Need] = []
    if h.memlock_unlimited:
        out.append(Need(
            rule="k8s-memlock", field="host.memlock_unlimited",
            message="a pod spec has no ulimits: the engine gets the container runtime's RLIMIT_MEMLOCK "
                    "(often 64 MiB or 8 MiB), and pinned host buffers fail in load_model() with "
                    "hipErrorOutOfMemory that reads like a VRAM problem",
            node="the container runtime started with unlimited memlock (containerd/CRI-O systemd unit "
                 "LimitMEMLOCK=infinity), so containers inherit RLIMIT_MEMLOCK=unlimited",
            fact="S11f §10.1 / DOMAIN §3: each worker pins a StagedWriteTensor of max_num_seqs × "
                 "max_model_len × 4 B; the container default is 64 MB and cannot be raised inside"))
    if h.no_cgroup_memory_limit:
        out.append(Need(
            rule="k8s-memory-limit", field="host.no_cgroup_memory_limit",
            message="the manifest sets a memory request and no limit, but a LimitRange in the namespace "
                    "injects its default limit at admission; the pod's cgroup then counts page cache "
                    "and the kernel kills TP workers under it",
            node="a namespace with no LimitRange default memory limit (`kubectl get limitrange -n NS`), "
                 "and kubelet eviction thresholds (memory.available) below the recipe's MemAvailable floor",
            fact="DOMAIN §3: cgroup v2 counts page cache in memory.current; 29 GB of mmapped weights + 4 "
                 "workers hit a 32 GiB limit (memory.events oom_kill 2)"))
    if h.swap_total_gib:
        out.append(Need(
            rule="k8s-swap", field="host.swap_total_gib",
            message=f"a pod cannot ask for swap; the recipe needs {h.swap_total_gib:g} GiB to bridge the "
                    f"start-up transient",
            node=f"≥ {h.swap_total_gib:g} GiB swap, and a kubelet with failSwapOn: false and "
                 f"memorySwap.swapBehavior: LimitedSwap (NodeSwap; only Burstable pods get swap)",
            fact="DOMAIN §3 / S14c: 7.4–8.8 GB swapped out at start, ~0.4 GB after; recipe C needs the "
                 "extra 4 GiB swapfile (8 GiB total)"))
    if h.swappiness is not None:
        out.append(Need(
            rule="k8s-swappiness", field="host.swappiness",
            message="vm.swappiness is a node-wide sysctl; a pod's securityContext.sysctls takes only "
                    "namespaced ones",
            node=f"vm.swappiness={h.swappiness} on the node (sysctl.d, or the node's provisioning)",
            fact="S14c: swappiness 60→200 raised the memory margin 0.29→2.71 GiB at zero decode cost"))
    if h.pcie_acs.value != "any":
        out.append(Need(
            rule="k8s-pcie-acs", field="host.pcie_acs",
            message=f"PCIe ACS redirect {h.pcie_acs.value} is bridge configuration of the node",
            node=f"ACS redirect {h.pcie_acs.value} on the bridges above the GPUs "
                 f"(boot parameter pci=disable_acs_redir=… or `appliance host acs apply` on the node)",
            fact="DOMAIN §6: cross-card copy_ 6.95 → 28.3 GB/s with ACS redirect off; zero effect on decode"))
    if h.boot_params:
        out.append(Need(
            rule="k8s-boot-params", field="host.boot_params",
            message="kernel boot parameters belong to the node",
            node="kernel command line with " + " ".join(h.boot_params),
            fact="DOMAIN §1: the reference host boots with iommu=pt pci=disable_acs_redir=<12 bridges>"))
    if h.kernel_module:
        out.append(Need(
            rule="k8s-kernel-module", field="host.kernel_module",
            message=f"the GPU driver module {h.kernel_module} is the node's",
            node=f"kernel module {h.kernel_module} loaded (keep the boot entry pinned to a kernel that has "
                 f"it) and the GPU device plugin running",
            fact="DOMAIN §1: 5.15.0-194 has no hydcu module; rebooting into it leaves the host with no GPU"))
    if recipe.platform.value == "gfx906" and getattr(recipe.runtime, "kind", None) == "kubernetes":
        # A docker gfx906 recipe lists /dev/mkfd itself (runtime.device_paths, k8s-device-paths below
        # when rendered for a cluster); a kubernetes section has no device list, so the need is named here.
        out.append(Need(
            rule="k8s-dcu-mkfd", field="runtime",
            message="the Hygon DCU stack needs /dev/mkfd beside /dev/kfd and /dev/dri (the docker recipe "
                    "mounts all three); AMD's GPU device plugin hands a pod only /dev/kfd and /dev/dri",
            node="a DCU device plugin (or CDI spec) that hands /dev/mkfd to the pod with its cards",
            fact="seed 000 chapter 四 §2: DTK's tools read /dev/mkfd on the reference host (hy-smi "
                 "failing to read mkfd reports VRAM 0%); gfx906-base's device_paths: /dev/kfd, /dev/mkfd, "
                 "/dev/dri"))
    out += _docker_only(recipe)
    return out


def _docker_only(recipe: Recipe) -> list[Need]:
    """Options of a docker section (when a docker recipe is rendered for a cluster) without a pod twin."""
    out: list[Need] = []
    groups = tuple(getattr(recipe.runtime, "group_add", ()) or ())
    if groups:
        out.append(Need(
            rule="k8s-group-add", field="runtime.group_add",
            message=f"group names {', '.join(groups)} cannot be added by name: a pod's "
                    f"supplementalGroups takes numeric GIDs, which differ per node image",
            node="the GPU device plugin granting access to its device nodes (it does for /dev/kfd, /dev/dri)",
            fact="DOMAIN §1: the engine container runs with group video for the DCU device nodes"))
    extra = [d for d in tuple(getattr(recipe.runtime, "device_paths", ()) or ())
             if not d.startswith(PLUGIN_DEVICES)]
    if extra:
        out.append(Need(
            rule="k8s-device-paths", field="runtime.device_paths",
            message=f"device nodes {', '.join(extra)} are not handed out by the GPU device plugin; a pod "
                    f"gets host devices only through a device plugin (or privileged mode)",
            node=f"a device plugin (or CDI spec) that provides {', '.join(extra)} with the cards",
            fact="DOMAIN §1: the kernel-enabled image needs the DCU's device nodes"))
    return out


def comment_lines(recipe: Recipe) -> list[str]:
    """The needs as YAML comment lines."""
    found = needs(recipe)
    if not found:
        return ["# Nothing this recipe needs is outside what the manifests express."]
    lines = ["# NOT EXPRESSIBLE in Kubernetes — the node and namespace must provide it:"]
    for n in found:
        lines += [f"#  - [{n.rule}] {n.field}: {n.message}.",
                  f"#      node needs: {n.node}.",
                  f"#      fact: {n.fact}."]
    return lines


def node_requirements(recipe: Recipe) -> list[str]:
    """One line per need: what the node that runs the engine must have (host-plan notes)."""
    return [f"the node needs {n.node} ({n.field}; {n.fact})" for n in needs(recipe)]
