"""A runtime whose engine runs on another node (placement REMOTE, e.g. Kubernetes): this host's plan
changes nothing about memlock or the container daemon for it, and names what the node must have."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.runtimes import docker
from appliance.runtimes.base import Placement, RuntimeTraits
from host_setup.model import Area, Severity
from host_setup.planner import plan_host
from tests.fixtures.host_setup.tree import make_host
from tests.unit.test_host_apply import RECIPE_C


class RemotePlugin(docker.DockerPlugin):
    """The docker plug-in, but placed on another node (a pure half a cluster runtime would have)."""

    traits = RuntimeTraits(sets_own_memlock=True, own_cgroup=True, placement=Placement.REMOTE,
                           console_script=True)

    def host_plan_notes(self, recipe: object) -> list[str]:
        return ["the node must allow memlock=unlimited for the engine's container"]


def test_a_remote_runtime_plans_nothing_here_and_says_what_the_node_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = make_host(tmp_path)
    local = plan_host(RECIPE_C, host.ctx, host.journal, appliance_home=Path("/var/lib/appliance"))
    # recipe C in a local container: the memlock check and the daemon's cgroup findings
    assert any(f.area is Area.MEMLOCK for f in local.findings)
    assert any(f.message.startswith("docker:") for f in local.findings)

    monkeypatch.setattr("appliance.runtimes.registry.for_recipe", lambda recipe: RemotePlugin())
    remote = plan_host(RECIPE_C, host.ctx, host.journal, appliance_home=Path("/var/lib/appliance"))
    assert not any(c.area is Area.MEMLOCK for c in remote.changes)
    assert not any(f.area is Area.MEMLOCK for f in remote.findings)
    assert not any(f.message.startswith("docker:") for f in remote.findings)
    notes = [f for f in remote.findings if f.area is Area.RUNTIME and f.severity is Severity.INFO]
    assert "the node must allow memlock=unlimited for the engine's container" in [f.message for f in notes]
