"""PCIe ACS on the bridges above the GPUs (DOMAIN §6): topology from sysfs, the ACS control word
from the binary config space, show/apply/revert idempotent, originals restored."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path

import pytest

from host_setup import acs
from host_setup.commands import CommandError, CommandResult
from host_setup.executor import apply_plan, revert_entries
from host_setup.model import PlanRefused, Severity
from host_setup.pci_config import (
    ACS_EXT_CAP_ID,
    AcsUnreadable,
    SetpciAccess,
    SysfsConfigAccess,
    describe_control,
    find_ext_capability,
)
from host_setup.planner import plan_acs_only
from tests.fixtures.host_setup.tree import (
    ACS_OFFSET,
    ACS_ORIGINAL,
    BRIDGES,
    GPUS,
    Host,
    PciDevice,
    acs_control,
    add_pci_device,
    config_space,
    make_host,
    set_acs_control,
    set_text,
    snapshot,
)

NVME_PORT = "0000:00:05.1"


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return make_host(tmp_path)


# --- config space -------------------------------------------------------------------------------


def test_the_extended_capability_list_is_walked_to_the_acs_capability() -> None:
    bridge = config_space(PciDevice("0000:00:01.1", 0x1D94, 0x14B8, 0x060400, 0x001D))
    assert find_ext_capability(bridge, ACS_EXT_CAP_ID) == ACS_OFFSET  # AER first, then ACS
    assert find_ext_capability(bridge, 0x0019) == 0x158
    no_acs = config_space(PciDevice("0000:00:07.1", 0x1D94, 0x14B8, 0x060400, None))
    assert find_ext_capability(no_acs, ACS_EXT_CAP_ID) is None


def test_a_looping_capability_list_ends() -> None:
    data = bytearray(4096)
    struct.pack_into("<I", data, 0x100, 0x0001 | (0x100 << 20))  # next points at itself
    assert find_ext_capability(bytes(data), ACS_EXT_CAP_ID) is None


@pytest.mark.parametrize(("size", "hint"), [(64, "run as root"), (256, "no PCIe extended space")])
def test_a_short_config_space_says_why_it_cannot_be_read(size: int, hint: str) -> None:
    with pytest.raises(AcsUnreadable, match=hint):
        find_ext_capability(bytes(size), ACS_EXT_CAP_ID)


def test_control_words_are_named_like_lspci() -> None:
    assert describe_control(0x001D) == "0x001d (SrcValid ReqRedir CmpltRedir UpstreamFwd)"
    assert describe_control(0x0011) == "0x0011 (SrcValid UpstreamFwd)"
    assert describe_control(0) == "0x0000 (all off)"


# --- topology -----------------------------------------------------------------------------------


def test_bridges_are_found_by_walking_each_gpu_up_the_sysfs_path(host: Host) -> None:
    assert acs.find_gpus(host.root) == tuple(GPUS)  # the NVMe drive is not a GPU
    assert acs.bridges_above(host.root, "0000:03:00.0") == ("0000:00:01.1", "0000:01:00.0", "0000:02:00.0")
    topo = acs.read_acs_topology(host.root, SysfsConfigAccess(host.root))
    assert [b.bdf for b in topo.bridges] == BRIDGES  # 12 bridges above 4 cards, as on the reference host
    assert NVME_PORT not in [b.bdf for b in topo.bridges]
    assert {b.control for b in topo.bridges} == {ACS_ORIGINAL}
    assert topo.boot_param is None


# --- plan / apply / revert ----------------------------------------------------------------------


def test_plan_clears_the_redirect_bits_like_the_boot_parameter(host: Host) -> None:
    plan, _ = plan_acs_only(host.ctx)
    assert [c.id for c in plan.changes] == [f"acs.{b}" for b in BRIDGES]
    assert {c.action.value for c in plan.changes if c.action.kind == "acs-control"} == {0x0011}
    assert "28.3 GB/s" in plan.changes[0].why and "zero effect on decode" in plan.changes[0].why
    assert any("can_device_access_peer" in f.message for f in plan.findings)


def test_clear_all_gives_the_original_scripts_0x0000(host: Host) -> None:
    plan, _ = plan_acs_only(host.ctx, mode="all")
    assert {c.action.value for c in plan.changes if c.action.kind == "acs-control"} == {0x0000}


def test_apply_is_idempotent_and_revert_restores_every_original(host: Host) -> None:
    before = snapshot(host.root)
    plan, _ = plan_acs_only(host.ctx)
    apply_plan(plan, host.ctx, host.journal)
    assert {acs_control(host.root, b) for b in BRIDGES} == {0x0011}
    assert acs_control(host.root, NVME_PORT) == ACS_ORIGINAL  # not above a GPU: left alone

    again, _ = plan_acs_only(host.ctx)
    assert again.changes == ()
    assert [f.severity for f in again.findings] == [Severity.OK] * 12

    undone = revert_entries(host.fresh().ctx, host.journal)
    assert len(undone) == 12
    assert {acs_control(host.root, b) for b in BRIDGES} == {ACS_ORIGINAL}
    assert snapshot(host.root) == before
    assert revert_entries(host.ctx, host.journal) == ()


def test_revert_after_a_reboot_reset_the_words_writes_nothing(host: Host) -> None:
    plan, _ = plan_acs_only(host.ctx)
    apply_plan(plan, host.ctx, host.journal)
    for bdf in BRIDGES:  # firmware puts 0x001d back at boot
        set_acs_control(host.root, bdf, ACS_ORIGINAL)

    def mtimes() -> dict[str, int]:
        return {b: (host.root.sys / "bus/pci/devices" / b / "config").stat().st_mtime_ns for b in BRIDGES}

    before = mtimes()
    revert_entries(host.ctx, host.journal)
    assert mtimes() == before


def test_the_boot_parameter_is_reported_as_the_preferred_state(host: Host) -> None:
    set_text(
        host.root,
        "/proc/cmdline",
        "BOOT_IMAGE=/boot/vmlinuz-5.15.0-191-generic ro iommu=pt "
        f"pci=noaer,disable_acs_redir={';'.join(BRIDGES)}\n",
    )
    for bdf in BRIDGES:  # what the kernel leaves: 0x0011
        set_acs_control(host.root, bdf, 0x0011)
    plan, topo = plan_acs_only(host.ctx, unit=acs.unit_content("/usr/bin/appliance", "/var/lib/appliance"))
    assert topo.boot_param == ";".join(BRIDGES)
    assert plan.changes == ()  # no config writes, and no unit either
    messages = " ".join(f.message for f in plan.findings)
    assert "preferred persistent state" in messages
    assert "appliance-acs.service not installed" in messages


def test_a_named_device_without_acs_refuses_the_whole_apply(host: Host) -> None:
    add_pci_device(host.root, [], PciDevice("0000:00:07.1", 0x1D94, 0x14B8, 0x060400, None))
    before = snapshot(host.root)
    plan, _ = plan_acs_only(host.ctx, devices=("0000:00:01.1", "0000:00:07.1"))
    (error,) = plan.blockers()
    assert error.message == "0000:00:07.1: no ACS capability"
    with pytest.raises(PlanRefused, match=r"0000:00:07\.1: no ACS capability"):
        apply_plan(plan, host.ctx, host.journal)
    assert snapshot(host.root) == before  # 0000:00:01.1 was valid, and is still untouched
    assert host.journal.entries() == ()


def test_a_named_device_that_does_not_exist_is_an_error(host: Host) -> None:
    plan, _ = plan_acs_only(host.ctx, devices=("0000:99:00.0",))
    assert plan.blockers()[0].message == "0000:99:00.0: no such PCI device"


def test_no_gpu_is_a_clear_error(tmp_path: Path) -> None:
    host = make_host(tmp_path, gpus=False)
    plan, _ = plan_acs_only(host.ctx)
    (error,) = plan.blockers()
    assert error.message.startswith("no GPU found under /sys/bus/pci/devices")


def test_a_bridge_without_acs_above_a_gpu_is_skipped_not_fatal(host: Host) -> None:
    no_acs = PciDevice("0000:02:00.0", 0x1D94, 0x14B8, 0x060400, acs_control=None)
    add_pci_device(host.root, ["0000:00:01.1", "0000:01:00.0"], no_acs)
    plan, _ = plan_acs_only(host.ctx)
    assert plan.blockers() == ()
    assert "0000:02:00.0: no ACS capability (skipped)" in [f.message for f in plan.findings]
    assert len(plan.changes) == 11


# --- the systemd unit ---------------------------------------------------------------------------


def test_the_unit_applies_at_start_reverts_at_stop_and_is_removed_by_revert(host: Host) -> None:
    content = acs.unit_content("/opt/appliance/bin/appliance", "/var/lib/appliance")
    assert "ExecStart=/opt/appliance/bin/appliance host acs apply --yes" in content
    assert "ExecStop=/opt/appliance/bin/appliance host acs revert --yes" in content
    before = snapshot(host.root)
    plan, _ = plan_acs_only(host.ctx, unit=content)
    assert plan.changes[-1].id == "acs.unit"
    apply_plan(plan, host.ctx, host.journal)
    assert host.root.path(acs.UNIT_HOST_PATH).read_text() == content
    assert ("systemctl", "enable", "appliance-acs.service") in host.commands.calls
    assert plan_acs_only(host.ctx, unit=content)[0].changes == ()

    # `acs revert` without --unit (what ExecStop runs) keeps the unit
    revert_entries(host.ctx, host.journal, select=lambda e: e.undo.kind == "acs-control")
    assert host.root.path(acs.UNIT_HOST_PATH).exists()
    revert_entries(host.ctx, host.journal)
    assert ("systemctl", "disable", "appliance-acs.service") in host.commands.calls
    assert snapshot(host.root) == before


# --- setpci -------------------------------------------------------------------------------------


class SetpciDouble:
    """Stands in for `setpci`: a dict of control words, every call recorded."""

    def __init__(self, words: dict[str, int]) -> None:
        self.words = words
        self.calls: list[tuple[str, ...]] = []

    def run(self, argv: Sequence[str], *, check: bool = True) -> CommandResult:
        args = tuple(argv)
        self.calls.append(args)
        bdf, reg = args[2], args[3]
        if bdf not in self.words:
            raise CommandError(args, 1, "setpci: Capability ECAP_ACS not found")
        if "=" in reg:
            self.words[bdf] = int(reg.split("=")[1], 16)
            return CommandResult(args, 0, "", "")
        return CommandResult(args, 0, f"{self.words[bdf]:04x}\n", "")


def test_setpci_reads_and_writes_the_control_word_by_capability_name() -> None:
    double = SetpciDouble({"0000:00:01.1": 0x001D})
    access = SetpciAccess(double)
    assert access.acs_offset("0000:00:01.1") is not None
    assert access.acs_offset("0000:00:07.1") is None
    assert access.read_control("0000:00:01.1") == 0x001D
    access.write_control("0000:00:01.1", 0x0011)
    assert double.calls[-1] == ("setpci", "-s", "0000:00:01.1", "ECAP_ACS+6.w=0011")
    assert double.words["0000:00:01.1"] == 0x0011
