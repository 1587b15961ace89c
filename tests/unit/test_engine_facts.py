"""Engine facts from a GPU start-up log: attention backend, model runner, vLLM's memory
breakdown, KV cache, graph pool — parsed, and kept in the launch record."""

from __future__ import annotations

from pathlib import Path

from appliance.observe.engine_facts import read_facts
from controller.supervisor.signals import Apply
from tests.unit.test_supervisor_driver import make_rig

LOG = """\
(EngineCore pid=2) INFO 11-30 08:00:30 [cuda.py:1] Using FLASH_ATTN attention backend out of potential backends: ['FLASH_ATTN', 'TRITON_ATTN']
(EngineCore pid=2) INFO 11-30 08:00:30 [flash_attn.py:1] Using FlashAttention version 3
(EngineCore pid=2) INFO 11-30 08:01:00 [gpu_worker.py:1] Free memory on device (139.2/139.8 GiB) on startup. Desired GPU memory utilization is (0.3, 41.9 GiB). Actual usage is 0.26 GiB for weight, 1.4 GiB for peak activation, 0.06 GiB for non-torch memory, and 0.39 GiB for CUDAGraph memory. Replace gpu_memory_utilization config with `--kv-cache-memory=1` to fit into requested memory.
(EngineCore pid=2) INFO 11-30 08:01:00 [gpu_worker.py:1] Available KV cache memory: 41.3 GiB
(EngineCore pid=2) INFO 11-30 08:01:00 [kv_cache_utils.py:1] GPU KV cache size: 1,923,456 tokens
(EngineCore pid=2) INFO 11-30 08:01:05 [gpu_model_runner.py:1] Graph capturing finished in 4 secs, took 0.39 GiB
"""  # noqa: E501


def test_the_start_up_facts_are_read() -> None:
    f = read_facts(LOG)
    assert f.attention_backend == "FLASH_ATTN" and f.flash_attn_version == 3
    assert f.memory is not None
    assert (f.memory.free_gib, f.memory.total_gib, f.memory.utilization, f.memory.requested_gib) == \
        (139.2, 139.8, 0.3, 41.9)
    assert (f.memory.weights_gib, f.memory.peak_activation_gib, f.memory.non_torch_gib,
            f.memory.cudagraph_gib) == (0.26, 1.4, 0.06, 0.39)
    assert f.kv_cache_available_gib == 41.3 and f.kv_cache_tokens == 1923456
    assert f.graph_capture_seconds == 4 and f.graph_pool_gib == 0.39


def test_garbage_and_cpu_logs_give_no_facts() -> None:
    assert read_facts("\x00\x01 nothing \r\r 100%|####| 51/51\n").is_empty()


async def test_the_launch_record_keeps_the_engine_facts_and_the_starts_seconds(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.driver.submit(Apply("test-recipe"))
    await rig.step(1)
    rig.runtime.current().log += LOG + (
        "(EngineCore pid=2) INFO [monitor.py:1] torch.compile and initial profiling/warmup run together "
        "took 22.42 s in total\n")
    await rig.step(1)
    rec = rig.store.get_launch("L1")
    assert rec is not None
    assert rec.engine["attention_backend"] == "FLASH_ATTN"
    assert rec.engine["memory"]["cudagraph_gib"] == 0.39
    assert rec.engine["compile_seconds"] == 22.42
