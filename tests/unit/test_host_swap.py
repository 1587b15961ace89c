"""Swap: one extra swapfile up to the recipe's target, never touching existing swap (DOMAIN §3, S14c).

Fixture: the reference-like host (4 GiB /swap.img active, root on ext4). FixtureCommands runs the
real `mkswap` on files inside the tree; `swapon`/`swapoff` edit the tree's proc/swaps.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from host_setup.executor import apply_plan, revert_entries
from host_setup.model import Area, HostPlan, HostSetupError, PlanRefused, Severity, SwapfileAction
from host_setup.swap import GIB, MIB, SwapState, plan_swap, read_swap_state, recorded_path
from tests.fixtures.host_setup.tree import Host, as_plan, make_host, set_text, snapshot

SWAPFILE = "/var/lib/appliance/swap/appliance.swap"


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return make_host(tmp_path)


def swap_plan(host: Host, target_gib: float | None) -> HostPlan:
    state = read_swap_state(host.root, recorded_path(host.journal))
    return as_plan(host.root, plan_swap(state, target_gib))


def swaps(host: Host) -> list[str]:
    return [line.split()[0] for line in (host.root.proc / "swaps").read_text().splitlines()[1:]]


def state(**overrides: object) -> SwapState:
    base: dict[str, object] = dict(
        areas=(),
        ours_host_path=SWAPFILE,
        ours_size=None,
        recorded_path=None,
        ours_formatted=False,
        fstab_has_ours=False,
        fs_type="ext4",
        mount_point="/",
        dir_nocow=None,
        free_bytes=100 * GIB,
    )
    base.update(overrides)
    return SwapState(**base)  # type: ignore[arg-type]


def test_plan_adds_exactly_the_missing_4_gib_as_one_swapfile(host: Host) -> None:
    plan = swap_plan(host, 8)
    (change,) = plan.changes
    assert change.id == "swap.swapfile"
    assert change.action.kind == "swapfile"
    assert change.action.size_bytes == 4 * GIB  # 8 GiB target − the 4 GiB /swap.img
    assert change.action.fstab_line == f"{SWAPFILE} none swap sw 0 0"
    assert "swap 4.00 GiB (/swap.img 4.00 GiB)" in change.before
    assert "swap 8.00 GiB" in change.after
    assert "S14c" in change.why
    assert plan.findings == ()


def test_apply_creates_a_0600_formatted_swapfile_activates_it_and_adds_fstab(host: Host) -> None:
    fstab_before = (host.root.etc / "fstab").read_text()
    apply_plan(swap_plan(host, 8), host.ctx, host.journal)

    real = host.root.path(SWAPFILE)
    assert stat.S_IMODE(real.stat().st_mode) == 0o600
    assert real.stat().st_size == 4 * GIB
    with real.open("rb") as f:
        f.seek(os.sysconf("SC_PAGE_SIZE") - 10)
        assert f.read(10) == b"SWAPSPACE2"  # formatted by the real mkswap
    assert host.commands.names() == ["fallocate", "mkswap", "swapon"]
    assert swaps(host) == ["/swap.img", SWAPFILE]  # existing swap untouched
    fstab = (host.root.etc / "fstab").read_text()
    assert fstab.startswith(fstab_before)  # appended, nothing else edited
    assert fstab.rstrip().endswith(f"{SWAPFILE} none swap sw 0 0")
    (entry,) = host.journal.entries()
    assert (entry.id, entry.status, entry.area) == ("swap.swapfile", "applied", Area.SWAP)


def test_apply_twice_changes_nothing_the_second_time(host: Host) -> None:
    apply_plan(swap_plan(host, 8), host.ctx, host.journal)
    again = swap_plan(host, 8)
    assert again.changes == ()
    assert [f.severity for f in again.findings] == [Severity.OK]
    calls = len(host.commands.calls)
    assert apply_plan(again, host.ctx, host.journal) == ()
    assert len(host.commands.calls) == calls


def test_revert_removes_only_what_was_added(host: Host) -> None:
    before = snapshot(host.root)
    apply_plan(swap_plan(host, 8), host.ctx, host.journal)
    restarted = host.fresh()  # revert works from the journal file alone (controller restart)
    (done,) = revert_entries(restarted.ctx, restarted.journal)
    assert done.id == "swap.swapfile"
    assert restarted.commands.names() == ["swapoff"]
    assert not host.root.path(SWAPFILE).exists()
    assert snapshot(host.root) == before  # fstab byte-identical, /swap.img still listed
    assert restarted.journal.entries() == ()
    assert revert_entries(restarted.ctx, restarted.journal) == ()  # revert twice: nothing left


def test_target_smaller_than_existing_swap_is_a_clear_message_and_no_change(host: Host) -> None:
    set_text(
        host.root,
        "/proc/swaps",
        "Filename\tType\tSize\tUsed\tPriority\n/swap.img file 16777212 0 -2\n",
    )
    before = snapshot(host.root)
    plan = swap_plan(host, 8)
    assert plan.changes == ()
    (finding,) = plan.findings
    assert finding.severity is Severity.INFO
    assert "already 16.00 GiB, above the recipe's target 8.00 GiB" in finding.message
    assert "never shrinks" in finding.message
    apply_plan(plan, host.ctx, host.journal)
    assert snapshot(host.root) == before
    assert host.commands.calls == []


@pytest.mark.parametrize(
    ("swap_dir", "fs", "reason"),
    [
        ("/mnt/ram/swap", "tmpfs", "memory-backed"),
        ("/var/lib/docker/overlay2/4c1d0e7f/merged/swap", "overlay", "overlayfs"),
        ("/mnt/pool/swap", "btrfs", "NOCOW"),
    ],
)
def test_filesystems_that_cannot_hold_a_swapfile_are_refused_before_any_change(
    tmp_path: Path, swap_dir: str, fs: str, reason: str
) -> None:
    host = make_host(tmp_path)
    root = type(host.root).at(host.root.base, swap_dir=swap_dir)
    host = Host(root, host.commands, type(host.ctx)(root, host.commands), host.journal)
    before = snapshot(host.root)
    plan = swap_plan(host, 8)
    assert plan.changes == ()
    (error,) = plan.blockers()
    assert f"({fs})" in error.message and reason in error.message
    assert "ext4 or xfs" in error.fix
    with pytest.raises(PlanRefused, match="nothing was changed"):
        apply_plan(plan, host.ctx, host.journal)
    assert snapshot(host.root) == before
    assert host.commands.calls == []


def test_btrfs_with_a_nocow_directory_is_accepted() -> None:
    changes, findings = plan_swap(state(fs_type="btrfs", dir_nocow=True), 8)
    assert len(changes) == 1 and findings == []
    _, refused = plan_swap(state(fs_type="btrfs", dir_nocow=False), 8)
    assert refused[0].severity is Severity.ERROR


def test_a_file_at_our_path_that_the_appliance_did_not_create_is_refused() -> None:
    changes, findings = plan_swap(state(ours_size=GIB, recorded_path=None), 8)
    assert changes == []
    assert findings[0].severity is Severity.ERROR
    assert "did not create it" in findings[0].message


def test_not_enough_free_space_is_refused_with_the_numbers() -> None:
    changes, findings = plan_swap(state(free_bytes=3 * GIB), 4)
    assert changes == []
    assert "needs 5.00 GiB free" in findings[0].message and "only 3.00 GiB" in findings[0].message


def test_no_target_means_no_change_and_no_noise() -> None:
    assert plan_swap(state(), None) == ([], [])


def test_a_rising_target_grows_our_own_swapfile(host: Host) -> None:
    apply_plan(swap_plan(host, 8), host.ctx, host.journal)
    plan = swap_plan(host, 10)
    (change,) = plan.changes
    assert isinstance(change.action, SwapfileAction)
    assert "grow" in change.what and change.action.size_bytes == 6 * GIB
    host.commands.calls.clear()
    apply_plan(plan, host.ctx, host.journal)
    assert host.commands.names() == ["swapoff", "fallocate", "mkswap", "swapon"]
    assert host.root.path(SWAPFILE).stat().st_size == 6 * GIB
    assert (host.root.etc / "fstab").read_text().count(SWAPFILE) == 1
    assert swap_plan(host, 10).changes == ()


def test_dd_is_the_fallback_when_fallocate_is_not_supported(tmp_path: Path) -> None:
    host = make_host(tmp_path, fail={"fallocate": "fallocate: fallocate failed: Operation not supported"})
    apply_plan(swap_plan(host, 4.25), host.ctx, host.journal)
    dd = next(c for c in host.commands.calls if c[0] == "dd")
    assert "count=256" in dd and "if=/dev/zero" in dd  # 256 MiB written block by block
    assert swaps(host)[-1] == SWAPFILE


def test_a_half_made_swapfile_is_journaled_and_revert_cleans_it_up(tmp_path: Path) -> None:
    host = make_host(tmp_path, fail={"swapon": "swapon: swapon failed: Invalid argument"})
    before = snapshot(host.root)
    with pytest.raises(HostSetupError, match="appliance host revert"):
        apply_plan(swap_plan(host, 8), host.ctx, host.journal)
    (entry,) = host.journal.entries()
    assert entry.status == "applying"
    assert host.root.path(SWAPFILE).exists()
    revert_entries(host.ctx, host.journal)
    assert snapshot(host.root) == before


def test_plan_counts_in_whole_mib() -> None:
    (change,), _ = plan_swap(state(), 0.001)
    assert isinstance(change.action, SwapfileAction)
    assert change.action.size_bytes == 2 * MIB  # 1.07 MB rounded up to whole MiB


def test_a_second_swapfile_in_another_dir_is_refused_while_the_first_is_recorded() -> None:
    changes, findings = plan_swap(state(recorded_path="/srv/swap/appliance.swap"), 8)
    assert changes == []
    assert "the appliance's swapfile is /srv/swap/appliance.swap" in findings[0].message
    assert findings[0].severity is Severity.ERROR and "revert --only swap" in findings[0].fix
