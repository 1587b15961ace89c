"""The blue/green fit rule (``controller/supervisor/blue_green.py``) on its edges: the RAM bound at
equality, the warm or cold peak, a recipe without a memory model, a cluster recipe, the cards and cores
rules, the port scan's ends, the whole verdict (``fits``, ``why``, ``numbers``) of each way out, and
``BesideCheck``'s own inputs (the cache state of a preview, the serving engine's measured footprint).
Written from mutation testing's survivors (docs/mutation-testing.md: third round)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import psutil
import pytest

from appliance.host_facts import GIB, HostFacts
from appliance.recipe.admission import admit
from appliance.recipe.launch_spec import LaunchSpec
from appliance.recipe.recipe_model import Recipe
from appliance.recipe.render import render
from controller.runtime.base import EngineHandle, EngineRuntimeError, Runtime
from controller.supervisor.blue_green import (
    BIND_ENV,
    PORT_SCAN,
    RESERVED_ENV,
    BesideCheck,
    Fit,
    bound_cores,
    decide,
    footprint_gib,
    host_fit,
    moved,
    pick_port,
)
from tests.unit.recipe_helpers import fixed_facts, shipped, with_changes
from tests.unit.supervisor_helpers import make_handle

MEM = "MemAvailable now"


def facts(available_gib: float) -> HostFacts:
    return fixed_facts().model_copy(update={"mem_available_bytes": round(available_gib * GIB)})


def demand(recipe: Recipe, start: str) -> float:
    checks = {c.name: c for c in admit(recipe, fixed_facts()).checks}
    value = checks[f"memory-peak-{start}"].numbers["demand_gib"]
    assert isinstance(value, float)
    return value


def bound(spec: LaunchSpec, cores: str) -> LaunchSpec:
    return spec.model_copy(update={"env": {**spec.env, BIND_ENV: cores}})


def gpu(devices: list[int]) -> LaunchSpec:
    return render(with_changes(shipped()["cuda-smollm2-eager"], devices=devices), fixed_facts())


def cpu(cores: str | None = None) -> LaunchSpec:
    spec = render(shipped()["cpu-smollm2"], fixed_facts())
    return spec if cores is None else bound(spec, cores)


def free(*ports: int) -> Callable[[str, int], bool]:
    return lambda host, port: port in ports


def everywhere(host: str, port: int) -> bool:
    return True


# --- RAM -----------------------------------------------------------------------------------------


def test_the_ram_bound_holds_at_equality_and_every_figure_is_rounded_to_hundredths() -> None:
    """MemAvailable − need = the target exactly still fits (the target is what must stay available)."""
    recipe = shipped()["cpu-smollm2"]  # target 0.5 GiB
    need = demand(recipe, "cold")
    ok, why, numbers = host_fit(recipe, facts(need + 0.5), cold=True)
    assert ok is True
    assert why == (f"MemAvailable now {need + 0.5:.2f} GiB − predicted need {need:.2f} GiB (cold start) = "
                   "0.50 GiB, ≥ the target 0.50 GiB")
    assert numbers == {"mem_available_gib": round(need + 0.5, 2), "target_gib": 0.5, "start": "cold",
                       "need_gib": round(need, 2), "left_gib": 0.5}
    short, why, _ = host_fit(recipe, facts(need + 0.49), cold=True)
    assert short is False and why.endswith("0.49 GiB, under the target 0.50 GiB")


def test_figures_with_more_decimals_are_rounded_to_two() -> None:
    recipe = with_changes(shipped()["cpu-smollm2"], memory__overhead_gib=0.503)
    need = demand(recipe, "cold")
    assert round(need, 3) != round(need, 2)  # the case needs a third decimal
    ok, _, numbers = host_fit(recipe, facts(12.3456), cold=True)
    assert ok is True
    assert numbers["mem_available_gib"] == 12.35
    assert numbers["need_gib"] == round(need, 2)
    assert numbers["left_gib"] == round(12.35 - need, 2) != round(12.35 - need, 3)


def test_a_warm_start_is_judged_by_the_warm_peak_and_a_cold_one_by_the_cold_peak() -> None:
    recipe = with_changes(shipped()["cuda-smollm2-graph"], memory__warm_transient_gib=0.0)
    warm, cold = demand(recipe, "warm"), demand(recipe, "cold")
    assert warm < cold
    _, why, numbers = host_fit(recipe, facts(20.0), cold=False)
    assert numbers["start"] == "warm" and numbers["need_gib"] == round(warm, 2) and "(warm start)" in why
    _, why, numbers = host_fit(recipe, facts(20.0), cold=True)
    assert numbers["start"] == "cold" and numbers["need_gib"] == round(cold, 2) and "(cold start)" in why
    # A recipe with one start has only the cold peak: a warm start is judged by it.
    single = shipped()["cpu-smollm2"]
    _, _, numbers = host_fit(single, facts(20.0), cold=False)
    assert numbers["start"] == "warm" and numbers["need_gib"] == round(demand(single, "cold"), 2)


def test_a_recipe_without_a_memory_model_does_not_fit() -> None:
    recipe = shipped()["cuda-generic"]  # no memory model, no MemAvailable target
    assert host_fit(recipe, facts(100.0), cold=False) == (
        False, "cuda-generic has no memory model: its need beside the serving engine cannot be predicted",
        {"mem_available_gib": 100.0, "target_gib": 0.0, "start": "warm"})


# --- decide: each way out, whole ------------------------------------------------------------------


def test_a_cluster_recipe_is_not_judged_here() -> None:
    recipe = shipped()["gfx906-b-tp4-eager-k8s"]
    fit = decide(recipe, facts(100.0), cpu(), cpu(), cold=False, serving_gib=2.3456, is_free=everywhere)
    assert fit == Fit(False, "gfx906-b-tp4-eager-k8s runs on a cluster node: its memory is not this "
                      "host's to judge", {"serving_footprint_gib": 2.35})


def test_a_cold_start_with_the_warm_restart_flow_does_not_fit_but_its_warm_start_may() -> None:
    recipe = shipped()["cuda-smollm2-graph"]
    fit = decide(recipe, facts(100.0), gpu([1]), gpu([0]), cold=True, is_free=everywhere)
    assert fit == Fit(False, "cuda-smollm2-graph starts cold with the warm-restart flow (a cold warm-up, "
                      "then the serving start): not beside", {"serving_footprint_gib": None})
    assert decide(recipe, facts(100.0), gpu([1]), gpu([0]), cold=False, is_free=everywhere).fits is True
    # Cold, without the flow: judged by the cold peak.
    plain = shipped()["cpu-smollm2"]
    fit = decide(plain, facts(12.0), cpu("1"), cpu("0"), cold=True, is_free=everywhere, cpus=2)
    assert fit.fits is True and fit.numbers["start"] == "cold"


def test_short_of_ram_keeps_the_numbers_and_names_the_serving_footprint() -> None:
    recipe = shipped()["cpu-smollm2"]
    need = demand(recipe, "cold")
    fit = decide(recipe, facts(need), cpu("1"), cpu("0"), cold=False, serving_gib=1.234, is_free=everywhere,
                 cpus=2)
    assert fit.fits is False and fit.port is None
    assert fit.why.endswith("under the target 0.50 GiB (the serving engine's 1.23 GiB is already out of "
                            "MemAvailable)")
    assert fit.why.startswith(MEM)
    assert fit.numbers == {"serving_footprint_gib": 1.23, "mem_available_gib": round(need, 2),
                           "target_gib": 0.5, "start": "warm", "need_gib": round(need, 2), "left_gib": 0.0}


def test_a_shared_card_and_an_unreadable_card_list_do_not_fit() -> None:
    recipe = shipped()["cuda-smollm2-eager"]
    fit = decide(recipe, facts(40.0), gpu([0, 1, 2]), gpu([1, 2]), cold=False, is_free=everywhere)
    assert fit.fits is False
    assert fit.why.endswith("; but GPU 1,2 would hold both engines (vLLM takes its gpu_memory_utilization "
                            "share of every card it is given)")
    assert fit.numbers["gpus"] == "0,1,2" and fit.numbers["serving_gpus"] == "1,2"
    assert fit.numbers["mem_available_gib"] == 40.0
    unreadable = gpu([0]).model_copy(update={"env": {}})
    fit = decide(recipe, facts(40.0), unreadable, gpu([1]), cold=False, is_free=everywhere)
    assert fit.fits is False
    assert fit.why.endswith("; but the new launch's GPUs cannot be read from its cuda launch")
    assert fit.numbers["mem_available_gib"] == 40.0


def test_a_gpu_launch_beside_a_cpu_engine_is_judged_by_ram_and_port_only() -> None:
    recipe = shipped()["cuda-smollm2-eager"]
    fit = decide(recipe, facts(40.0), gpu([0]), cpu(), cold=False, is_free=everywhere, cpus=2)
    assert fit.fits is True and fit.port == 8001  # both recipes' port is 8000: the serving one's
    assert fit.why.endswith(" GiB; GPUs 0 are not the serving engine's (none); port 8001 is free")
    # and the other way round: a CPU launch beside a GPU engine (no cards, no cores to compare).
    plain = shipped()["cpu-smollm2"]
    fit = decide(plain, facts(12.0), cpu(), gpu([0]), cold=False, is_free=everywhere, cpus=2)
    assert fit.fits is True
    assert fit.why.endswith(" GiB; port 8001 is free") and "; ;" not in fit.why
    assert fit.why.count(";") == 1


def test_the_cpu_rule_whole_verdict_and_the_cores_it_counts() -> None:
    recipe = shipped()["cpu-smollm2"]
    fit = decide(recipe, facts(12.0), cpu("0-1"), cpu("2-3"), cold=False, is_free=everywhere, cpus=7)
    assert fit.fits is True
    assert fit.why.endswith(" GiB; CPU cores 0,1 are not the serving engine's (2,3); port 8001 is free")
    assert fit.numbers["cpu_cores"] == "0,1" and fit.numbers["serving_cpu_cores"] == "2,3"
    assert fit.numbers["cpus"] == 7
    shared = decide(recipe, facts(12.0), cpu("nobind"), cpu("1"), cold=False, is_free=everywhere, cpus=2)
    assert shared.fits is False
    assert shared.why.endswith(
        "; but the two CPU engines' workers would share cores (any and 1, VLLM_CPU_OMP_THREADS_BIND): a "
        "worker beside a busy one on its cores is starved")
    assert shared.numbers["cpu_cores"] == "any" and shared.numbers["mem_available_gib"] == 12.0
    other = decide(recipe, facts(12.0), cpu("1"), cpu("nobind"), cold=False, is_free=everywhere, cpus=2)
    assert other.fits is False and "(1 and any," in other.why
    # Without `cpus`: this host's count.
    auto = decide(recipe, facts(12.0), cpu("1"), cpu("0"), cold=False, is_free=everywhere)
    assert auto.numbers["cpus"] == os.cpu_count()


def test_the_port_is_looked_for_on_the_launchs_host_and_never_the_serving_one() -> None:
    recipe = shipped()["cpu-smollm2"]
    spec = cpu("1")
    asked: list[str] = []

    def is_free(host: str, port: int) -> bool:
        asked.append(host)
        return True

    fit = decide(recipe, facts(12.0), spec, cpu("0"), cold=False, is_free=is_free, cpus=2)
    assert fit.port == spec.port + 1 and fit.numbers["port"] == spec.port + 1  # both on 8000: the next one
    assert set(asked) == {spec.host}
    none = decide(recipe, facts(12.0), spec, cpu("0"), cold=False, is_free=lambda h, p: False, cpus=2)
    assert none.fits is False and none.port is None and none.numbers["port"] is None
    assert none.why.endswith(f"; but no free port in {spec.port}–{spec.port + PORT_SCAN}")
    assert none.numbers["mem_available_gib"] == 12.0


def test_pick_port_scans_to_the_last_port_of_the_range_and_never_past_65535() -> None:
    assert pick_port("h", 8000, taken=1, is_free=free(8000 + PORT_SCAN)) == 8000 + PORT_SCAN
    assert pick_port("h", 8000, taken=1, is_free=free(8001 + PORT_SCAN)) is None
    assert pick_port("h", 65530, taken=1, is_free=free(65535)) == 65535
    assert pick_port("h", 65530, taken=1, is_free=free(65536)) is None
    assert pick_port("h", 8000, taken=1, is_free=lambda host, port: host == "h") == 8000


# --- cores ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("env", "cores"), [
    ({RESERVED_ENV: "2"}, range(6)),
    ({RESERVED_ENV: "0"}, range(8)),
    ({RESERVED_ENV: "-3"}, range(8)),  # a negative reserve reserves nothing
    ({RESERVED_ENV: "x"}, range(7)),  # unreadable: vLLM's default of one
    ({RESERVED_ENV: "9"}, range(1)),  # at least one core
    ({BIND_ENV: "0,,2"}, (0, 2)),
    ({BIND_ENV: " 1-3 | 5 "}, (1, 2, 3, 5)),
    ({BIND_ENV: "x-3,4"}, (4,)),
    ({BIND_ENV: "x"}, None),
])
def test_bound_cores(env: dict[str, str], cores: range | tuple[int, ...] | None) -> None:
    assert bound_cores(env, 8) == (None if cores is None else frozenset(cores))


# --- the seam: BesideCheck, the footprint, the moved launch ---------------------------------------


class Pids:
    """A runtime as far as BesideCheck uses one: the serving engine's processes."""

    def __init__(self, pids: list[int] | None) -> None:
        self.pids = pids
        self.asked: list[EngineHandle] = []

    def engine_pids(self, handle: EngineHandle) -> list[int]:
        self.asked.append(handle)
        if self.pids is None:
            raise EngineRuntimeError("gone")
        return self.pids


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process with one child, both asleep (their resident memory stays put)."""
    proc = subprocess.Popen(["sh", "-c", "sleep 300 & wait"])
    try:
        # Until the child has become `sleep`: between sh's fork and its exec the child is a copy of sh
        # whose resident memory is still changing (a fresh-clone run saw 3.3 vs 1.7 MiB across two reads).
        while [c.name() for c in psutil.Process(proc.pid).children()] != ["sleep"]:
            os.sched_yield()
        yield proc
    finally:
        for child in psutil.Process(proc.pid).children():
            child.kill()
        proc.kill()
        proc.wait()


def test_footprint_counts_the_processes_and_their_children_once(sleeper: subprocess.Popen[bytes]) -> None:
    parent = psutil.Process(sleeper.pid)
    procs = [parent, *parent.children(recursive=True)]
    assert len(procs) == 2
    expected = sum(p.memory_info().rss for p in procs) / GIB
    assert footprint_gib([sleeper.pid]) == expected
    assert footprint_gib([sleeper.pid, procs[1].pid, sleeper.pid]) == expected
    assert footprint_gib([2**22 + 1, sleeper.pid]) == expected  # a pid that cannot exist is skipped
    assert footprint_gib([2**22 + 1]) is None
    assert footprint_gib([]) is None


def check(recipe: Recipe, cache: Path, runtimes: dict[str, Pids],
          is_free: Callable[[str, int], bool] = everywhere) -> BesideCheck:
    def rendered(r: Recipe, f: HostFacts) -> LaunchSpec:
        return bound(render(r, f), "1").model_copy(update={"cache_root": str(cache)})

    return BesideCheck(lambda name: recipe, lambda: facts(40.0), rendered,
                       cast(dict[str, Runtime], runtimes), is_free=is_free)


def test_a_preview_reads_the_cache_and_an_apply_says_which_start_it_is(tmp_path: Path) -> None:
    recipe = shipped()["cuda-smollm2-graph"]
    serving = gpu([0])
    handle = make_handle("old", recipe.name)
    beside = check(recipe, tmp_path / "cache", {})
    assert "starts cold" in beside(recipe.name, None, serving, handle).why  # no cache yet: cold
    assert beside(recipe.name, False, serving, handle).numbers["start"] == "warm"  # told: warm
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "kernel.bin").write_bytes(b"x")
    assert beside(recipe.name, None, serving, handle).numbers["start"] == "warm"
    assert "starts cold" in beside(recipe.name, True, serving, handle).why
    plain = shipped()["cpu-smollm2"]
    assert check(plain, tmp_path, {})(plain.name, True, cpu("0"), handle).numbers["start"] == "cold"


def test_the_serving_engine_is_measured_through_its_runtime(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    plain = shipped()["cpu-smollm2"]
    handle = make_handle("old", plain.name)
    runtime = Pids([sleeper.pid])
    fit = check(plain, tmp_path, {handle.kind: runtime, "other": Pids(None)})(plain.name, False, cpu("0"),
                                                                              handle)
    footprint = footprint_gib([sleeper.pid])
    assert footprint is not None
    assert fit.numbers["serving_footprint_gib"] == round(footprint, 2) and runtime.asked == [handle]
    assert f"(the serving engine's {footprint:.2f} GiB is already out of MemAvailable)" in fit.why
    failing = check(plain, tmp_path, {handle.kind: Pids(None)})(plain.name, False, cpu("0"), handle)
    assert failing.numbers["serving_footprint_gib"] is None
    assert "already out of MemAvailable" not in failing.why
    unknown = check(plain, tmp_path, {"other": runtime})(plain.name, False, cpu("0"), handle)
    assert unknown.numbers["serving_footprint_gib"] is None


def test_the_check_asks_its_own_port_probe(tmp_path: Path) -> None:
    plain = shipped()["cpu-smollm2"]
    spec = cpu()
    fit = check(plain, tmp_path, {}, free(spec.port + 3))(plain.name, False, cpu("0"), make_handle("o"))
    assert fit.port == spec.port + 3


def test_the_moved_launch_is_the_same_launch_when_there_is_no_port() -> None:
    spec = cpu()
    assert moved(spec, Fit(False, "no")) is spec
    assert moved(spec, Fit(True, "yes", {}, 8123)).port == 8123


def test_the_view_is_the_verdict() -> None:
    numbers: dict[str, float | int | str | None] = {"port": 8001}
    view = Fit(True, "why", numbers, 8001).view()
    assert view == {"fits": True, "why": "why", "numbers": {"port": 8001}, "port": 8001}
    assert view["numbers"] is not numbers


# -- footprint_gib's walk of a process tree (fourth round of mutation testing) -------------------


class _Mem:
    def __init__(self, rss: int) -> None:
        self.rss = rss


class _Tree:
    """``psutil.Process`` over a made-up process tree: pid → (parent, GiB resident); None is this
    process (as in psutil); ``gone`` vanish when their memory is read."""

    def __init__(self, procs: dict[int, tuple[int | None, int]], gone: frozenset[int] = frozenset()) -> None:
        self.procs = procs
        self.gone = gone

    def __call__(self, pid: int | None = None) -> _Proc:
        pid = 1 if pid is None else pid
        if pid not in self.procs:
            raise psutil.NoSuchProcess(pid)
        return _Proc(self, pid)


class _Proc:
    def __init__(self, tree: _Tree, pid: int) -> None:
        self.tree, self.pid = tree, pid

    def children(self, recursive: bool = False) -> list[_Proc]:
        direct = [_Proc(self.tree, p) for p, (parent, _) in self.tree.procs.items() if parent == self.pid]
        return direct + [g for c in direct for g in c.children(True)] if recursive else direct

    def memory_info(self) -> _Mem:
        if self.pid in self.tree.gone:
            raise psutil.NoSuchProcess(self.pid)
        return _Mem(self.tree.procs[self.pid][1] * GIB)


def test_the_footprint_is_the_whole_tree_once_and_skips_what_vanished(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 1: this process (psutil.Process(None)); 10 → 11 → 12 and 10 → 13: an engine, two workers, a
    # worker's child.
    procs = {1: (None, 64), 10: (None, 1), 11: (10, 2), 12: (11, 4), 13: (10, 16), 20: (None, 8)}
    monkeypatch.setattr(psutil, "Process", _Tree(procs))
    assert footprint_gib([10]) == 23.0  # the grandchild too
    assert footprint_gib([10, 11, 10]) == 23.0  # each process once
    assert footprint_gib([11, 10]) == 23.0  # a worker before its parent: the parent's others still count
    assert footprint_gib([404, 10, 20]) == 31.0  # a pid that is gone is skipped, the rest counted
    assert footprint_gib([404]) is None
    # A child that exits while the tree is walked: the others are still counted.
    monkeypatch.setattr(psutil, "Process", _Tree(procs, gone=frozenset({11})))
    assert footprint_gib([10]) == 21.0
