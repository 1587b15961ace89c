"""Admission and preflight on card health: the recorded H200 is admitted, injected faults warn or
refuse, and only the recipe's own cards of its own vendor count."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from appliance.observe.gpu_events import GpuEvent, parse_gpu_line
from appliance.observe.gpu_health import CardHealth, ReplayQueries, card_from_queries, card_line
from appliance.recipe.admission import admit, gpu_health_checks
from controller.supervisor.preflight import Preflight
from tests.unit.recipe_helpers import fixed_facts, shipped
from tests.unit.test_gpu_health import h200_recording

RECIPES = Path(__file__).parents[2] / "recipes"


@dataclass
class Watch:
    """The GPU health watch as preflight reads it (a fake at the GpuHealthSource seam)."""

    cards: list[CardHealth]
    fatal: dict[int, list[GpuEvent]] = field(default_factory=dict)
    blind_note: str | None = None
    recent_events: list[GpuEvent] = field(default_factory=list)

    def fatal_events(self, index: int) -> list[GpuEvent]:
        return self.fatal.get(index, [])


def card(inject: dict[str, object] | None = None, index: int = 0) -> CardHealth:
    c = card_from_queries(0, ReplayQueries(h200_recording(), {0: inject or {}}))
    return c.model_copy(update={"index": index})


def test_the_recorded_h200_adds_nothing_to_admission() -> None:
    recipe = shipped()["cuda-smollm2-graph"]
    plain = admit(recipe, fixed_facts())
    assert admit(recipe, fixed_facts(), [card()]) == plain


def test_a_throttling_card_warns_and_a_failed_remap_refuses() -> None:
    recipe = shipped()["cuda-smollm2-graph"]  # devices [0]
    warm = admit(recipe, fixed_facts(), [card({"throttle_reasons": 0x20})])
    assert [c.name for c in warm.checks if c.verdict == "warn" and c.name.startswith("gpu")] == [
        "gpu-health throttling"]
    bad = admit(recipe, fixed_facts(), [card({"remapped_rows": [0, 3, 0, 1]})])
    assert bad.verdict == "refuse"
    refused = [c for c in bad.checks if c.verdict == "refuse" and c.name.startswith("gpu-health")]
    assert refused[0].name == "gpu-health remap-failure" and refused[0].numbers["gpu"] == 0


def test_only_the_recipes_cards_and_vendor_count() -> None:
    recipe = shipped()["cuda-smollm2-graph"]  # CUDA_VISIBLE_DEVICES=0
    other_card = card({"remapped_rows": [0, 3, 0, 1]}, index=1)
    assert gpu_health_checks(recipe, [card(), other_card], {}) == []
    amd = card({"remapped_rows": [0, 3, 0, 1]}).model_copy(update={"vendor": "hygon"})
    assert gpu_health_checks(recipe, [amd], {}) == []
    assert gpu_health_checks(shipped()["cpu-smollm2"], [other_card], {}) == []


def test_a_fatal_kernel_event_on_the_card_refuses_the_apply() -> None:
    event = parse_gpu_line("NVRM: Xid (PCI:0000:00:06): 79, GPU has fallen off the bus.")
    assert event is not None

    said: list[str] = []
    watch = Watch([card()], {0: [event.model_copy(update={"card": 0})]})
    pf = Preflight(recipes_dir=RECIPES, appliance_home=Path("/nonexistent"), gpu=watch,
                   note=lambda kind, msg, launch: said.append(msg))
    failure = pf.gpu_check(shipped()["cuda-smollm2-graph"])
    assert failure is not None and failure.code == "gpu_unhealthy" and not failure.retryable
    assert "Xid 79" in failure.summary and "reset the card" in failure.hint


def test_warnings_are_said_once_per_apply_not_per_plan() -> None:
    said: list[str] = []
    pf = Preflight(recipes_dir=RECIPES, appliance_home=Path("/nonexistent"),
                   gpu=Watch([card({"temperature_c": 87})]),
                   note=lambda kind, msg, launch: said.append(msg))
    recipe = shipped()["cuda-smollm2-graph"]
    assert pf.gpu_check(recipe, say=False) is None and said == []
    assert pf.gpu_check(recipe) is None
    assert said == ["cuda-smollm2-graph: GPU 0: 87 °C, slowdown at 89 °C: check cooling"]


def test_card_line() -> None:
    line = card_line(card())
    assert line.startswith("GPU 0 NVIDIA H200 (nvidia): ") and "PCIe gen5 x16 of gen5 x16" in line
    assert "ECC uncorrectable 0" in line and "2 fact(s) unreadable" in line
    lost = card().model_copy(update={"lost": True})
    assert card_line(lost).endswith("LOST (does not answer)")
