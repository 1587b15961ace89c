"""memlock: the limit the engine will see, fixed per runtime (DOMAIN §3, S11f §10.1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from appliance.runtimes.base import Placement
from host_setup.executor import apply_plan, revert_entries
from host_setup.memlock import DAEMON_JSON, LIMITS_CONF, plan_memlock, read_memlock_state
from host_setup.model import HostPlan, PlanRefused, Severity
from tests.fixtures.host_setup.tree import Host, as_plan, make_host, set_text, snapshot


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return make_host(tmp_path)


def memlock_plan(host: Host, runtime: str, container: int | None, required: bool = True) -> HostPlan:
    placement = Placement.LOCAL_DAEMON if runtime == "docker" else Placement.LOCAL_PROCESS
    state = read_memlock_state(host.root, placement)
    return as_plan(host.root, plan_memlock(state, required, container))


def daemon(host: Host) -> dict[str, object]:
    data = json.loads(host.root.path(DAEMON_JSON).read_text())
    assert isinstance(data, dict)
    return data


def test_docker_container_with_its_own_unlimited_memlock_needs_no_host_change(host: Host) -> None:
    plan = memlock_plan(host, "docker", -1)
    assert plan.changes == ()
    assert plan.findings[0].severity is Severity.OK
    assert "--ulimit memlock=-1" in plan.findings[0].message
    # dockerd's own limit (proc/<dockerd pid>/limits) is what containers would get otherwise: 64 MiB
    assert "64 MiB" in plan.findings[1].message


def test_without_a_container_ulimit_the_daemon_default_is_set_and_revert_keeps_other_keys(host: Host) -> None:
    set_text(
        host.root,
        DAEMON_JSON,
        '{"log-driver": "json-file", "default-ulimits": {"nofile": '
        '{"Name": "nofile", "Soft": 65536, "Hard": 65536}}}\n',
    )
    plan = memlock_plan(host, "docker", None)
    (change,) = plan.changes
    assert change.before == "containers get memlock 64 MiB"
    assert any("restart dockerd" in f.fix for f in plan.findings)
    apply_plan(plan, host.ctx, host.journal)
    ulimits = daemon(host)["default-ulimits"]
    assert isinstance(ulimits, dict)
    assert ulimits["memlock"] == {"Name": "memlock", "Soft": -1, "Hard": -1}
    assert ulimits["nofile"]["Soft"] == 65536
    assert memlock_plan(host, "docker", None).changes == ()  # idempotent

    # someone edits daemon.json meanwhile: revert removes only our key
    data = daemon(host)
    data["registry-mirrors"] = ["https://mirror.example"]
    set_text(host.root, DAEMON_JSON, json.dumps(data))
    revert_entries(host.ctx, host.journal)
    after = daemon(host)
    assert after["registry-mirrors"] == ["https://mirror.example"]
    assert after["log-driver"] == "json-file"
    assert after["default-ulimits"] == {"nofile": {"Name": "nofile", "Soft": 65536, "Hard": 65536}}


def test_daemon_json_created_by_apply_is_removed_by_revert(host: Host) -> None:
    before = snapshot(host.root)
    apply_plan(memlock_plan(host, "docker", None), host.ctx, host.journal)
    assert host.root.path(DAEMON_JSON).exists()
    revert_entries(host.ctx, host.journal)
    assert snapshot(host.root) == before


def test_a_previous_memlock_default_is_restored(host: Host) -> None:
    old = {"Name": "memlock", "Soft": 67108864, "Hard": 67108864}
    set_text(host.root, DAEMON_JSON, json.dumps({"default-ulimits": {"memlock": old}}))
    apply_plan(memlock_plan(host, "docker", None), host.ctx, host.journal)
    revert_entries(host.ctx, host.journal)
    assert daemon(host) == {"default-ulimits": {"memlock": old}}


def test_a_broken_daemon_json_is_an_error_and_nothing_is_written(host: Host) -> None:
    set_text(host.root, DAEMON_JSON, '{"log-driver": "json-file",}\n')
    before = snapshot(host.root)
    plan = memlock_plan(host, "docker", None)
    (error,) = plan.blockers()
    assert f"cannot parse {DAEMON_JSON}" in error.message and "line 1" in error.message
    with pytest.raises(PlanRefused):
        apply_plan(plan, host.ctx, host.journal)
    assert snapshot(host.root) == before


def test_bare_process_gets_limits_d_and_a_warning_about_the_controller_limit(host: Host) -> None:
    before = snapshot(host.root)
    plan = memlock_plan(host, "process", None)
    (change,) = plan.changes
    assert change.action.kind == "limits-conf" and change.action.host_path == LIMITS_CONF
    (warning,) = [f for f in plan.findings if f.severity is Severity.WARN]
    assert "memlock 8 MiB" in warning.message and "LimitMEMLOCK=infinity" in warning.fix
    apply_plan(plan, host.ctx, host.journal)
    text = host.root.path(LIMITS_CONF).read_text()
    assert "root soft memlock unlimited" in text and "*    hard memlock unlimited" in text
    assert memlock_plan(host, "process", None).changes == ()
    revert_entries(host.ctx, host.journal)
    assert snapshot(host.root) == before


def test_nothing_when_the_recipe_does_not_need_unlimited_memlock(host: Host) -> None:
    plan = memlock_plan(host, "process", None, required=False)
    assert (plan.changes, plan.findings) == ((), ())
