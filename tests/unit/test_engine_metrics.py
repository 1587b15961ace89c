"""`GET /metrics` of several engines (controller/supervisor/engine_metrics.py): each engine beside the
primary records into a registry of its own; the exposition merges its per-engine families into the
primary's, one family per name, its samples labelled with its model, the primary's untouched, the
host's series once; promtool accepts the text; an engine that left the set leaves it."""

from __future__ import annotations

import collections
import re
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from controller import admin_token
from controller.metrics import PER_ENGINE_FAMILIES, ControllerMetrics
from controller.supervisor.machine import State
from tests.unit.engine_set_helpers import SetRig
from tests.unit.promtool_helpers import PROMTOOL

TOKEN = "adm_test-token-not-secret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BESIDE = "smollm2-b"  # cpu-beside's served name (engine_set_helpers.RECIPES)

SampleKey = tuple[str, frozenset[tuple[str, str]], float]


@pytest.fixture
def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SetRig:
    monkeypatch.delenv(admin_token.HASH_ENV, raising=False)
    admin_token.write_hash(tmp_path, TOKEN)
    return SetRig(tmp_path)


@pytest.fixture
async def client(rig: SetRig) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=rig.app),
                                 base_url="http://127.0.0.1:8090") as c:
        yield c


async def until(rig: SetRig, check: Callable[[], bool]) -> None:
    for _ in range(20):
        if check():
            return
        rig.healthy()
        await rig.step()
    assert check()


async def both_ready(rig: SetRig, client: httpx.AsyncClient) -> None:
    assert (await client.post("/apply", json={"recipe": "cpu-smollm2"}, headers=AUTH)).status_code == 202
    await until(rig, lambda: rig.primary.view.state is State.READY)
    r = await client.post("/apply", json={"recipe": "cpu-beside", "alongside": True}, headers=AUTH)
    assert r.status_code == 202, r.text
    await until(rig, lambda: BESIDE in rig.engines.alongside
                and rig.engines.alongside[BESIDE].view.state is State.READY)


async def metrics_text(client: httpx.AsyncClient) -> str:
    r = await client.get("/metrics")
    assert r.status_code == 200
    return r.text


def samples(text: str) -> set[SampleKey]:
    return {(s.name, frozenset(s.labels.items()), s.value)
            for family in text_string_to_metric_families(text) for s in family.samples}


def family_of(text: str) -> dict[str, str]:
    """sample name → its family's name (the text format writes a counter's or histogram's `_created`
    samples as a gauge family of their own: they belong to the family they are named after)."""
    return {s.name: family.name.removesuffix("_created")
            for family in text_string_to_metric_families(text) for s in family.samples}


async def test_metrics_carry_the_engine_beside_the_primary_under_the_same_families_by_model(
    rig: SetRig, client: httpx.AsyncClient,
) -> None:
    await both_ready(rig, client)
    text = await metrics_text(client)
    # One HELP and one TYPE per family: a family written twice makes the text format invalid.
    for kind in ("HELP", "TYPE"):
        counts = collections.Counter(re.findall(rf"^# {kind} (\S+)", text, re.M))
        assert counts and max(counts.values()) == 1, [n for n, c in counts.items() if c > 1]
    found = samples(text)
    model = ("model", BESIDE)
    # The engine beside the primary: its state, readiness and launch, each under its model.
    assert ("appliance_engine_ready", frozenset({("recipe", "cpu-beside"), model}), 1.0) in found
    assert ("appliance_engine_state", frozenset({("state", "ready"), model}), 1.0) in found
    assert ("appliance_engine_state", frozenset({("state", "starting"), model}), 0.0) in found
    launched = frozenset({("recipe", "cpu-beside"), ("cache", "cold"), model})
    assert ("appliance_engine_launches_total", launched, 1.0) in found
    # The primary's samples are exactly its own registry's: no label added, nothing missing.
    primary = samples(rig.primary.metrics.render()[0].decode())
    assert {s for s in found if "model" not in dict(s[1])} == primary
    assert ("appliance_engine_ready", frozenset({("recipe", "cpu-smollm2")}), 1.0) in primary
    # Only the per-engine families carry engines beside it: the host's series are the primary's alone.
    families = family_of(text)
    labelled = {families[name] for name, labels, _ in found if "model" in dict(labels)}
    assert labelled <= PER_ENGINE_FAMILIES, labelled - PER_ENGINE_FAMILIES
    assert {"appliance_engine_state", "appliance_engine_ready", "appliance_engine_launches"} <= labelled
    host = [s for s in found if s[0] == "appliance_host_memory_total_bytes"]
    assert len(host) == 1 and "model" not in dict(host[0][1])


async def test_an_engine_that_left_the_set_leaves_metrics(rig: SetRig, client: httpx.AsyncClient) -> None:
    await both_ready(rig, client)
    assert any(("model", BESIDE) in labels for _, labels, _ in samples(await metrics_text(client)))
    assert (await client.post("/stop", json={"model": BESIDE}, headers=AUTH)).status_code == 202
    await until(rig, lambda: BESIDE not in rig.engines.alongside)
    text = await metrics_text(client)
    assert not [s for s in samples(text) if "model" in dict(s[1])]
    assert text == rig.primary.metrics.render()[0].decode()  # the primary's registry alone again


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (scripts/setup-system.sh)")
async def test_promtool_accepts_the_merged_exposition(rig: SetRig, client: httpx.AsyncClient) -> None:
    await both_ready(rig, client)
    text = await metrics_text(client)
    assert PROMTOOL is not None
    res = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True,
                         timeout=60, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    # The same check refuses a family written twice (what a naive concatenation of registries gives).
    twice = text + rig.engines.alongside[BESIDE].metrics.render()[0].decode()
    res = subprocess.run([PROMTOOL, "check", "metrics"], input=twice, capture_output=True, text=True,
                         timeout=60, check=False)
    assert res.returncode != 0


def _keyed(metrics: ControllerMetrics) -> set[tuple[str, SampleKey]]:
    """(family, sample) of a registry, creation timestamps aside (they differ between registries)."""
    return {(family.name, (s.name, frozenset(s.labels.items()), s.value))
            for family in text_string_to_metric_families(metrics.render()[0].decode())
            for s in family.samples if not s.name.endswith("_created")}


async def test_a_driver_writes_only_the_families_exported_per_engine(
    rig: SetRig, client: httpx.AsyncClient,
) -> None:
    # A family a driver writes but PER_ENGINE_FAMILIES does not name would be missing for every
    # engine beside the primary: start, ready, restart and stop one, and see what it wrote.
    fresh = _keyed(ControllerMetrics())
    await both_ready(rig, client)
    beside = rig.engines.alongside[BESIDE]

    def written_now() -> set[str]:
        return {family for family, _ in _keyed(beside.metrics) ^ fresh}

    written = written_now()
    first = beside.view.launch
    assert first is not None
    assert (await client.post("/restart", json={"model": BESIDE}, headers=AUTH)).status_code == 202
    await until(rig, lambda: beside.view.state is State.READY and beside.view.launch is not None
                and beside.view.launch.launch_id != first.launch_id)
    written |= written_now()
    assert (await client.post("/stop", json={"model": BESIDE}, headers=AUTH)).status_code == 202
    await until(rig, lambda: BESIDE not in rig.engines.alongside)
    written |= written_now()
    assert {"appliance_engine_state", "appliance_engine_ready", "appliance_engine_launches",
            "appliance_engine_switches"} <= written  # the check sees what a driver writes
    assert written <= PER_ENGINE_FAMILIES, written - PER_ENGINE_FAMILIES
