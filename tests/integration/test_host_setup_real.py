"""host_setup against real tools and the real machine, as far as a shared machine allows.

- A real swapfile: created by the real `fallocate` (or `dd`), formatted by the real `mkswap`, in a
  temporary host tree; only `swapon`/`swapoff` are replaced (they would change this shared
  machine's memory, which the tests must never do).
- The `appliance` console script end to end on a fixture tree (a separate process, like an operator).
- Read-only on the real host: `host facts`, `host plan`, `host acs show` read the real /proc and /sys.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from host_setup.executor import apply_plan, revert_entries
from host_setup.model import HostPlan
from host_setup.pci_config import AcsUnreadable, SysfsConfigAccess
from host_setup.root import HostRoot
from host_setup.swap import MIB, plan_swap, read_swap_state, recorded_path
from tests.fixtures.host_setup.tree import BRIDGES, Host, acs_control, as_plan, make_host, snapshot

SWAPFILE = "/var/lib/appliance/swap/appliance.swap"
APPLIANCE = Path(sys.executable).with_name("appliance")
TARGET_GIB = 4 + 64 / 1024  # the fixture's 4 GiB /swap.img + a 64 MiB file: small on a shared disk

pytestmark = pytest.mark.skipif(shutil.which("mkswap") is None, reason="util-linux mkswap is not installed")


def swap_plan(host: Host) -> HostPlan:
    state = read_swap_state(host.root, recorded_path(host.journal))
    return as_plan(host.root, plan_swap(state, TARGET_GIB))


def blkid_type(path: Path) -> str | None:
    if shutil.which("blkid") is None:
        return None
    done = subprocess.run(
        ["blkid", "-p", "-o", "value", "-s", "TYPE", str(path)], capture_output=True, text=True
    )
    return done.stdout.strip()


def assert_real_swapfile(path: Path) -> None:
    st = path.stat()
    assert st.st_size == 64 * MIB
    assert st.st_mode & 0o777 == 0o600
    assert st.st_blocks * 512 >= st.st_size  # really allocated: swapon rejects files with holes
    with path.open("rb") as f:
        f.seek(os.sysconf("SC_PAGE_SIZE") - 10)
        assert f.read(10) == b"SWAPSPACE2"
    assert blkid_type(path) in ("swap", None)


@pytest.mark.skipif(shutil.which("fallocate") is None, reason="util-linux fallocate is not installed")
def test_a_real_swapfile_is_allocated_formatted_and_removed(tmp_path: Path) -> None:
    host = make_host(tmp_path, real=frozenset({"fallocate", "mkswap"}))
    before = snapshot(host.root)
    plan = swap_plan(host)
    apply_plan(plan, host.ctx, host.journal)
    assert_real_swapfile(host.root.path(SWAPFILE))
    assert [c[0] for c in host.commands.calls] == ["fallocate", "mkswap", "swapon"]

    # idempotent with the real tools too: nothing is re-created or re-formatted
    again = swap_plan(host)
    assert again.changes == ()
    revert_entries(host.ctx, host.journal)
    assert snapshot(host.root) == before


def test_dd_really_writes_the_file_when_fallocate_is_not_supported(tmp_path: Path) -> None:
    host = make_host(
        tmp_path,
        real=frozenset({"dd", "mkswap"}),
        fail={"fallocate": "fallocate: fallocate failed: Operation not supported"},
    )
    apply_plan(swap_plan(host), host.ctx, host.journal)
    assert_real_swapfile(host.root.path(SWAPFILE))
    assert [c[0] for c in host.commands.calls] == ["fallocate", "dd", "mkswap", "swapon"]


def cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "APPLIANCE_HOME": str(home)}
    return subprocess.run(
        [str(APPLIANCE), "host", *args], capture_output=True, text=True, env=env, timeout=300
    )


@pytest.mark.skipif(
    not APPLIANCE.exists(), reason="the appliance console script is not installed in this venv"
)
def test_the_console_script_round_trips_recipe_c_on_a_fixture_tree(tmp_path: Path) -> None:
    host = make_host(tmp_path)
    root = str(host.root.base)
    journal = str(tmp_path / "journal.json")
    before = snapshot(host.root)

    shown = cli("plan", "gfx906-c-tp4-graph-piecewise", "--host-root", root, "--json", home=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert len(json.loads(shown.stdout)["changes"]) == 14

    applied = cli(
        "apply",
        "gfx906-c-tp4-graph-piecewise",
        "--yes",
        "--host-root",
        root,
        "--journal",
        journal,
        home=tmp_path,
    )
    assert applied.returncode == 0, applied.stderr
    assert {acs_control(host.root, b) for b in BRIDGES} == {0x0011}
    assert (host.root.proc / "sys/vm/swappiness").read_text().strip() == "200"

    # a new process (a restarted controller) reverts from the journal alone
    reverted = cli("revert", "--yes", "--host-root", root, "--journal", journal, home=tmp_path)
    assert reverted.returncode == 0, reverted.stderr
    assert snapshot(host.root) == before


@pytest.mark.skipif(
    not APPLIANCE.exists(), reason="the appliance console script is not installed in this venv"
)
def test_reading_the_real_host_works_and_changes_nothing(tmp_path: Path) -> None:
    facts = cli("facts", "--json", home=tmp_path)
    assert facts.returncode == 0, facts.stderr
    assert json.loads(facts.stdout)["mem_total_bytes"] > 0

    plan = cli("plan", "cpu-smollm2", "--json", home=tmp_path)
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["changes"] == []  # the CPU recipe asks nothing of the host

    shown = cli("acs", "show", "--json", home=tmp_path)
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert isinstance(data["gpus"], list)  # none on this machine; the real sysfs was walked
    assert not (tmp_path / "host-changes.json").exists()


def test_real_config_spaces_are_read_or_refused_with_a_reason() -> None:
    devices = Path("/sys/bus/pci/devices")
    if not devices.is_dir() or not any(devices.iterdir()):
        pytest.skip("no PCI devices visible")
    access = SysfsConfigAccess(HostRoot())
    outcomes: list[int | str | None] = []
    for dev in sorted(devices.iterdir()):
        try:
            outcomes.append(access.acs_offset(dev.name))
        except AcsUnreadable as exc:  # a VM's virtio devices have 256-byte conventional config spaces
            outcomes.append(str(exc))
    assert outcomes
    assert all(isinstance(o, int | str) or o is None for o in outcomes)
