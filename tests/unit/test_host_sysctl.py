"""Sysctls: live value + /etc/sysctl.d/90-appliance.conf, revert to the operator's values (S14c)."""

from __future__ import annotations

from pathlib import Path

import pytest

from host_setup.executor import apply_plan, revert_entries
from host_setup.model import HostPlan, HostSetupError, PlanRefused, Severity
from host_setup.sysctl import CONF_HOST_PATH, normalize_name, plan_sysctl, read_sysctl_state
from tests.fixtures.host_setup.tree import Host, as_plan, make_host, set_text, snapshot


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return make_host(tmp_path)


def sysctl_plan(host: Host, wanted: dict[str, str]) -> HostPlan:
    return as_plan(host.root, plan_sysctl(read_sysctl_state(host.root, list(wanted)), wanted))


def live(host: Host, name: str = "vm/swappiness") -> str:
    return (host.root.proc / "sys" / name).read_text().strip()


def test_plan_shows_60_to_200_with_the_measured_reason(host: Host) -> None:
    (change,) = sysctl_plan(host, {"vm.swappiness": "200"}).changes
    assert change.id == "sysctl.vm.swappiness"
    assert change.before == f"vm.swappiness = 60 (in {CONF_HOST_PATH}: not set)"
    assert change.after == "vm.swappiness = 200"
    assert "0.29→2.71 GiB" in change.why


def test_apply_sets_live_and_persistent_value_and_revert_restores_both(host: Host) -> None:
    before = snapshot(host.root)
    apply_plan(sysctl_plan(host, {"vm.swappiness": "200"}), host.ctx, host.journal)
    assert live(host) == "200"
    conf = host.root.path(CONF_HOST_PATH).read_text()
    assert "vm.swappiness = 200\n" in conf and conf.startswith("# Written by `appliance host apply`")
    assert host.commands.calls == []  # a /proc/sys write, like `sysctl -w`; no command needed

    assert sysctl_plan(host, {"vm.swappiness": "200"}).changes == ()  # idempotent

    revert_entries(host.fresh().ctx, host.journal)
    assert live(host) == "60"
    assert not host.root.path(CONF_HOST_PATH).exists()
    assert snapshot(host.root) == before


def test_the_first_original_wins_across_applies(host: Host) -> None:
    apply_plan(sysctl_plan(host, {"vm.swappiness": "200"}), host.ctx, host.journal)
    apply_plan(sysctl_plan(host, {"vm.swappiness": "180"}), host.ctx, host.journal)
    (entry,) = host.journal.entries()
    assert entry.undo.kind == "sysctl" and entry.undo.previous_live == "60"
    assert live(host) == "180"
    revert_entries(host.ctx, host.journal)
    assert live(host) == "60"


def test_unknown_sysctl_is_a_clear_error_and_blocks_the_whole_area(host: Host) -> None:
    before = snapshot(host.root)
    plan = sysctl_plan(host, {"vm.swappiness": "200", "vm.swapiness": "200"})
    (error,) = plan.blockers()
    assert "unknown sysctl 'vm.swapiness'" in error.message
    assert "/proc/sys/vm/swapiness" in error.message
    with pytest.raises(PlanRefused) as refused:
        apply_plan(plan, host.ctx, host.journal)
    assert "vm.swapiness" in str(refused.value)
    assert snapshot(host.root) == before  # not even the valid vm.swappiness was written
    assert host.journal.entries() == ()


@pytest.mark.parametrize("bad", ["../../etc/passwd", "swappiness", "vm..swappiness", "vm.swap piness"])
def test_names_that_are_not_sysctls_are_rejected(bad: str) -> None:
    with pytest.raises(HostSetupError, match="not a sysctl name"):
        normalize_name(bad)


def test_slash_form_is_the_same_sysctl() -> None:
    assert normalize_name("vm/swappiness") == "vm.swappiness"


def test_a_later_file_that_would_win_at_boot_is_reported_once(host: Host) -> None:
    set_text(host.root, "/etc/sysctl.conf", "vm.swappiness=60\n")
    link = host.root.path("/etc/sysctl.d/99-sysctl.conf")
    link.symlink_to("../sysctl.conf")  # Debian: the same file under two names
    set_text(host.root, "/etc/sysctl.d/10-early.conf", "vm.swappiness = 10\n")  # read before ours: harmless
    plan = sysctl_plan(host, {"vm.swappiness": "200"})
    warnings = [f for f in plan.findings if f.severity is Severity.WARN]
    assert len(warnings) == 1
    assert "/etc/sysctl.d/99-sysctl.conf sets vm.swappiness = 60" in warnings[0].message
    assert "after a reboot vm.swappiness would be 60, not 200" in warnings[0].message


def test_other_keys_in_our_file_survive_apply_and_revert(host: Host) -> None:
    set_text(host.root, CONF_HOST_PATH, "vm.dirty_ratio = 10\n")
    apply_plan(sysctl_plan(host, {"vm.swappiness": "200"}), host.ctx, host.journal)
    text = host.root.path(CONF_HOST_PATH).read_text()
    assert "vm.dirty_ratio = 10" in text and "vm.swappiness = 200" in text
    revert_entries(host.ctx, host.journal)
    text = host.root.path(CONF_HOST_PATH).read_text()
    assert "vm.dirty_ratio = 10" in text and "swappiness" not in text


def test_multi_value_sysctls_compare_by_words(host: Host) -> None:
    set_text(host.root, "/proc/sys/net/ipv4/tcp_rmem", "4096\t131072\t6291456\n")
    set_text(host.root, CONF_HOST_PATH, "net.ipv4.tcp_rmem = 4096 131072 6291456\n")
    plan = sysctl_plan(host, {"net.ipv4.tcp_rmem": "4096  131072 6291456"})
    assert plan.changes == ()
    assert plan.findings[0].severity is Severity.OK
