"""Blue/green switches: the new engine starts beside the serving one when it fits (blue_green.py), the
gateway is switched once it is ready and the old one is drained and stopped (machine.py's `old`); a
new engine that fails leaves the old one serving; one that does not fit takes the hold path."""

from __future__ import annotations

from pathlib import Path

from appliance.host_facts import GIB, HostFacts
from appliance.recipe.launch_port import on_port
from appliance.recipe.launch_spec import LaunchSpec
from appliance.recipe.recipe_model import Recipe
from appliance.recipe.render import render
from controller.runtime.base import EngineHandle, ExitInfo
from controller.supervisor.blue_green import (
    BIND_ENV,
    BesideCheck,
    Fit,
    bound_cores,
    decide,
    launch_cards,
    pick_port,
)
from controller.supervisor.host_seams import BesideFn
from controller.supervisor.machine import Machine, State, transition
from controller.supervisor.preflight import UnknownRecipe
from controller.supervisor.signals import (
    Action,
    Apply,
    ClearUpstream,
    Drained,
    DrainGateway,
    Exited,
    ExitSeen,
    Failure,
    Launched,
    LaunchFailed,
    MarkEnded,
    Observation,
    PreflightOk,
    ReadyProbed,
    Reject,
    SetUpstream,
    StartEngine,
    Stop,
    StopEngine,
    Stopped,
    SwitchUpstream,
)
from tests.unit.recipe_helpers import fixed_facts, shipped, with_changes
from tests.unit.supervisor_helpers import FakeEngine, make_handle, make_spec
from tests.unit.test_supervisor_driver import make_rig

CRASH = Failure("signal-kill", "killed by SIGKILL", "", retryable=True)
GONE = ExitInfo(running=False, signal=15)


def _feed(m: Machine, obs: Observation, now: float, out: list[Action]) -> Machine:
    m, actions = transition(m, obs, now)
    out.extend(actions)
    return m


def _ready(recipe: str = "a") -> tuple[Machine, list[Action]]:
    out: list[Action] = []
    m = _feed(Machine(), Apply(recipe), 0, out)
    m = _feed(m, PreflightOk(m.token, "L1", make_spec(recipe=recipe), False, False), 1, out)
    m = _feed(m, Launched("L1", make_handle("L1", recipe=recipe, started_at=1)), 1, out)
    m = _feed(m, ReadyProbed("L1"), 50, out)
    assert m.state is State.READY
    return m, out


def _beside(recipe: str = "b") -> tuple[Machine, list[Action]]:
    """Ready on `a` (L1, port 18000), then an apply of `recipe` that fits beside it (L2, port 18001)."""
    m, _ = _ready("a")
    out: list[Action] = []
    m = _feed(m, Apply(recipe), 60, out)
    spec = make_spec(recipe=recipe, port=18001)
    m = _feed(m, PreflightOk(m.token, "L2", spec, False, False, beside=True), 61, out)
    return m, out


def test_a_launch_that_fits_starts_beside_the_serving_engine_then_the_gateway_switches_without_a_hold(
) -> None:
    m, out = _beside("b")
    assert m.state is State.STARTING and m.old is not None and m.old.launch_id == "L1"
    assert [a.launch_id for a in out if isinstance(a, StartEngine)] == ["L2"]
    # The old engine keeps the gateway while the new one starts: no drain, no clear, no hold.
    assert not [a for a in out if isinstance(a, DrainGateway | ClearUpstream)]
    m = _feed(m, Launched("L2", make_handle("L2", recipe="b", started_at=61)), 61, out)
    m = _feed(m, ReadyProbed("L2"), 100, out)
    assert m.state is State.READY and m.launch is not None and m.launch.launch_id == "L2"
    switches = [a for a in out if isinstance(a, SwitchUpstream)]
    assert switches == [SwitchUpstream("L2", "http://127.0.0.1:18001", "smollm2", "L1", 30.0)]
    assert not [a for a in out if isinstance(a, SetUpstream | ClearUpstream)]
    # A second apply waits until the old engine is gone (one switch at a time).
    _, rejected = transition(m, Apply("c"), 101)
    assert isinstance(rejected[0], Reject) and "still being drained" in rejected[0].reason
    m = _feed(m, Drained("L1"), 102, out)
    assert [a.launch_id for a in out if isinstance(a, StopEngine)] == ["L1"]
    m = _feed(m, Stopped("L1", GONE), 103, out)
    assert m.old is None and m.state is State.READY and m.recipe == "b"
    assert MarkEnded("L1", "stopped", replaced=True) in out


def test_a_launch_that_does_not_fit_drains_stops_and_starts_with_the_hold() -> None:
    m, _ = _ready("a")
    out: list[Action] = []
    m = _feed(m, Apply("b"), 60, out)
    m = _feed(m, PreflightOk(m.token, "L2", make_spec(recipe="b"), False, False, beside=False), 61, out)
    assert m.old is None and m.state is State.DRAINING
    assert [a.hold for a in out if isinstance(a, DrainGateway)] == ["switching to b"]


def test_a_new_engine_that_fails_to_launch_leaves_the_old_one_serving() -> None:
    m, out = _beside("b")
    failure = Failure("launch_failed", "the process runtime could not start the engine: no python", "",
                      retryable=False)
    m = _feed(m, LaunchFailed("L2", failure), 62, out)
    assert m.state is State.READY and m.launch is not None and m.launch.launch_id == "L1"
    assert m.old is None and m.recipe == "a" and m.last_failure == failure
    assert m.apply is not None and m.apply.outcome == "failed" and m.apply.failure == failure
    assert MarkEnded("L2", "failed", failure) in out
    assert not [a for a in out if isinstance(a, DrainGateway | ClearUpstream | StopEngine)]


def test_a_new_engine_that_dies_during_its_start_leaves_the_old_one_serving() -> None:
    m, out = _beside("b")
    m = _feed(m, Launched("L2", make_handle("L2", recipe="b", started_at=61)), 61, out)
    m = _feed(m, ExitSeen("L2", ExitInfo(running=False, signal=9)), 70, out)
    assert m.state is State.EXITED
    m = _feed(m, Exited("L2", ExitInfo(running=False, signal=9), CRASH), 71, out)
    assert m.state is State.READY and m.launch is not None and m.launch.launch_id == "L1"
    assert m.failures == 0 and m.backoff_until is None  # nothing to relaunch: the old one serves
    assert not [a for a in out if isinstance(a, ClearUpstream)]  # the gateway never lost it
    assert any(isinstance(a, MarkEnded) and a.launch_id == "L2" and a.status == "exited" for a in out)


def test_the_old_engine_dying_during_the_switch_holds_until_the_new_one_is_ready() -> None:
    m, out = _beside("b")
    m = _feed(m, Launched("L2", make_handle("L2", recipe="b", started_at=61)), 61, out)
    m = _feed(m, ExitSeen("L1", ExitInfo(running=False, signal=9)), 70, out)
    holds = [a.hold for a in out if isinstance(a, ClearUpstream)]
    assert holds == ["the serving engine exited; b is starting"]
    m = _feed(m, Exited("L1", ExitInfo(running=False, signal=9), CRASH), 71, out)
    assert m.old is None and m.state is State.STARTING
    assert MarkEnded("L1", "exited", CRASH, replaced=True) in out
    m = _feed(m, ReadyProbed("L2"), 100, out)
    # One engine again: an ordinary ready, the gateway gets the new one's slot.
    assert [a.launch_id for a in out if isinstance(a, SetUpstream)] == ["L2"]
    assert not [a for a in out if isinstance(a, SwitchUpstream)]


def test_the_old_engine_ending_after_the_switch_is_left_to_its_own_stop() -> None:
    m, out = _beside("b")
    m = _feed(m, Launched("L2", make_handle("L2", recipe="b", started_at=61)), 61, out)
    m = _feed(m, ReadyProbed("L2"), 100, out)
    before = len(out)
    m = _feed(m, ExitSeen("L1", GONE), 101, out)
    m = _feed(m, Exited("L1", GONE, CRASH), 102, out)
    assert out[before:] == [] and m.old is not None  # our own stop: Stopped reports the end
    m = _feed(m, Stopped("L1", GONE), 103, out)
    assert m.old is None and m.state is State.READY


def test_a_stop_during_a_blue_green_start_stops_the_new_engine_then_drains_the_old_one() -> None:
    m, out = _beside("b")
    m = _feed(m, Launched("L2", make_handle("L2", recipe="b", started_at=61)), 61, out)
    m = _feed(m, Stop(), 70, out)
    assert m.state is State.STOPPING and [a.launch_id for a in out if isinstance(a, StopEngine)] == ["L2"]
    m = _feed(m, Stopped("L2", GONE), 71, out)
    assert m.state is State.DRAINING and m.launch is not None and m.launch.launch_id == "L1"
    assert [(a.launch_id, a.hold) for a in out if isinstance(a, DrainGateway)] == [("L1", None)]
    m = _feed(m, Drained("L1"), 72, out)
    m = _feed(m, Stopped("L1", GONE), 73, out)
    assert m.state is State.IDLE and m.old is None


def test_an_apply_of_the_serving_launch_moved_to_another_port_is_still_unchanged() -> None:
    # Its hash computed from its fields, as render does (make_spec's is a fixed placeholder).
    spec = on_port(on_port(make_spec(recipe="a"), 18002), 18000)
    out: list[Action] = []
    m = _feed(Machine(), Apply("a"), 0, out)
    m = _feed(m, PreflightOk(m.token, "L1", on_port(spec, 18001), False, False), 1, out)
    m = _feed(m, Launched("L1", make_handle("L1", recipe="a", started_at=1)), 1, out)
    m = _feed(m, ReadyProbed("L1"), 50, out)
    m = _feed(m, Apply("a"), 60, out)
    m = _feed(m, PreflightOk(m.token, "L2", spec, False, False, beside=True), 61, out)
    assert m.state is State.READY and m.apply is not None and m.apply.outcome == "unchanged"


# --------------------------------------------------------------------------------------------
# The verdict (blue_green.decide) and the moved launch


def test_the_moved_launch_is_the_launch_the_recipe_renders_on_that_port() -> None:
    recipes = shipped()
    for name in ("cpu-smollm2", "cpu-smollm2-docker"):
        recipe = recipes[name]
        moved = on_port(render(recipe, fixed_facts()), 8001)
        assert moved == render(with_changes(recipe, engine__port=8001), fixed_facts())


def _facts(available_gib: float) -> HostFacts:
    return fixed_facts().model_copy(update={"mem_available_bytes": int(available_gib * GIB)})


def test_it_fits_when_memavailable_minus_the_need_stays_above_the_target_with_a_free_port() -> None:
    recipes = shipped()
    new, serving = recipes["cpu-smollm2-eager"], recipes["cpu-smollm2"]
    spec, serving_spec = _bound(render(new, fixed_facts()), "1"), render(serving, fixed_facts())
    free = {8001}
    fit = decide(new, _facts(12.0), spec, serving_spec, cold=False, serving_gib=2.4,
                 is_free=lambda host, port: port in free, cpus=2)
    assert fit.fits and fit.port == 8001
    need = fit.numbers["need_gib"]
    assert isinstance(need, float) and fit.numbers["mem_available_gib"] == 12.0
    assert fit.numbers["target_gib"] == 0.5 and fit.numbers["left_gib"] == round(12.0 - need, 2)
    assert "MemAvailable now 12.00 GiB" in fit.why and "port 8001 is free" in fit.why
    tight = decide(new, _facts(need + 0.2), spec, serving_spec, cold=False,
                   is_free=lambda host, port: True, cpus=2)
    assert not tight.fits and "under the target 0.50 GiB" in tight.why
    no_port = decide(new, _facts(12.0), spec, serving_spec, cold=False,
                     is_free=lambda host, port: False, cpus=2)
    assert not no_port.fits and "no free port" in no_port.why


def test_a_cold_warm_up_start_and_a_shared_gpu_do_not_fit() -> None:
    recipes = shipped()
    new, serving = recipes["cpu-smollm2"], recipes["cpu-smollm2-eager"]
    spec, serving_spec = _bound(render(new, fixed_facts()), "3"), render(serving, fixed_facts())
    if new.expect.warm_restart:
        cold = decide(new, _facts(20.0), spec, serving_spec, cold=True, is_free=lambda h, p: True)
        assert not cold.fits and "cold" in cold.why
    gpu = recipes["cuda-smollm2-eager"]
    gpu_new = render(with_changes(gpu, devices=[0, 1]), fixed_facts())
    shared = decide(gpu, _facts(40.0), gpu_new, render(with_changes(gpu, devices=[1]), fixed_facts()),
                    cold=False, is_free=lambda h, p: True)
    assert not shared.fits and "GPU 1 would hold both engines" in shared.why
    apart = decide(gpu, _facts(40.0), gpu_new, render(with_changes(gpu, devices=[2]), fixed_facts()),
                   cold=False, is_free=lambda h, p: True)
    assert apart.fits, apart.why


def _bound(spec: LaunchSpec, cores: str) -> LaunchSpec:
    return spec.model_copy(update={"env": {**spec.env, BIND_ENV: cores}})


def test_two_cpu_engines_on_the_same_cores_do_not_fit() -> None:
    recipes = shipped()
    new, serving = recipes["cpu-smollm2-eager"], recipes["cpu-smollm2"]
    spec, serving_spec = render(new, fixed_facts()), render(serving, fixed_facts())
    # Both `auto` on a 2-core host: both workers on core 0 (the other one is reserved).
    shared = decide(new, _facts(12.0), spec, serving_spec, cold=False, is_free=lambda h, p: True,
                    cpus=2)
    assert not shared.fits and "share cores (0 and 0" in shared.why
    assert bound_cores({}, 8) == frozenset(range(7))
    assert bound_cores({BIND_ENV: "0-1|4"}, 8) == frozenset({0, 1, 4})
    assert bound_cores({BIND_ENV: "nobind"}, 8) is None


# Finding 19: the serving engine's cards come from its launch, never from its recipe file.


def _gpu_check(files: dict[str, Recipe]) -> BesideCheck:
    """The real seam, with the recipe files as `files` says they are now (absent: deleted)."""

    def recipe(name: str) -> Recipe:
        if name not in files:
            raise UnknownRecipe(name)
        return files[name]

    return BesideCheck(recipe, lambda: _facts(40.0), render, {}, is_free=lambda h, p: True)


def _gpu_launch(recipe: Recipe, devices: list[int]) -> tuple[Recipe, LaunchSpec]:
    changed = with_changes(recipe, devices=devices)
    return changed, render(changed, fixed_facts())


def test_a_deleted_serving_recipe_file_does_not_make_its_gpu_free() -> None:
    gpu = shipped()["cuda-smollm2-eager"]
    new, _ = _gpu_launch(with_changes(gpu, name="new"), [0])
    _, serving_spec = _gpu_launch(gpu, [0])  # the serving engine runs on GPU 0; its file is gone
    fit = _gpu_check({"new": new})("new", False, serving_spec, make_handle("old", gpu.name))
    assert not fit.fits
    assert "GPU 0 would hold both engines" in fit.why and fit.numbers["serving_gpus"] == "0"


def test_a_serving_recipe_edited_after_its_launch_is_judged_by_its_launch() -> None:
    gpu = shipped()["cuda-smollm2-eager"]
    new, _ = _gpu_launch(with_changes(gpu, name="new"), [0])
    _, serving_spec = _gpu_launch(gpu, [0])  # launched on GPU 0 ...
    edited, _ = _gpu_launch(gpu, [1])  # ... then its file was edited to GPU 1
    check = _gpu_check({"new": new, gpu.name: edited})
    fit = check("new", False, serving_spec, make_handle("old", gpu.name))
    assert not fit.fits and "GPU 0 would hold both engines" in fit.why
    # and the other way round: the file now says GPU 0, the launch runs on GPU 1: the new one fits.
    _, on_one = _gpu_launch(gpu, [1])
    check = _gpu_check({"new": new, gpu.name: with_changes(gpu, devices=[0])})
    assert check("new", False, on_one, make_handle("old", gpu.name)).fits


def test_a_serving_launch_whose_cards_are_not_known_does_not_fit() -> None:
    gpu = shipped()["cuda-smollm2-eager"]
    new, _ = _gpu_launch(with_changes(gpu, name="new"), [2])
    _, serving_spec = _gpu_launch(gpu, [0])
    unknown = serving_spec.model_copy(
        update={"env": {k: v for k, v in serving_spec.env.items() if k != "CUDA_VISIBLE_DEVICES"}})
    fit = _gpu_check({"new": new, gpu.name: gpu})("new", False, unknown, make_handle("old", gpu.name))
    assert not fit.fits and "the serving launch's GPUs are not known" in fit.why
    assert fit.numbers["serving_gpus"] is None
    assert launch_cards(serving_spec) == (0,) and launch_cards(unknown) is None
    cpu = render(shipped()["cpu-smollm2"], fixed_facts())
    assert launch_cards(cpu) == ()
    assert launch_cards(unknown.model_copy(update={"env": {"CUDA_VISIBLE_DEVICES": "0,x"}})) is None


def test_the_port_is_the_recipes_own_when_free_else_the_next_free_one() -> None:
    assert pick_port("127.0.0.1", 8000, taken=8001, is_free=lambda h, p: True) == 8000
    assert pick_port("127.0.0.1", 8000, taken=8000, is_free=lambda h, p: True) == 8001
    assert pick_port("127.0.0.1", 8000, taken=8000, is_free=lambda h, p: p > 8003) == 8004


# --------------------------------------------------------------------------------------------
# The driver: fake runtime and clock


def _fits(port: int) -> BesideFn:
    def beside(name: str, cold: bool | None, serving: LaunchSpec, handle: EngineHandle) -> Fit:
        return Fit(True, f"MemAvailable now 12.00 GiB − predicted need 3.00 GiB; port {port} is free",
                   {"mem_available_gib": 12.0, "need_gib": 3.0, "target_gib": 0.5, "port": port}, port)
    return beside


async def test_the_driver_switches_blue_green_and_counts_it(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, beside=_fits(18001))
    rig.runtime.on_start = lambda e: setattr(e, "healthy", True)
    rig.driver.submit(Apply("test-recipe"))
    await rig.run_until(lambda: rig.driver.machine.state is State.READY, 120)
    plan = rig.driver.switch_plan("test-recipe")
    assert plan["path"] == "blue_green" and "on port 18001" in str(plan["why"])
    assert rig.driver.submit(Apply("test-recipe", force=True)) is None
    await rig.run_until(lambda: rig.driver.machine.state is State.READY and rig.driver.machine.old is None,
                        300)
    assert rig.gateway.calls[-1] == ("switch", "http://127.0.0.1:18001")
    assert not [h for h in rig.gateway.holds if h is not None]  # nobody was held
    assert rig.runtime.stopped == ["L1"] and rig.runtime.engines["L2"].running
    assert rig.driver.metrics.value("appliance_engine_switches_total", {"path": "blue_green"}) == 1
    first, second = rig.store.get_launch("L1"), rig.store.get_launch("L2")
    assert first is not None and first.status == "stopped"
    assert second is not None and second.status == "ready"
    kinds = [e.kind for e in rig.store.events()]
    assert "switched" in kinds and "blue-green-done" in kinds
    await rig.driver.shutdown()


async def test_the_driver_keeps_the_old_engine_serving_when_the_new_one_dies(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, beside=_fits(18001))
    rig.runtime.on_start = lambda e: setattr(e, "healthy", True)
    rig.driver.submit(Apply("test-recipe"))
    await rig.run_until(lambda: rig.driver.machine.state is State.READY, 120)
    calls = len(rig.gateway.calls)

    def crash(engine: FakeEngine) -> None:
        engine.log = "Traceback (most recent call last):\nRuntimeError: boom\n"
        engine.die(exit_code=1)

    rig.runtime.on_start = crash
    rig.driver.submit(Apply("test-recipe", force=True))
    await rig.run_until(lambda: rig.driver.machine.state is State.READY
                        and rig.driver.machine.last_failure is not None, 300)
    m = rig.driver.machine
    assert m.launch is not None and m.launch.launch_id == "L1" and m.old is None
    assert rig.runtime.engines["L1"].running
    # The gateway was never told anything about the failed start.
    assert all(c[0] == "point_to" for c in rig.gateway.calls[calls:])
    failed = rig.store.get_launch("L2")
    assert failed is not None and failed.status == "exited" and failed.diagnosis is not None
    assert rig.driver.status()["last_diagnosis"]["launch_id"] == "L2"
    assert "blue-green-failed" in [e.kind for e in rig.store.events()]
    await rig.driver.shutdown()


async def test_the_driver_sees_the_old_engine_die_mid_switch_and_holds_until_the_new_one_is_ready(
    tmp_path: Path,
) -> None:
    rig = make_rig(tmp_path, beside=_fits(18001))
    rig.runtime.on_start = lambda e: setattr(e, "healthy", True)
    rig.driver.submit(Apply("test-recipe"))
    await rig.run_until(lambda: rig.driver.machine.state is State.READY, 120)
    rig.runtime.on_start = None  # the new engine is not ready yet
    rig.driver.submit(Apply("test-recipe", force=True))
    await rig.run_until(lambda: "L2" in rig.runtime.engines, 60)
    assert rig.driver.status()["blue_green"]["old"] == "serving"
    rig.runtime.engines["L1"].die(signal=9)
    await rig.run_until(lambda: rig.driver.machine.old is None, 60)
    assert [h.reason for h in rig.gateway.holds if h is not None] == [
        "the serving engine exited; test-recipe is starting"]
    old = rig.store.get_launch("L1")
    assert old is not None and old.status == "exited"
    rig.runtime.engines["L2"].healthy = True
    await rig.run_until(lambda: rig.driver.machine.state is State.READY, 60)
    assert rig.gateway.calls[-1] == ("point_to", "http://127.0.0.1:18001")
    assert rig.driver.status()["blue_green"] is None
    await rig.driver.shutdown()
