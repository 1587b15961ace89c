"""May a recipe start beside the running engines? (controller/supervisor/alongside_admission.py) The
GPU cards, judged per running engine on NVML's free memory now, over the same-card helpers of
blue_green.py: a shared card with room fits, one without is refused naming the engine on it."""

from __future__ import annotations

from appliance.recipe.launch_port import on_port
from controller.supervisor.alongside_admission import Engine, refusal
from controller.supervisor.machine import State
from tests.unit.test_blue_green_same_card import MARGIN, card, everywhere, facts, launch, need, nvml


def test_a_gpu_recipe_beside_an_engine_on_its_card_needs_room_by_nvml_now() -> None:
    new, spec = launch([0])
    new = new.model_copy(update={"name": "graph-b"})
    spec = on_port(spec.model_copy(update={"served_model_name": "smollm2-b"}), spec.port + 1)
    _, serving = launch([0])
    running = [Engine("smollm2", State.READY, "cuda-smollm2-graph", serving)]
    assert refusal(new, facts(), spec, running, is_free=everywhere, gpu=nvml(card(0, need() + MARGIN)),
                   cold=False) is None
    why = refusal(new, facts(), spec, running, is_free=everywhere, gpu=nvml(card(0, need() + MARGIN - 1)),
                  cold=False)
    assert why is not None and why.startswith("GPU beside engine 'smollm2' (recipe cuda-smollm2-graph): ")
    assert "same-card blue/green does not fit: GPU 0" in why and "appliance stop --model smollm2" in why
    # Another card than the running engine's: fits without reading the cards' memory.
    other, on_one = launch([1])
    other = other.model_copy(update={"name": "graph-b"})
    on_one = on_port(on_one.model_copy(update={"served_model_name": "smollm2-b"}), on_one.port + 1)
    assert refusal(other, facts(), on_one, running, is_free=everywhere, gpu=None, cold=False) is None
