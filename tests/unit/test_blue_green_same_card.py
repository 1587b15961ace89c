"""Blue/green on the SAME GPU card (blue_green.py `same_card_fit`): the new engine starts beside the
serving one on its card when, for every card it uses, NVML's free memory now (the serving engine's
share already out of it) minus vLLM's request (gpu_memory_utilization × total) and the new engine's
CUDA context leaves at least the safety margin. Read through the seam the controller uses
(controller/supervisor/gpu_memory_check.py `GpuMemoryLink`) over the fake NVML reader of
test_gpu_kv_admission.py; the recorded H200's total (150754820096 B = 140.40 GiB)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from appliance.host_facts import GIB, HostFacts
from appliance.observe.gpu_mem import GpuSample
from appliance.recipe.gpu_kv_admission import CUDA_CONTEXT_GIB, CardMemory, GpuMemoryView
from appliance.recipe.launch_spec import LaunchSpec
from appliance.recipe.recipe_model import Recipe
from appliance.recipe.render import render
from controller.api_client import Client
from controller.evaluation.compare import Control
from controller.evaluation.controls import driver_control, http_control
from controller.service import ServiceConfig, build
from controller.store import Store
from controller.supervisor.blue_green import SAME_CARD_MARGIN_GIB, BesideCheck, decide
from controller.supervisor.driver import Driver
from controller.supervisor.gpu_memory_check import GpuMemoryLink
from controller.supervisor.machine import State
from controller.supervisor.preflight import Preflight
from controller.supervisor.signals import Apply, Restart
from tests.unit.recipe_helpers import fixed_facts, shipped, with_changes
from tests.unit.supervisor_helpers import FakeClock, FakeRuntime, make_handle, make_spec
from tests.unit.test_gpu_kv_admission import Reader
from tests.unit.test_supervisor_driver import Rig, make_rig

ROOT = Path(__file__).resolve().parents[2]
TOTAL = 150754820096  # the recorded H200 (NVML total)
GRAPH = "cuda-smollm2-graph"  # gpu_memory_utilization 0.3
MARGIN = math.ceil(SAME_CARD_MARGIN_GIB * GIB)


def need(util: float = 0.3, total: int = TOTAL) -> int:
    """What vLLM asks (util × total, whole bytes up) plus the new engine's CUDA context."""
    return math.ceil(util * total) + math.ceil(CUDA_CONTEXT_GIB * GIB)


def card(index: int, free: int, total: int = TOTAL) -> GpuSample:
    return GpuSample(index=index, vendor="nvidia", used_bytes=total - free, total_bytes=total)


def nvml(*cards: GpuSample) -> GpuMemoryView:
    """The cards as blue/green reads them: the serving engine runs on, nothing counted back."""
    return GpuMemoryLink(Reader(list(cards))).view(replaces_running=False)


def facts(available_gib: float = 40.0) -> HostFacts:
    return fixed_facts().model_copy(update={"mem_available_bytes": round(available_gib * GIB)})


def launch(devices: list[int], recipe: str = GRAPH) -> tuple[Recipe, LaunchSpec]:
    changed = with_changes(shipped()[recipe], devices=devices)
    return changed, render(changed, fixed_facts())


def everywhere(host: str, port: int) -> bool:
    return True


# --- the rule at its boundaries ------------------------------------------------------------------


def test_a_shared_card_fits_at_exactly_the_margin_and_not_one_byte_under() -> None:
    new, spec = launch([0])
    _, serving = launch([0])
    at = decide(new, facts(), spec, serving, cold=False, is_free=everywhere,
                gpu=nvml(card(0, need() + MARGIN)))
    assert at.fits is True and at.port == 8001, at.why
    assert at.numbers["gpu_placement"] == "same_card" and at.numbers["gpu0_left_gib"] == SAME_CARD_MARGIN_GIB
    assert "same-card blue/green: GPU 0 free now" in at.why and "≥ the margin 4.00 GiB" in at.why
    under = decide(new, facts(), spec, serving, cold=False, is_free=everywhere,
                   gpu=nvml(card(0, need() + MARGIN - 1)))
    assert under.fits is False and under.port is None
    assert "same-card blue/green does not fit: GPU 0 free now" in under.why
    assert "under the margin 4.00 GiB" in under.why
    # The margin is the caller's to declare: with none, the bare request fits at equality.
    bare = decide(new, facts(), spec, serving, cold=False, is_free=everywhere,
                  gpu=nvml(card(0, need())), margin_gib=0.0)
    assert bare.fits is True
    assert not decide(new, facts(), spec, serving, cold=False, is_free=everywhere,
                      gpu=nvml(card(0, need() - 1)), margin_gib=0.0).fits


def test_the_numbers_say_free_per_card_now_the_need_and_the_margin() -> None:
    # The H200 measurement: one cuda-smollm2-graph engine serving held 44.2 GiB of the card.
    new, spec = launch([0])
    _, serving = launch([0])
    free = TOTAL - round(44.2 * GIB)
    fit = decide(new, facts(), spec, serving, cold=False, is_free=everywhere, gpu=nvml(card(0, free)))
    assert fit.fits is True, fit.why
    assert {k: fit.numbers[k] for k in ("gpus", "serving_gpus", "gpu_placement", "gpu_utilization",
                                         "cuda_context_gib", "gpu_margin_gib", "gpu0_free_gib",
                                         "gpu0_total_gib", "gpu0_need_gib", "gpu0_left_gib")} == {
        "gpus": "0", "serving_gpus": "0", "gpu_placement": "same_card", "gpu_utilization": 0.3,
        "cuda_context_gib": 0.51, "gpu_margin_gib": 4.0, "gpu0_free_gib": 96.2, "gpu0_total_gib": 140.4,
        "gpu0_need_gib": 42.63, "gpu0_left_gib": 53.57}
    assert ("GPU 0 free now 96.20 GiB − need 42.63 GiB (0.3 × 140.40 GiB + 0.51 GiB CUDA context) = "
            "53.57 GiB, ≥ the margin 4.00 GiB") in fit.why


def test_two_cards_one_short_does_not_fit_and_names_the_short_one() -> None:
    new, spec = launch([0, 1])
    _, serving = launch([0])  # shares card 0 only: card 1 must still have room for the new engine
    fit = decide(new, facts(), spec, serving, cold=False, is_free=everywhere,
                 gpu=nvml(card(0, TOTAL), card(1, need() + MARGIN - 1)))
    assert fit.fits is False
    assert "GPU 1 free now" in fit.why and "GPU 0 free now" not in fit.why
    assert fit.numbers["gpu0_left_gib"] == round((TOTAL - need()) / GIB, 2)
    assert fit.numbers["gpu1_free_gib"] == round((need() + MARGIN - 1) / GIB, 2)
    both = decide(new, facts(), spec, serving, cold=False, is_free=everywhere,
                  gpu=nvml(card(0, need() + MARGIN), card(1, need() + MARGIN)))
    assert both.fits is True, both.why
    # The other way round: the short card is the first.
    first = decide(new, facts(), spec, serving, cold=False, is_free=everywhere,
                   gpu=nvml(card(0, need()), card(1, TOTAL)))
    assert first.fits is False and "GPU 0 free now" in first.why and "GPU 1 free now" not in first.why


def test_unreadable_card_memory_fails_closed_with_the_reason() -> None:
    new, spec = launch([0])
    _, serving = launch([0])
    blind = decide(new, facts(), spec, serving, cold=False, is_free=everywhere, gpu=nvml())
    assert blind.fits is False
    assert ("same-card blue/green needs each card's free memory, and it cannot be read (no card's memory "
            "is readable: no NVML, or no GPU)") in blind.why
    assert blind.numbers["gpu_placement"] == "same_card"
    # NVML reads card 0 but not the new launch's card 1.
    two, spec2 = launch([0, 1])
    missing = decide(two, facts(), spec2, serving, cold=False, is_free=everywhere,
                     gpu=nvml(card(0, TOTAL)))
    assert missing.fits is False and "GPU 1's free memory, and NVML did not report it" in missing.why
    assert missing.numbers["gpu1_free_gib"] is None
    # A card NVML lists without its memory (free not read): not readable either.
    unread = GpuMemoryView(cards=(CardMemory(index=0, vendor="nvidia", total_bytes=TOTAL),))
    assert decide(new, facts(), spec, serving, cold=False, is_free=everywhere, gpu=unread).fits is False
    # No reader at all (a controller without the seam): a shared card holds, as before same-card.
    none = decide(new, facts(), spec, serving, cold=False, is_free=everywhere)
    assert none.fits is False and "GPU 0 would hold both engines" in none.why


def test_disjoint_cards_and_cpu_engines_are_not_judged_by_card_memory() -> None:
    new, spec = launch([1])
    _, serving = launch([0])
    apart = decide(new, facts(), spec, serving, cold=False, is_free=everywhere, gpu=nvml())
    assert apart.fits is True and apart.numbers["gpu_placement"] == "disjoint_cards"
    plain = shipped()["cpu-smollm2"]
    cpu = render(plain, fixed_facts())
    base = decide(plain, facts(12.0), cpu, serving, cold=False, is_free=everywhere, cpus=2)
    for view in (nvml(), nvml(card(0, 0))):
        judged = decide(plain, facts(12.0), cpu, serving, cold=False, is_free=everywhere, cpus=2, gpu=view)
        assert judged == base and "gpu_placement" not in judged.numbers


def test_host_ram_is_still_judged_first_on_a_shared_card() -> None:
    new, spec = launch([0])
    _, serving = launch([0])
    short = decide(new, facts(0.1), spec, serving, cold=False, is_free=everywhere, gpu=nvml(card(0, TOTAL)))
    assert short.fits is False and "MemAvailable now 0.10 GiB" in short.why
    assert "gpu_placement" not in short.numbers


# --- the seam: BesideCheck reads NVML only for a GPU launch ---------------------------------------


def test_the_check_reads_the_cards_through_its_seam_and_only_for_a_gpu_launch(tmp_path: Path) -> None:
    reads: list[int] = []

    def memory(free: int) -> Callable[[], GpuMemoryView]:
        def view() -> GpuMemoryView:
            reads.append(free)
            return nvml(card(0, free))
        return view

    new, serving = launch([0])
    check = BesideCheck(lambda name: new, facts, render, {}, is_free=everywhere,
                        gpu_memory=memory(need() + MARGIN))
    fit = check(new.name, False, serving, make_handle("old", new.name))
    assert fit.fits is True and reads == [need() + MARGIN]
    short = BesideCheck(lambda name: new, facts, render, {}, is_free=everywhere,
                        gpu_memory=memory(need() + MARGIN - 1))
    assert short(new.name, False, serving, make_handle("old", new.name)).fits is False
    plain = shipped()["cpu-smollm2"]
    cpu_check = BesideCheck(lambda name: plain, lambda: facts(12.0), render, {}, is_free=everywhere,
                            gpu_memory=memory(0))
    reads.clear()
    cpu_check(plain.name, False, serving, make_handle("old", new.name))
    assert reads == []  # a CPU launch never asks NVML
    margin = BesideCheck(lambda name: new, facts, render, {}, is_free=everywhere,
                         gpu_memory=memory(need()), margin_gib=0.0)
    assert margin(new.name, False, serving, make_handle("old", new.name)).fits is True


# --- the driver: a restart of a GPU launch, fake runtime and clock --------------------------------


def _gpu_serving_spec(cache: Path) -> LaunchSpec:
    """The rig's launch as a CUDA launch on GPU 0 (its record is what the rule reads its cards from),
    its compile cache warm (a cold start of the graph recipe is the warm-restart flow: never beside)."""
    cache.mkdir(exist_ok=True)
    (cache / "kernel.bin").write_bytes(b"x")
    spec = make_spec()
    return spec.model_copy(update={"platform": "cuda", "env": {**spec.env, "CUDA_VISIBLE_DEVICES": "0"},
                                   "cache_root": str(cache)})


def _rig(tmp_path: Path, free: int) -> Rig:
    recipe, spec = shipped()[GRAPH], _gpu_serving_spec(tmp_path / "cache")
    beside = BesideCheck(lambda name: recipe, facts, lambda r, f: spec, {}, is_free=everywhere,
                         gpu_memory=lambda: nvml(card(0, free)))
    return make_rig(tmp_path, spec=spec, beside=beside)


async def test_a_restart_that_fits_on_the_same_card_goes_blue_green_without_a_hold(tmp_path: Path) -> None:
    rig = _rig(tmp_path, TOTAL - round(44.2 * GIB))
    rig.runtime.on_start = lambda e: setattr(e, "healthy", True)
    rig.driver.submit(Apply("test-recipe"))
    await rig.run_until(lambda: rig.driver.machine.state is State.READY, 120)
    plan = rig.driver.switch_plan("test-recipe", "0123456789abcdef")
    assert plan["path"] == "blue_green"
    assert "same-card blue/green: GPU 0 free now 96.20 GiB" in str(plan["why"])
    fit = plan["fit"]
    assert isinstance(fit, dict) and fit["gpu_placement"] == "same_card" and fit["gpu0_free_gib"] == 96.2
    assert rig.driver.submit(Restart()) is None
    await rig.run_until(lambda: rig.driver.machine.state is State.READY and rig.driver.machine.old is None,
                        300)
    assert rig.gateway.calls[-1] == ("switch", "http://127.0.0.1:18001")
    assert not [h for h in rig.gateway.holds if h is not None]  # nobody was held
    assert rig.runtime.stopped == ["L1"] and rig.runtime.engines["L2"].running
    # The new launch's record says which path and why, with the numbers.
    (path,) = [e for e in rig.store.events() if e.kind == "switch-path" and e.launch_id == "L2"]
    assert path.message.startswith("blue/green: ") and "same-card blue/green: GPU 0" in path.message
    assert (path.data["path"], path.data["gpu_placement"], path.data["gpu0_free_gib"],
            path.data["gpu0_need_gib"], path.data["gpu_margin_gib"]) == ("blue_green", "same_card", 96.2,
                                                                          42.63, 4.0)
    record = rig.store.get_launch("L2")
    assert record is not None and path in record.events  # `launches L2 --json`, the console's launch page
    await rig.driver.shutdown()


async def test_a_restart_that_does_not_fit_on_the_same_card_holds_and_says_why(tmp_path: Path) -> None:
    free = need() + MARGIN - 1
    rig = _rig(tmp_path, free)
    rig.runtime.on_start = lambda e: setattr(e, "healthy", True)
    rig.driver.submit(Apply("test-recipe"))
    await rig.run_until(lambda: rig.driver.machine.state is State.READY, 120)
    plan = rig.driver.switch_plan("test-recipe", "0123456789abcdef")
    assert plan["path"] == "hold" and "Not blue/green: " in str(plan["why"])
    assert "same-card blue/green does not fit: GPU 0 free now" in str(plan["why"])
    assert rig.driver.submit(Restart()) is None
    await rig.run_until(lambda: rig.driver.machine.state is State.READY
                        and rig.driver.view.launch is not None
                        and rig.driver.view.launch.launch_id == "L2", 300)
    assert [h.reason for h in rig.gateway.holds if h is not None] == ["restart"]
    assert ("switch", "http://127.0.0.1:18001") not in rig.gateway.calls
    paths = [e for e in rig.store.events() if e.kind == "switch-path"]
    assert paths[0].launch_id == "L2" and paths[0].data["path"] == "hold"
    assert paths[0].message.startswith("hold, not blue/green: ") and "under the margin" in paths[0].message
    assert paths[0].data["gpu0_left_gib"] == round((free - need()) / GIB, 2)
    await rig.driver.shutdown()


async def test_a_restart_without_blue_green_drains_first_even_when_it_would_fit(tmp_path: Path) -> None:
    rig = _rig(tmp_path, TOTAL)
    rig.runtime.on_start = lambda e: setattr(e, "healthy", True)
    rig.driver.submit(Apply("test-recipe"))
    await rig.run_until(lambda: rig.driver.machine.state is State.READY, 120)
    assert rig.driver.switch_plan("test-recipe", drain_first=True)["path"] == "hold"
    assert rig.driver.submit(Restart(blue_green=False)) is None
    await rig.run_until(lambda: rig.driver.machine.state is State.READY
                        and rig.driver.view.launch is not None
                        and rig.driver.view.launch.launch_id == "L2", 300)
    assert [h.reason for h in rig.gateway.holds if h is not None] == ["restart"]
    await rig.driver.shutdown()


# --- the compare measures an arm alone on its card ------------------------------------------------


async def test_the_compare_waits_for_the_replaced_engine_to_be_gone_and_restarts_arms_without_blue_green(
) -> None:
    ready: dict[str, Any] = {"recipe": "g", "state": "ready", "launch": {"id": "L2"}}
    statuses = [{**ready, "blue_green": {"old": "stopping"}}, {**ready, "blue_green": None}]
    seen: list[dict[str, Any]] = []

    async def status() -> dict[str, Any]:
        seen.append(statuses[min(len(seen), len(statuses) - 1)])
        return seen[-1]

    async def nothing(*args: Any) -> Any:
        raise AssertionError("not called")

    control = Control(apply=nothing, restart=nothing, status=status, describe=nothing, poll_s=0.0)
    assert await control.wait_ready("g", 60, "L1") is statuses[1] and len(seen) == 2

    submitted: list[object] = []
    driver = SimpleNamespace(submit=lambda obs: submitted.append(obs))
    await driver_control(cast(Driver, driver), cast(Store, None), cast(Preflight, None)).restart()
    assert submitted == [Restart(blue_green=False)]
    posted: list[tuple[str, object]] = []
    client = SimpleNamespace(post=lambda path, body=None: posted.append((path, body)))
    await http_control(cast(Client, client)).restart()
    assert posted == [("/restart", {"blue_green": False})]


def test_the_service_hands_blue_green_the_same_card_memory_reader_preflight_uses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = FakeRuntime(FakeClock())
    svc = build(ServiceConfig(home=tmp_path, recipes_dir=ROOT / "recipes", docker=False),
                runtimes={"process": runtime})
    beside = svc.driver.host.beside
    assert isinstance(beside, BesideCheck) and beside.gpu_memory is not None
    preflight = svc.driver.host.preflight
    assert isinstance(preflight, Preflight)
    link = preflight.gpu_memory
    assert isinstance(link, GpuMemoryLink)
    # Blue/green reads the cards with the serving engine running: nothing counted back.
    monkeypatch.setattr(link, "reader", Reader([card(0, TOTAL // 2)], held={0: GIB}))
    view = beside.gpu_memory()
    assert view.replaces_running is False and view.held is None
    assert view.cards is not None and view.cards[0].free_bytes == TOTAL // 2
