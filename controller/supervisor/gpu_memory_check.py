"""The cards' memory as preflight reads it: NVML (or amdgpu sysfs) now, and what the running engine's
own processes hold on each card, for the KV admission of a GPU recipe
(appliance/recipe/gpu_kv_admission.py). Read at preflight, not from the watch's last sample: free
memory is what vLLM checks at start, and it moves."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Protocol

from appliance.observe.gpu_mem import GpuSample
from appliance.recipe.gpu_kv_admission import CardMemory, GpuMemoryView


class MemoryReader(Protocol):
    """controller/watch/gpu.py `GpuReader` as read here (tests pass a fake)."""

    def sample(self) -> list[GpuSample]: ...

    def process_memory(self, pids: Collection[int]) -> dict[int, int] | None: ...


class GpuMemoryLink:
    def __init__(self, reader: MemoryReader,
                 running_pids: Callable[[], Collection[int] | None] | None = None) -> None:
        """`running_pids`: the running engine's pids (empty: none runs; None: an engine runs but its
        pids are unknown, e.g. on another node)."""
        self.reader = reader
        self.running_pids = running_pids

    def view(self, replaces_running: bool = True) -> GpuMemoryView:
        samples = [s for s in self.reader.sample() if s.total_bytes is not None]
        if not samples:
            return GpuMemoryView(cards=None, blind="no card's memory is readable: no NVML, or no GPU")
        cards = tuple(CardMemory.from_sample(s) for s in samples)
        if not replaces_running:
            return GpuMemoryView(cards=cards, replaces_running=False)
        pids = self.running_pids() if self.running_pids is not None else None
        if pids is not None and not pids:
            return GpuMemoryView(cards=cards, held={})  # nothing runs: nothing to count back
        held = self.reader.process_memory(pids) if pids else None
        return GpuMemoryView(cards=cards, held=held)


class NothingReplaced:
    """The cards' memory for a start beside the running engines (engine_set.py): nothing is stopped
    first, so what the running engines hold never counts as free, whatever the caller asks."""

    def __init__(self, source: GpuMemoryLink) -> None:
        self.source = source

    def view(self, replaces_running: bool = True) -> GpuMemoryView:
        return self.source.view(replaces_running=False)
