"""The host change journal: what revert reads, possibly after a controller restart."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from host_setup.journal import Journal
from host_setup.model import Area, HostSetupError, SysctlAction, SysctlUndo

ACTION = SysctlAction(name="vm.swappiness", value="200", conf_host_path="/etc/sysctl.d/90-appliance.conf")


def undo(previous: str) -> SysctlUndo:
    return SysctlUndo(
        name="vm.swappiness",
        previous_live=previous,
        conf_host_path="/etc/sysctl.d/90-appliance.conf",
        previous_conf_value=None,
    )


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    return Journal(tmp_path / "state" / "host-changes.json", tmp_path / "host")


def test_an_entry_goes_from_applying_to_applied_to_removed(journal: Journal) -> None:
    journal.begin("sysctl.vm.swappiness", Area.SYSCTL, "recipe-c", ACTION, undo("60"))
    assert journal.get("sysctl.vm.swappiness") is not None
    assert journal.entries()[0].status == "applying"
    journal.mark_applied("sysctl.vm.swappiness")
    assert journal.entries()[0].status == "applied"
    assert stat.S_IMODE(journal.path.stat().st_mode) == 0o600
    data = json.loads(journal.path.read_text())
    assert data["version"] == 1 and data["entries"][0]["undo"]["previous_live"] == "60"
    journal.remove("sysctl.vm.swappiness")
    assert journal.entries() == ()
    # no temporary files left behind by the atomic writes
    assert [p.name for p in journal.path.parent.iterdir()] == ["host-changes.json"]


def test_the_first_original_wins(journal: Journal) -> None:
    journal.begin("sysctl.vm.swappiness", Area.SYSCTL, "recipe-c", ACTION, undo("60"))
    first = journal.entries()[0]
    journal.begin("sysctl.vm.swappiness", Area.SYSCTL, "recipe-c-prime", ACTION, undo("200"))
    (entry,) = journal.entries()
    assert entry.undo == undo("60")
    assert entry.first_applied_at == first.first_applied_at
    assert entry.recipe == "recipe-c-prime"


def test_a_restarted_reader_sees_the_same_entries(journal: Journal) -> None:
    journal.begin("sysctl.vm.swappiness", Area.SYSCTL, None, ACTION, undo("60"))
    again = Journal(journal.path, Path(journal.host_root))
    assert again.entries() == journal.entries()
    assert again.entries([Area.SWAP]) == ()


def test_a_journal_for_another_root_is_refused(journal: Journal, tmp_path: Path) -> None:
    journal.begin("sysctl.vm.swappiness", Area.SYSCTL, None, ACTION, undo("60"))
    with pytest.raises(HostSetupError, match="pass the matching --host-root"):
        Journal(journal.path, Path("/")).entries()


def test_a_damaged_journal_is_a_clear_error(journal: Journal) -> None:
    journal.path.parent.mkdir(parents=True)
    journal.path.write_text('{"version": 1, "host_root": "x", "entries": [{"id": 1}]}')
    with pytest.raises(HostSetupError, match=r"unreadable .* revert cannot know what to undo"):
        journal.entries()


def test_no_journal_means_no_changes(journal: Journal) -> None:
    assert journal.entries() == ()
    assert not journal.path.exists()


def test_two_writers_at_once_are_refused(journal: Journal) -> None:
    second = Journal(journal.path, Path(journal.host_root))
    with (
        journal.locked(),
        pytest.raises(HostSetupError, match="another `appliance host apply/revert`"),
        second.locked(),
    ):
        pass
    with journal.locked():  # released afterwards
        pass
