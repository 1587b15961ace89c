"""`appliance host facts|plan|apply|revert` and `appliance host acs show|apply|revert` on a fixture
tree (`--host-root`): exit codes 0 / 1 errors / 2 bad input or not root / 3 not confirmed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner, Result

from controller.cli import host_cmd
from host_setup.acs import UNIT_HOST_PATH
from tests.fixtures.host_setup.tree import BRIDGES, Host, acs_control, make_host, snapshot

RECIPE_C = "gfx906-c-tp4-graph-piecewise"


def make_app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        """Keep `host` a sub-command even when it is the only group."""

    host_cmd.register(app)
    return app


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Host:
    monkeypatch.setenv("APPLIANCE_HOME", str(tmp_path / "home"))
    return make_host(tmp_path)


def run(host: Host, *args: str, journal: bool = True) -> Result:
    extra = ["--host-root", str(host.root.base)]
    if journal:
        extra += ["--journal", str(host.journal.path)]
    return CliRunner().invoke(make_app(), ["host", *args, *extra])


def test_facts_reads_the_tree(host: Host) -> None:
    result = CliRunner().invoke(make_app(), ["host", "facts", "--json", "--host-root", str(host.root.base)])
    assert result.exit_code == 0, result.output
    facts = json.loads(result.stdout)
    assert facts["swappiness"] == 60 and len(facts["gpus"]) == 4


def test_plan_lists_changes_with_their_reasons(host: Host) -> None:
    result = run(host, "plan", RECIPE_C)
    assert result.exit_code == 0, result.output
    assert "swap.swapfile" in result.stdout and "S14c" in result.stdout
    assert "vm.swappiness = 60 (in /etc/sysctl.d/90-appliance.conf: not set)" in result.stdout
    assert result.stdout.count("why:  DOMAIN §6") == 1  # 12 bridges, one reason printed once


def test_plan_json_uses_from_and_to(host: Host) -> None:
    result = run(host, "plan", RECIPE_C, "--json", "--only", "sysctl")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    (change,) = plan["changes"]
    assert change["from"].startswith("vm.swappiness = 60") and change["to"] == "vm.swappiness = 200"


def test_apply_without_yes_prints_the_plan_changes_nothing_and_exits_3(host: Host) -> None:
    before = snapshot(host.root)
    result = run(host, "apply", RECIPE_C)
    assert result.exit_code == 3
    assert "not applied" in result.stdout and "Re-run with --yes" in result.stderr
    assert snapshot(host.root) == before and not host.journal.path.exists()


def test_apply_yes_then_revert_yes_round_trip(host: Host) -> None:
    before = snapshot(host.root)
    applied = run(host, "apply", RECIPE_C, "--yes")
    assert applied.exit_code == 0, applied.output
    assert "applied [sysctl] sysctl.vm.swappiness: vm.swappiness = 60" in applied.stdout
    assert "Still needs attention" in applied.stdout and "pci=disable_acs_redir=" in applied.stdout
    assert {acs_control(host.root, b) for b in BRIDGES} == {0x0011}

    again = run(host, "apply", RECIPE_C, "--yes")
    assert again.exit_code == 0 and "Nothing to change" in again.stdout

    listed = run(host, "revert")
    assert listed.exit_code == 3 and "14 change(s) would be reverted" in listed.stdout

    reverted = run(host, "revert", "--yes", "--json")
    assert reverted.exit_code == 0, reverted.output
    assert len(json.loads(reverted.stdout)["entries"]) == 14
    assert snapshot(host.root) == before


def test_apply_only_some_areas(host: Host) -> None:
    result = run(host, "apply", RECIPE_C, "--only", "swap,sysctl", "--yes", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["applied_ids"] == ["swap.swapfile", "sysctl.vm.swappiness"]
    assert {acs_control(host.root, b) for b in BRIDGES} == {0x001D}


def test_bad_input_exits_with_a_clear_message_and_changes_nothing(host: Host) -> None:
    before = snapshot(host.root)
    unknown_area = run(host, "apply", RECIPE_C, "--only", "swap,gpu", "--yes")
    assert unknown_area.exit_code == 2
    assert (
        "unknown area 'gpu' in --only (valid: swap, sysctl, memlock, acs, boot, runtime)"
        in unknown_area.stderr
    )
    unknown_recipe = run(host, "plan", "no-such-recipe")
    assert unknown_recipe.exit_code == 2 and "no recipe named 'no-such-recipe'" in unknown_recipe.stderr
    abstract = run(host, "plan", "gfx906-base")
    assert abstract.exit_code == 2 and "abstract base recipe" in abstract.stderr
    malformed = run(host, "plan", RECIPE_C, "--sysctl", "vm.swappiness")
    assert malformed.exit_code == 2 and "--sysctl expects NAME=VALUE" in malformed.stderr
    unknown_sysctl = run(host, "apply", RECIPE_C, "--sysctl", "vm.no_such_knob=1", "--yes")
    assert unknown_sysctl.exit_code == 1
    assert "nothing was changed" in unknown_sysctl.stderr and "vm.no_such_knob" in unknown_sysctl.stderr
    assert snapshot(host.root) == before


def test_plan_with_errors_exits_1(host: Host) -> None:
    result = run(host, "plan", RECIPE_C, "--sysctl", "vm.no_such_knob=1")
    assert result.exit_code == 1
    assert "ERROR [sysctl] unknown sysctl 'vm.no_such_knob'" in result.stdout


def test_the_default_journal_lives_inside_the_host_root(host: Host, tmp_path: Path) -> None:
    result = run(host, "apply", RECIPE_C, "--only", "sysctl", "--yes", journal=False)
    assert result.exit_code == 0, result.output
    assert host.root.path(str(tmp_path / "home" / "host-changes.json")).exists()
    assert run(host, "revert", "--yes", journal=False).exit_code == 0


def test_apply_and_revert_on_the_real_host_need_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("APPLIANCE_HOME", str(tmp_path / "home"))
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    runner = CliRunner()
    applied = runner.invoke(make_app(), ["host", "apply", "cpu-smollm2", "--yes"])
    assert applied.exit_code == 2
    assert "needs root: run it with sudo, or pass --host-root DIR" in applied.stderr
    reverted = runner.invoke(make_app(), ["host", "revert", "--yes"])
    assert reverted.exit_code == 2 and "needs root" in reverted.stderr


# --- acs ----------------------------------------------------------------------------------------


def test_acs_show(host: Host) -> None:
    text = run(host, "acs", "show", journal=False)
    assert text.exit_code == 0, text.output
    assert "0000:00:01.1  above 0000:03:00.0" in text.stdout and "redirect ON" in text.stdout
    assert "boot parameter: not set" in text.stdout and "can_device_access_peer" in text.stdout
    data = json.loads(run(host, "acs", "show", "--json", journal=False).stdout)
    assert [b["bdf"] for b in data["bridges"]] == BRIDGES
    assert {b["control"] for b in data["bridges"]} == {"0x001d"}


def test_acs_apply_unit_then_revert_keeps_the_unit_until_asked(host: Host) -> None:
    before = snapshot(host.root)
    result = run(host, "acs", "apply", "--unit", "--yes")
    assert result.exit_code == 0, result.output
    unit = host.root.path(UNIT_HOST_PATH).read_text()
    assert "host acs apply --yes" in unit and "host acs revert --yes" in unit
    assert {acs_control(host.root, b) for b in BRIDGES} == {0x0011}

    assert run(host, "acs", "revert", "--yes").exit_code == 0
    assert {acs_control(host.root, b) for b in BRIDGES} == {0x001D}
    assert host.root.path(UNIT_HOST_PATH).exists()  # what ExecStop runs must not remove the unit

    assert run(host, "acs", "revert", "--unit", "--yes").exit_code == 0
    assert snapshot(host.root) == before


def test_acs_apply_on_a_device_without_acs_is_refused(host: Host) -> None:
    result = run(host, "acs", "apply", "--device", "0000:03:00.0", "--yes")  # a GPU, not a bridge
    assert result.exit_code == 1
    assert "0000:03:00.0: no ACS capability" in result.stderr and "nothing was changed" in result.stderr


def test_acs_clear_all(host: Host) -> None:
    assert run(host, "acs", "apply", "--clear", "all", "--yes").exit_code == 0
    assert {acs_control(host.root, b) for b in BRIDGES} == {0x0000}
