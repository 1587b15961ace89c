"""A GPU recipe's KV request (`gpu_memory_utilization` × the card) against the card's free memory, at
the boundaries, on the recorded H200 (tests/fixtures/gpu_health/h200-2026-12-01/nvml-raw.json: total
150754820096 B = 140.40 GiB, free 150109880320 B = 139.80 GiB) with other processes' usage injected."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from appliance.host_facts import GIB
from appliance.observe.gpu_mem import GpuSample
from appliance.recipe.admission import admit
from appliance.recipe.gpu_kv_admission import (
    CUDA_CONTEXT_GIB,
    EDGE_FRACTION,
    CardMemory,
    GpuMemoryView,
    gpu_memory_checks,
    recipe_cards,
)
from appliance.recipe.recipe_model import Recipe
from controller.supervisor.gpu_memory_check import GpuMemoryLink
from controller.supervisor.preflight import Preflight
from controller.watch.gpu import GpuReader
from tests.unit.recipe_helpers import fixed_facts, shipped

ROOT = Path(__file__).parents[2]
H200 = ROOT / "tests/fixtures/gpu_health/h200-2026-12-01/nvml-raw.json"
CONTEXT = int(CUDA_CONTEXT_GIB * GIB)


def h200(index: int = 0, other_use: int = 0) -> CardMemory:
    """The recorded card, with `other_use` bytes more in use (a process other than the new engine)."""
    raw = json.loads(H200.read_text())["samples"][0]["cards"][0]
    card = CardMemory.from_nvml_raw(index, raw)
    assert card.free_bytes is not None
    return card.model_copy(update={"free_bytes": card.free_bytes - other_use})


def with_util(name: str, util: float | None) -> Recipe:
    recipe = shipped()[name]
    return recipe.model_copy(update={"engine": recipe.engine.model_copy(
        update={"gpu_memory_utilization": util})})


def only(recipe: Recipe, view: GpuMemoryView) -> tuple[str, str, dict[str, Any]]:
    (check,) = gpu_memory_checks(recipe, view)
    return check.verdict, check.message, dict(check.numbers)


def test_the_recorded_h200_reads_as_recorded_and_admits_the_shipped_recipe() -> None:
    card = h200()
    assert (card.total_bytes, card.free_bytes) == (150754820096, 150109880320)
    verdict, message, numbers = only(shipped()["cuda-smollm2-graph"], GpuMemoryView(cards=(card,), held={}))
    assert verdict == "admit"
    assert numbers["total_gib"] == 140.4 and numbers["free_gib"] == 139.8
    assert numbers["requested_gib"] == 42.12 and numbers["utilization"] == 0.3
    assert "asks 42.12 GiB of 140.40 GiB" in message
    # The whole admission carries the check and stays admitted.
    result = admit(shipped()["cuda-smollm2-graph"], fixed_facts(), gpu_memory=GpuMemoryView(cards=(card,)))
    assert [c.name for c in result.checks if c.name.startswith("gpu-memory")] == ["gpu-memory 0"]


def test_the_boundary_is_free_minus_the_cuda_context_then_the_edge_then_a_refusal() -> None:
    card = h200()
    assert card.total_bytes is not None and card.free_bytes is not None
    total, free = card.total_bytes, card.free_bytes
    recipe = with_util("cuda-smollm2-graph", 0.5)
    requested = 0.5 * total
    # Exactly what is left after the context: fits. One byte less: short, at the edge (warn).
    exact = card.model_copy(update={"free_bytes": int(requested) + CONTEXT + 1})
    assert only(recipe, GpuMemoryView(cards=(exact,), held={}))[0] == "admit"
    short = card.model_copy(update={"free_bytes": int(requested) + CONTEXT - 1})
    verdict, message, _ = only(recipe, GpuMemoryView(cards=(short,), held={}))
    assert verdict == "warn" and "at the edge" in message
    # The last byte of the edge still warns; past it, refused.
    edge = EDGE_FRACTION * total
    at_edge = card.model_copy(update={"free_bytes": int(requested + CONTEXT - edge) + 1})
    assert only(recipe, GpuMemoryView(cards=(at_edge,), held={}))[0] == "warn"
    past = card.model_copy(update={"free_bytes": int(requested + CONTEXT - edge) - 1})
    assert only(recipe, GpuMemoryView(cards=(past,), held={}))[0] == "refuse"
    # On the idle recorded card: 0.99 fits, 0.995 is at the edge, 1.0 is refused (vLLM sees 139.29 of
    # 139.8 GiB free there, so it refuses 1.0 too).
    assert free - CONTEXT > 0.99 * total
    assert [only(with_util("cuda-smollm2-graph", u), GpuMemoryView(cards=(card,), held={}))[0]
            for u in (0.99, 0.995, 1.0)] == ["admit", "warn", "refuse"]


def test_another_process_on_the_card_refuses_with_the_numbers() -> None:
    card = h200(other_use=100 * GIB)  # 39.80 GiB free
    recipe = with_util("cuda-smollm2-graph", None)
    verdict, message, numbers = only(recipe, GpuMemoryView(cards=(card,), held={}))
    assert verdict == "refuse"
    assert numbers["utilization"] == 0.9  # vLLM's default when the recipe leaves it unset
    assert numbers["gpu"] == 0 and numbers["free_gib"] == 39.8 and numbers["requested_gib"] == 126.36
    assert numbers["replaced_engine_holds_gib"] == 0.0 and numbers["available_gib"] == 39.29
    assert message.startswith("GPU 0: gpu_memory_utilization 0.9 asks 126.36 GiB of 140.40 GiB; "
                              "free 39.80 GiB")
    assert "87.07 GiB short" in message and "to ≤ 0.28" in message
    result = admit(recipe, fixed_facts(), gpu_memory=GpuMemoryView(cards=(card,)))
    assert result.verdict == "refuse"


def test_what_the_replaced_engine_holds_is_free_for_a_restart_but_not_side_by_side() -> None:
    card = h200(other_use=100 * GIB)
    recipe = with_util("cuda-smollm2-graph", 0.9)
    restart = GpuMemoryView(cards=(card,), held={0: 100 * GIB})
    verdict, message, numbers = only(recipe, restart)
    assert verdict == "admit" and numbers["replaced_engine_holds_gib"] == 100.0
    assert "+ 100.00 GiB the engine being replaced holds" in message
    # Blue/green: the running engine stays, so its share is not free.
    side = GpuMemoryView(cards=(card,), held={0: 100 * GIB}, replaces_running=False)
    verdict, message, numbers = only(recipe, side)
    assert verdict == "refuse" and numbers["replaced_engine_holds_gib"] == 0.0
    assert "not stopped first" in message
    # Its share on another card does not count here.
    assert only(recipe, GpuMemoryView(cards=(card,), held={1: 100 * GIB}))[0] == "refuse"


def test_an_unknown_share_of_the_running_engine_warns_instead_of_refusing() -> None:
    card = h200(other_use=100 * GIB)
    verdict, message, numbers = only(with_util("cuda-smollm2-graph", 0.9), GpuMemoryView(cards=(card,)))
    assert verdict == "warn" and "its share could not be read" in message
    assert numbers["replaced_engine_holds_gib"] is None
    # With nothing else on the card it is still simply admitted.
    assert only(with_util("cuda-smollm2-graph", 0.9), GpuMemoryView(cards=(h200(),)))[0] == "admit"


def test_no_reading_or_a_missing_card_warns_and_other_platforms_are_not_checked() -> None:
    recipe = shipped()["cuda-smollm2-graph"]
    verdict, message, _ = only(recipe, GpuMemoryView(cards=None, blind="no NVML"))
    assert verdict == "warn" and "card memory unknown (no NVML)" in message
    on_one = recipe.model_copy(update={"devices": (1,)})
    verdict, message, _ = only(on_one, GpuMemoryView(cards=(h200(),), held={}))
    assert verdict == "warn" and message.startswith("GPU 1: its memory was not read")
    # An AMD card is not the CUDA recipe's card 0.
    amd = h200().model_copy(update={"vendor": "amd"})
    assert only(recipe, GpuMemoryView(cards=(amd,), held={}))[0] == "warn"
    assert gpu_memory_checks(shipped()["cpu-smollm2"], GpuMemoryView(cards=None)) == []
    # Not asked for: admission adds nothing.
    assert admit(recipe, fixed_facts()) == admit(recipe, fixed_facts(), gpu_memory=None)


def test_each_tensor_parallel_card_is_checked_and_only_the_full_one_refuses() -> None:
    recipe = shipped()["cuda-tp2-graph"]
    assert recipe_cards(recipe) == (0, 1)
    checks = gpu_memory_checks(recipe, GpuMemoryView(
        cards=(h200(0), h200(1, other_use=120 * GIB)), held={}))
    assert [(c.name, c.verdict) for c in checks] == [("gpu-memory 0", "admit"), ("gpu-memory 1", "refuse")]
    # No devices listed: the first tensor_parallel_size cards.
    assert recipe_cards(recipe.model_copy(update={"devices": None})) == (0, 1)


def test_a_memory_watch_sample_reads_free_as_total_minus_used() -> None:
    sample = GpuSample(index=2, vendor="nvidia", used_bytes=644939776, total_bytes=150754820096)
    card = CardMemory.from_sample(sample)
    assert (card.index, card.free_bytes) == (2, 150109880320)
    assert CardMemory.from_sample(GpuSample(index=0, vendor="amd")).free_bytes is None
    assert CardMemory.from_nvml_raw(0, {"memory": {"error": "NVMLError_NotSupported"}}).total_bytes is None


# -- the link preflight reads, and the preflight check


@dataclass
class Reader:
    samples: list[GpuSample]
    held: dict[int, int] | None = None
    asked: list[frozenset[int]] = field(default_factory=list)

    def sample(self) -> list[GpuSample]:
        return self.samples

    def process_memory(self, pids: Any) -> dict[int, int] | None:
        self.asked.append(frozenset(pids))
        return self.held


def busy_h200(used_gib: float) -> GpuSample:
    return GpuSample(index=0, vendor="nvidia", used_bytes=int(used_gib * GIB), total_bytes=150754820096)


def test_the_link_counts_the_running_engines_pids_only_when_it_replaces_them() -> None:
    reader = Reader([busy_h200(100)], held={0: 99 * GIB})
    link = GpuMemoryLink(reader, running_pids=lambda: frozenset({11, 12}))
    view = link.view()
    assert view.held == {0: 99 * GIB} and reader.asked == [frozenset({11, 12})]
    assert link.view(replaces_running=False).replaces_running is False and len(reader.asked) == 1
    # Nothing runs: nothing to count back, and NVML is not asked.
    assert GpuMemoryLink(reader, running_pids=frozenset).view().held == {}
    # An engine runs but its pids are unknown (or no controller, as in `appliance plan`): unknown.
    assert GpuMemoryLink(reader, running_pids=lambda: None).view().held is None
    assert GpuMemoryLink(reader).view().held is None
    # No card memory at all: blind.
    blind = GpuMemoryLink(Reader([])).view()
    assert blind.cards is None and blind.blind is not None and "NVML" in blind.blind


@dataclass
class Source:
    view_: GpuMemoryView
    asked: list[bool] = field(default_factory=list)

    def view(self, replaces_running: bool = True) -> GpuMemoryView:
        self.asked.append(replaces_running)
        return self.view_.model_copy(update={"replaces_running": replaces_running})


def test_the_preflight_refuses_before_anything_stops_and_names_the_numbers() -> None:
    source = Source(GpuMemoryView(cards=(h200(other_use=100 * GIB),), held={}))
    pf = Preflight(recipes_dir=ROOT / "recipes", appliance_home=Path("/nonexistent"), gpu_memory=source)
    failure = pf.gpu_memory_check(with_util("cuda-smollm2-graph", 0.9))
    assert failure is not None and failure.code == "gpu_memory_short" and not failure.retryable
    assert "GPU 0" in failure.summary and "126.36 GiB" in failure.summary and "39.80 GiB" in failure.summary
    assert "appliance plan cuda-smollm2-graph" in failure.hint
    # The replaced engine's share counts back on a restart; a side-by-side start is asked for as such.
    held = Source(GpuMemoryView(cards=(h200(other_use=100 * GIB),), held={0: 100 * GIB}))
    pf.gpu_memory = held
    assert pf.gpu_memory_check(with_util("cuda-smollm2-graph", 0.9)) is None
    assert pf.gpu_memory_check(with_util("cuda-smollm2-graph", 0.9), replaces_running=False) is not None
    assert held.asked == [True, False]
    # A CPU recipe is never refused here; without a source nothing is checked.
    assert pf.gpu_memory_check(shipped()["cpu-smollm2"]) is None
    assert Preflight(recipes_dir=ROOT / "recipes", appliance_home=Path("/nonexistent")).gpu_memory_check(
        with_util("cuda-smollm2-graph", 0.9)) is None


def test_warnings_are_said_in_the_event_log_once_per_apply() -> None:
    said: list[tuple[str, str]] = []
    pf = Preflight(recipes_dir=ROOT / "recipes", appliance_home=Path("/nonexistent"),
                   gpu_memory=Source(GpuMemoryView(cards=None, blind="no NVML")),
                   note=lambda kind, msg, launch: said.append((kind, msg)))
    recipe = shipped()["cuda-smollm2-graph"]
    assert pf.gpu_memory_check(recipe, say=False) is None and said == []
    assert pf.gpu_memory_check(recipe) is None
    assert said == [("gpu-memory", "cuda-smollm2-graph: card memory unknown (no NVML): "
                                   "gpu_memory_utilization 0.3 on GPU(s) [0] is not checked against "
                                   "what is free")]


# -- NVML's per-process memory (a fake pynvml module at the import seam)


def fake_nvml(compute: list[list[Any]], graphics: list[list[Any]], fail: bool = False) -> SimpleNamespace:
    def procs(kind: list[list[Any]]) -> Any:
        def get(handle: int) -> list[Any]:
            if fail:
                raise RuntimeError("NVMLError_NotSupported")
            return kind[handle]
        return get

    return SimpleNamespace(nvmlDeviceGetCount=lambda: len(compute), nvmlDeviceGetHandleByIndex=lambda i: i,
                           nvmlDeviceGetComputeRunningProcesses=procs(compute),
                           nvmlDeviceGetGraphicsRunningProcesses=procs(graphics))


def p(pid: int, used: int | None) -> SimpleNamespace:
    return SimpleNamespace(pid=pid, usedGpuMemory=used)


@pytest.mark.parametrize(("compute", "graphics", "want"), [
    ([[p(11, 5 * GIB), p(99, 7 * GIB)], [p(12, 3 * GIB)]], [[], []], {0: 5 * GIB, 1: 3 * GIB}),
    # A process in both lists is one allocation; another's usage is never counted; unknown usage (None,
    # NVML's NVML_VALUE_NOT_AVAILABLE under some drivers) is not a number.
    ([[p(11, 5 * GIB)], [p(12, None)]], [[p(11, 5 * GIB)], []], {0: 5 * GIB}),
])
def test_process_memory_sums_the_engines_pids_per_card(compute: list[list[Any]], graphics: list[list[Any]],
                                                       want: dict[int, int]) -> None:
    reader = GpuReader(Path("/nonexistent"), nvml=True)
    reader._nvml = fake_nvml(compute, graphics)  # type: ignore[assignment]
    assert reader.process_memory({11, 12}) == want


def test_process_memory_is_unknown_without_nvml_or_when_a_card_fails() -> None:
    assert GpuReader(Path("/nonexistent"), nvml=False).process_memory({1}) is None
    reader = GpuReader(Path("/nonexistent"), nvml=True)
    reader._nvml = fake_nvml([[p(1, GIB)]], [[]], fail=True)  # type: ignore[assignment]
    assert reader.process_memory({1}) is None


def test_a_dcu_is_checked_only_where_sysfs_shows_its_vram() -> None:
    recipe = shipped()["gfx906-b-tp4-eager"]
    # The reference host's DCUs show no mem_info_vram_* (hydcu): no check, no warning.
    assert gpu_memory_checks(recipe, GpuMemoryView(cards=None)) == []
    assert gpu_memory_checks(recipe, GpuMemoryView(cards=(h200(),), held={})) == []  # an NVIDIA card
    # Where they are shown, each card is checked like an NVIDIA one.
    dcu = CardMemory(index=0, vendor="hygon", total_bytes=34342961152, free_bytes=34342961152 - 31180000000)
    checks = gpu_memory_checks(recipe, GpuMemoryView(cards=(dcu,), held={}))
    assert [c.name for c in checks] == ["gpu-memory 0", "gpu-memory 1", "gpu-memory 2", "gpu-memory 3"]
    assert checks[0].verdict == "refuse" and all(c.verdict == "warn" for c in checks[1:])


def test_the_service_reads_the_running_engines_pids_from_the_host_watch() -> None:
    from typing import cast

    from controller.service import running_pids_of
    from controller.supervisor.host_memory_watch import HostWatchLink

    launch: list[Any] = []
    seen: dict[str, frozenset[int]] = {}
    watch = SimpleNamespace(engine=SimpleNamespace(launch=lambda: launch[0] if launch else None),
                            pids_of=lambda lid: seen.get(lid, frozenset()))
    pids = running_pids_of(cast(HostWatchLink, watch))
    assert pids() == frozenset()  # nothing runs: nothing to count back
    launch.append(SimpleNamespace(launch_id="L1", handle=object()))
    assert pids() is None  # it runs, none of its pids seen yet: its share is unknown
    seen["L1"] = frozenset({41, 42})
    assert pids() == frozenset({41, 42})
