"""A whole recipe's host plan on the reference-like fixture: plan → apply → plan again (nothing) →
revert (the tree is byte-identical to the start). Bad input anywhere in the applied areas changes
nothing at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.recipe.recipe_loader import load_recipes
from appliance.recipe.recipe_model import Recipe
from host_setup.executor import apply_plan, revert_entries
from host_setup.model import Area, HostPlan, HostSetupError, PlanRefused
from host_setup.planner import plan_host
from tests.fixtures.host_setup.tree import BRIDGES, Host, acs_control, make_host, snapshot

RECIPES = load_recipes(Path(__file__).resolve().parents[2] / "recipes")
RECIPE_C = RECIPES["gfx906-c-tp4-graph-piecewise"]  # +4 GiB swapfile, swappiness 200, ACS off (S14c, §6)


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return make_host(tmp_path)


def plan(host: Host, recipe: Recipe = RECIPE_C, **kw: object) -> HostPlan:
    return plan_host(recipe, host.ctx, host.journal, appliance_home=Path("/var/lib/appliance"), **kw)  # type: ignore[arg-type]


def test_recipe_c_plan_apply_replan_revert(host: Host) -> None:
    before = snapshot(host.root)
    first = plan(host)
    assert [c.id for c in first.changes] == ["swap.swapfile", "sysctl.vm.swappiness"] + [
        f"acs.{b}" for b in BRIDGES
    ]
    assert first.blockers() == ()

    apply_plan(first, host.ctx, host.journal)
    assert (host.root.proc / "sys/vm/swappiness").read_text().strip() == "200"
    assert {acs_control(host.root, b) for b in BRIDGES} == {0x0011}
    assert all(e.status == "applied" and e.recipe == RECIPE_C.name for e in host.journal.entries())

    second = plan(host)
    assert second.changes == ()  # apply twice → the second time changes nothing

    restarted = host.fresh()  # a new controller process: only the journal file is shared
    reverted = revert_entries(restarted.ctx, restarted.journal)
    assert reverted[0].id == f"acs.{BRIDGES[-1]}" and reverted[-1].id == "swap.swapfile"  # newest first
    assert snapshot(host.root) == before
    assert plan(host).changes == first.changes


def test_only_applies_the_named_areas(host: Host) -> None:
    apply_plan(plan(host), host.ctx, host.journal, areas=[Area.SYSCTL])
    assert [e.id for e in host.journal.entries()] == ["sysctl.vm.swappiness"]
    assert {acs_control(host.root, b) for b in BRIDGES} == {0x001D}
    assert not host.root.path("/var/lib/appliance/swap/appliance.swap").exists()


def test_revert_only_undoes_the_named_areas(host: Host) -> None:
    apply_plan(plan(host), host.ctx, host.journal)
    revert_entries(host.ctx, host.journal, areas=[Area.ACS])
    assert {acs_control(host.root, b) for b in BRIDGES} == {0x001D}
    assert [e.id for e in host.journal.entries()] == ["swap.swapfile", "sysctl.vm.swappiness"]


def test_bad_input_in_any_applied_area_changes_nothing(host: Host) -> None:
    before = snapshot(host.root)
    bad = plan(host, extra_sysctls={"vm.no_such_knob": "1"})
    assert len(bad.changes) == 14  # everything else is planned, and shown
    with pytest.raises(PlanRefused, match=r"unknown sysctl 'vm\.no_such_knob'"):
        apply_plan(bad, host.ctx, host.journal)
    assert snapshot(host.root) == before
    assert host.commands.calls == [] and host.journal.entries() == ()
    # the error is in the sysctl area: applying only swap is fine
    apply_plan(bad, host.ctx, host.journal, areas=[Area.SWAP])
    assert [e.id for e in host.journal.entries()] == ["swap.swapfile"]


def test_a_failing_command_half_way_is_journaled_and_revertable(tmp_path: Path) -> None:
    host = make_host(
        tmp_path, fail={"swapon": "swapon: /var/lib/appliance/swap/appliance.swap: swapon failed"}
    )
    before = snapshot(host.root)
    with pytest.raises(HostSetupError) as failed:
        apply_plan(plan(host), host.ctx, host.journal)
    assert "swap.swapfile" in str(failed.value) and str(host.journal.path) in str(failed.value)
    assert [(e.id, e.status) for e in host.journal.entries()] == [("swap.swapfile", "applying")]
    revert_entries(host.ctx, host.journal)
    assert snapshot(host.root) == before


def test_a_recipe_with_no_host_needs_plans_no_changes(host: Host) -> None:
    cpu = plan(host, RECIPES["cpu-smollm2"])
    assert cpu.changes == () and cpu.blockers() == ()


def test_recipe_c_prime_wants_16_gib(host: Host) -> None:
    (swap,) = [
        c for c in plan(host, RECIPES["gfx906-c-prime-tp4-graph-default"]).changes if c.area is Area.SWAP
    ]
    assert swap.action.kind == "swapfile" and swap.action.size_bytes == 12 * 1024**3
