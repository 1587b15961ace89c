"""Prometheus follows the engine through a blue/green switch: a real Prometheus (Debian's 2.42) reads
the file_sd list the supervisor's driver writes (controller/supervisor/scrape_targets.py).

The driver is the controller's own (`Driver`, the machine, the writer), through a blue/green switch:
its runtime and prober are the unit tests' fakes (tests/unit/supervisor_helpers.py), and each fake
engine's port is served by a real HTTP metrics endpoint (prometheus_client), one per engine, so what
Prometheus scrapes is a real target at the address the controller publishes. Scrape → switch → the
new engine up under its own labels and the old one gone from /api/v1/targets and from a query.
Waits are bounded polls, never fixed sleeps.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from controller.supervisor.machine import State
from controller.supervisor.signals import Apply, Stop
from tests.integration.prometheus_harness import PROMETHEUS, Prometheus, free_port, until
from tests.unit.supervisor_helpers import make_spec
from tests.unit.test_supervisor_blue_green import _fits
from tests.unit.test_supervisor_driver import make_rig

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (scripts/setup-system.sh)"),
]

DEADLINE_S = 60.0  # liveness: a 1 s scrape and a 1 s file_sd refresh on a loaded 2-core machine


def _engine_endpoint(port: int) -> Iterator[None]:
    """A real /metrics on 127.0.0.1:port whose one gauge names the port (which engine answered)."""
    registry = CollectorRegistry()
    Gauge("fake_engine_port", "the port this engine listens on", registry=registry).set(port)
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        yield
    finally:
        server.shutdown()
        thread.join(5)


@pytest.fixture
def engines() -> Iterator[tuple[int, int]]:
    blue, green = free_port(), free_port()
    gens = [_engine_endpoint(blue), _engine_endpoint(green)]
    for g in gens:
        next(g)
    try:
        yield blue, green
    finally:
        for g in gens:
            next(g, None)


def _scraped(prom: Prometheus) -> dict[str, dict[str, str]] | None:
    """instance → labels of the vllm-engine targets Prometheus has and scraped healthy; None while any
    active target is not (yet) up."""
    targets = prom.active_targets("vllm-engine")
    if not targets or any(t["health"] != "up" for t in targets):
        return None
    return {t["labels"]["instance"]: t["labels"] for t in targets}


async def test_prometheus_scrapes_the_new_engine_after_a_blue_green_switch_and_drops_the_old(
    tmp_path: Path, engines: tuple[int, int]
) -> None:
    blue, green = engines
    targets = tmp_path / "home" / "prometheus" / "engines.json"
    rig = make_rig(tmp_path, make_spec(port=blue), beside=_fits(green), scrape_targets=targets)
    rig.runtime.on_start = lambda e: setattr(e, "healthy", True)
    scrape = (
        "  - job_name: vllm-engine\n    metrics_path: /metrics\n    file_sd_configs:\n"
        f"      - files: ['{targets.parent}/*.json']\n        refresh_interval: 1s\n"
    )
    prom = Prometheus(tmp_path / "prom", scrape)
    try:
        rig.driver.submit(Apply("test-recipe"))
        await rig.run_until(lambda: rig.driver.machine.state is State.READY, 120)
        first = until("Prometheus to scrape the first engine", lambda: _scraped(prom), DEADLINE_S)
        assert set(first) == {f"127.0.0.1:{blue}"}
        assert {k: first[f"127.0.0.1:{blue}"][k] for k in ("recipe", "launch", "model")} == {
            "recipe": "test-recipe", "launch": "L1", "model": "smollm2"}
        until("the first engine's series", lambda: prom.series("fake_engine_port") or None, DEADLINE_S)
        print(f"\n[prometheus] before the switch: {first}")

        # Blue/green: L2 starts beside L1 on the green port, the gateway switches, L1 is stopped.
        assert rig.driver.submit(Apply("test-recipe", force=True)) is None
        await rig.run_until(
            lambda: rig.driver.machine.state is State.READY and rig.driver.machine.old is None, 300)
        assert rig.runtime.stopped == ["L1"]

        def only_green() -> dict[str, dict[str, str]] | None:
            now = _scraped(prom)
            return now if now is not None and set(now) == {f"127.0.0.1:{green}"} else None

        after = until("Prometheus to follow the switch to the new engine", only_green, DEADLINE_S)
        assert after[f"127.0.0.1:{green}"]["launch"] == "L2"
        # A query sees the new engine only: the old target's series ended with a staleness marker.
        def up_green_alone() -> list[dict[str, Any]] | None:
            series = prom.series('up{job="vllm-engine"}')
            return series if {s["metric"]["instance"] for s in series} == {f"127.0.0.1:{green}"} else None

        up = until("up to show the new engine alone", up_green_alone, DEADLINE_S)
        assert [s["value"][1] for s in up] == ["1"] and up[0]["metric"]["launch"] == "L2"
        ports = until("the new engine's series alone", lambda: (
            r if len(r := prom.series("fake_engine_port")) == 1 else None), DEADLINE_S)
        assert ports[0]["value"][1] == str(green) and ports[0]["metric"]["launch"] == "L2"
        print(f"[prometheus] after the switch: {after}; up: {[s['metric'] for s in up]}")

        # Stop: nothing left to scrape.
        rig.driver.submit(Stop())
        await rig.run_until(lambda: rig.driver.machine.state is State.IDLE, 120)
        until("the target list to empty", lambda: True if prom.active_targets("vllm-engine") == [] else None,
              DEADLINE_S)
    finally:
        prom.stop()
        await rig.driver.shutdown()
