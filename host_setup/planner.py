"""Read the host once, then plan every area for a recipe (or for ACS alone).

Reading is the only effect here (files under the injected root, `docker info` through its seam);
each area's `plan_*` is pure and tested on its own. The result is a `HostPlan`: changes with their
reasons, and findings the operator has to act on.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from appliance.host_facts import HostFacts
from appliance.recipe.recipe_model import AcsState, Recipe
from appliance.recipe.render import RenderError, render
from appliance.runtimes import registry as runtime_registry
from appliance.runtimes.base import Placement
from host_setup import acs, boot, container_runtime, memlock, swap, sysctl
from host_setup.commands import HostContext
from host_setup.facts import HostFactsError, gather_facts
from host_setup.journal import Journal
from host_setup.model import Area, Change, Finding, HostPlan, HostSetupError, Severity
from host_setup.pci_config import access_for
from host_setup.root import read_text


def plan_host(
    recipe: Recipe,
    ctx: HostContext,
    journal: Journal,
    *,
    extra_sysctls: Mapping[str, str] | None = None,
    acs_mode: acs.Mode = "redirect",
    docker_info: container_runtime.DockerInfo | None = None,
    appliance_home: Path | None = None,
) -> HostPlan:
    root = ctx.root
    req = recipe.host
    plugin = runtime_registry.for_recipe(recipe)
    placement = plugin.traits.placement
    facts = _facts(ctx, appliance_home)
    changes: list[Change] = []
    findings: list[Finding] = []

    def add(part: tuple[list[Change], list[Finding]]) -> None:
        changes.extend(part[0])
        findings.extend(part[1])

    swap_state = swap.read_swap_state(root, swap.recorded_path(journal))
    add(swap.plan_swap(swap_state, req.swap_total_gib))

    wanted, bad = _sysctls(req.swappiness, extra_sysctls or {})
    findings.extend(bad)
    add(sysctl.plan_sysctl(sysctl.read_sysctl_state(root, list(wanted)), wanted))

    add(
        memlock.plan_memlock(
            memlock.read_memlock_state(root, placement),
            req.memlock_unlimited,
            _container_memlock(recipe, facts),
        )
    )

    if req.pcie_acs is AcsState.DISABLED:
        add(acs.plan_acs(acs.read_acs_topology(root, access_for(ctx)), acs_mode))
    elif req.pcie_acs is AcsState.ENABLED:
        findings.extend(_acs_should_be_on(acs.read_acs_topology(root, access_for(ctx))))

    module = req.kernel_module or boot.default_driver(recipe.platform, read_text(root.proc / "cpuinfo"))
    findings.extend(boot.plan_boot(boot.read_boot_state(root, module), req.boot_params))

    if docker_info is None and placement is Placement.LOCAL_DAEMON and root.is_real:
        # Only the running host has a daemon to ask; a copied tree is judged from its files.
        docker_info = container_runtime.docker_info_via(ctx.commands)
    own_limit = facts.cgroup_memory_limit_bytes if facts else None
    rt = container_runtime.read_runtime_state(root, placement, docker_info, own_limit)
    findings.extend(container_runtime.plan_runtime(rt, req.no_cgroup_memory_limit))
    # What the node that runs the engine must have, where this host's plan cannot change it.
    findings.extend(Finding(area=Area.RUNTIME, severity=Severity.INFO, message=note)
                    for note in plugin.host_plan_notes(recipe))

    return HostPlan(
        recipe=recipe.name, host_root=str(root.base), changes=tuple(changes), findings=tuple(findings)
    )


def plan_acs_only(
    ctx: HostContext,
    *,
    devices: tuple[str, ...] | None = None,
    mode: acs.Mode = "redirect",
    unit: str | None = None,
) -> tuple[HostPlan, acs.AcsTopology]:
    """`appliance host acs show|apply`: the bridges above the GPUs (or the named devices).
    `unit`: the systemd unit content to install too."""
    topo = acs.read_acs_topology(ctx.root, access_for(ctx), only=devices)
    changes, findings = acs.plan_acs(topo, mode, explicit=devices is not None)
    if unit is not None:
        unit_changes, unit_findings = acs.plan_unit(topo, unit)
        changes += unit_changes
        findings += unit_findings
    plan = HostPlan(
        recipe=None, host_root=str(ctx.root.base), changes=tuple(changes), findings=tuple(findings)
    )
    return plan, topo


def _facts(ctx: HostContext, appliance_home: Path | None) -> HostFacts | None:
    try:
        return gather_facts(ctx.root.base, appliance_home)
    except HostFactsError:
        return None


def _sysctls(swappiness: int | None, extra: Mapping[str, str]) -> tuple[dict[str, str], list[Finding]]:
    wanted: dict[str, str] = {}
    bad: list[Finding] = []
    if swappiness is not None:
        wanted["vm.swappiness"] = str(swappiness)
    for name, value in extra.items():
        try:
            wanted[sysctl.normalize_name(name)] = sysctl.normalize_value(value)
        except HostSetupError as exc:
            bad.append(Finding(area=Area.SYSCTL, severity=Severity.ERROR, message=str(exc)))
    return wanted, bad


def _container_memlock(recipe: Recipe, facts: HostFacts | None) -> int | None:
    """The memlock soft limit the rendered launch gives the container (None: none, or unknown)."""
    if facts is None or not runtime_registry.for_recipe(recipe).traits.sets_own_memlock:
        return None
    try:
        spec = render(recipe, facts)
    except RenderError:
        return None
    return next((u.soft for u in spec.ulimits if u.name == "memlock"), None)


def _acs_should_be_on(topo: acs.AcsTopology) -> list[Finding]:
    off = [b.bdf for b in topo.bridges if b.has_acs and not b.redirect_on]
    if not off:
        return []
    return [
        Finding(
            area=Area.ACS,
            severity=Severity.WARN,
            message=f"the recipe wants ACS redirect on, but it is off on {', '.join(off)}",
            fix="`appliance host acs revert --yes` restores the values the appliance changed",
        )
    ]
