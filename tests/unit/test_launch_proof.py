"""Kernel-path and deployment proof: the pure evaluation of log + digests, the gathering at ready
through the supervisor's hook (fake runtime at the declared seam, real files), and the read-back
that fails the gate."""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from appliance.observe.launch_proof import (
    DEFAULT_FORBIDDEN_MARKERS,
    evaluate,
    per_rank_counts,
    rank_of,
    versions,
)
from appliance.recipe.recipe_model import Expectations
from controller.evaluation.proof import (
    PROOF_EVENT,
    WARNING_EVENT,
    compile_cache_digest,
    host_swap,
    proof_from_events,
    ready_hook,
)
from tests.unit import test_api as _api
from tests.unit.test_api import AUTH, Rig

home, rig, client = _api.home, _api.rig, _api.client

LOG = """\
(APIServer pid=10) INFO [api_server.py:1] vLLM API server version 0.32.0
(VllmWorker TP0 pid=11) INFO [backends.py:2] Directly load AOT compilation from path /c/rank_0/model
(VllmWorker TP1 pid=12) INFO [backends.py:3] Compiling a graph for dynamic shape takes 12.5 s
(VllmWorker TP1 pid=12) INFO [codecache.py:4] fx graph cache miss for key abc123
(EngineCore_DP0 pid=13) INFO [codecache.py:5] fx graph cache hit for key def456
INFO [gfx906.py:9] GFX906 int8 sdot4 path selected.
"""


def test_markers_and_checksums_are_checked_as_declared() -> None:
    good = "a" * 64
    proof = evaluate(
        LOG,
        ["sdot4 path selected.", "triton attention selected."],
        {"/lib/_C_stable_libtorch.so": good, "/lib/other.so": good, "/missing.so": good},
        {"/lib/_C_stable_libtorch.so": good, "/lib/other.so": "b" * 64, "/missing.so": None},
    )
    assert proof.markers == {"sdot4 path selected.": True, "triton attention selected.": False}
    assert proof.checksums == {
        "/lib/_C_stable_libtorch.so": True,
        "/lib/other.so": False,
        "/missing.so": False,
    }
    assert proof.problems == [
        "log marker not seen: 'triton attention selected.'",
        "checksum mismatch: /lib/other.so (bbbbbbbbbbbbbbbb)",
        "checksum mismatch: /missing.so (unreadable)",
    ]
    assert evaluate(LOG, [], {}, {}).problems == []


def test_loads_and_compiles_are_counted_per_rank() -> None:
    counts = per_rank_counts(LOG.splitlines())
    assert {k: (v.loads, v.compiles) for k, v in counts.items()} == {
        "rank0": (1, 0),
        "rank1": (0, 2),
        "engine-core": (1, 0),
    }
    assert rank_of("(Worker_TP3 pid=9) x") == "rank3" and rank_of("plain line") == "main"
    torch_line = (
        "[rank0]:I1130 08:44:59.35 3579 torch/_inductor/codecache.py:1] fx graph cache hit for key k1"
    )
    assert rank_of(torch_line) == "rank0"
    assert {k: (v.loads, v.compiles) for k, v in per_rank_counts([torch_line]).items()} == {"rank0": (1, 0)}
    assert versions(LOG) == {"vllm": "0.32.0"}


def test_recipe_checksums_are_md5_or_sha256() -> None:
    digests = {"/f": "A" * 64, "/g": "B" * 32}
    ok = Expectations(ready_budget_s=60, markers=("x selected.",), checksums=digests)
    assert ok.checksums == {"/f": "a" * 64, "/g": "b" * 32}
    with pytest.raises(ValidationError, match=r"md5 \(32 hex characters\) or sha256"):
        Expectations(ready_budget_s=60, checksums={"/f": "md5:1234"})


def test_an_md5_declared_file_is_digested_with_md5_and_matches(tmp_path: Path) -> None:
    lib = tmp_path / "_C_stable_libtorch.so"
    lib.write_bytes(b"packed silu fixed")
    md5 = hashlib.md5(b"packed silu fixed").hexdigest()
    from controller.evaluation.proof import collect
    from controller.runtime.base import EngineHandle
    from tests.unit.spec_helpers import launch_spec

    spec = launch_spec("process", cache_root=str(tmp_path / "cache"))
    handle = EngineHandle(
        launch_id="L1", runtime="process", ref="1", recipe="r", spec_hash="h", started_at=0.0
    )
    proof = collect(_LogOnly(), handle, spec, (), {str(lib): md5})  # type: ignore[arg-type]
    assert proof.checksums == {str(lib): True} and proof.actual_checksums[str(lib)] == md5


def test_must_not_appear_markers_are_checked_by_default_and_per_recipe() -> None:
    crashed = LOG + "Traceback (most recent call last):\n  File x\nRuntimeError: capture failed\n"
    proof = evaluate(crashed, [], {}, {}, (*DEFAULT_FORBIDDEN_MARKERS, "capture failed"))
    assert proof.forbidden["Traceback (most recent call last)"] and proof.forbidden["capture failed"]
    assert not proof.forbidden["EngineDeadError"]
    assert "must-not-appear marker seen: 'capture failed'" in proof.problems
    assert evaluate(LOG, [], {}, {}).problems == []  # a clean log passes the defaults
    with pytest.raises(ValidationError, match="slo names unknown tier"):
        Expectations(ready_budget_s=60, slo={"2-4K": {"ttft_ms": 100}})
    slo = Expectations(ready_budget_s=60, slo={"8-16K": {"ttft_ms": 2000, "tpot_ms": 200}}).slo
    assert slo["8-16K"].tpot_ms == 200


def test_compile_cache_digest_changes_with_an_artifact(tmp_path: Path) -> None:
    (tmp_path / "inductor").mkdir()
    (tmp_path / "inductor" / "a.py").write_text("x = 1\n")
    first = compile_cache_digest(str(tmp_path))
    assert first["files"] == 1 and first["first"] == {"inductor/a.py": hashlib.sha256(b"x = 1\n").hexdigest()}
    (tmp_path / "inductor" / "a.py").write_text("x = 2\n")
    assert compile_cache_digest(str(tmp_path))["sha256"] != first["sha256"]
    assert compile_cache_digest(str(tmp_path / "absent")) == {"root": str(tmp_path / "absent"), "files": 0}


def test_host_swap_reads_meminfo_and_swappiness(tmp_path: Path) -> None:
    (tmp_path / "sys" / "vm").mkdir(parents=True)
    (tmp_path / "meminfo").write_text("MemTotal: 32778164 kB\nSwapTotal:       4194300 kB\n")
    (tmp_path / "sys" / "vm" / "swappiness").write_text("200\n")
    assert host_swap(tmp_path) == {"swap_total_bytes": 4194300 * 1024, "swappiness": 200}


async def test_the_proof_is_recorded_at_ready_and_a_missing_marker_warns_and_reads_back_as_a_problem(
    home: Path, tmp_path: Path
) -> None:
    lib = tmp_path / "_C_stable_libtorch.so"
    lib.write_bytes(b"packed silu fixed")
    digest = hashlib.sha256(b"packed silu fixed").hexdigest()
    declared = (("sdot4 path selected.", "never printed selected."), {str(lib): digest})
    # As service.build wires it: the hook is a constructor argument, made with the event stream's note.
    rig = Rig(home, on_ready=lambda runtime, events: ready_hook({"process": runtime}, lambda name: declared,
                                                                 events.note))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=rig.app),
                                 base_url="http://127.0.0.1:8090") as client:
        await _proof_recorded(rig, client, lib)


async def _proof_recorded(rig: Rig, client: httpx.AsyncClient, lib: Path) -> None:
    assert (await client.post("/apply", json={"recipe": "cpu-smollm2"}, headers=AUTH)).status_code == 202
    await rig.step(1)
    rig.runtime.current().log = LOG
    rig.runtime.current().healthy = True
    for _ in range(3):
        await rig.step(1)
    launch_id = rig.driver.machine.launch.launch_id if rig.driver.machine.launch else ""
    record = (await client.get(f"/launches/{launch_id}")).json()
    kinds = [e["kind"] for e in record["events"]]
    assert PROOF_EVENT in kinds and WARNING_EVENT in kinds
    proof_event = next(e for e in record["events"] if e["kind"] == PROOF_EVENT)
    assert proof_event["data"]["checksums"] == {str(lib): True}
    assert proof_event["data"]["versions"] == {"vllm": "0.32.0"}
    assert "swappiness" in proof_event["data"]["host"]
    warning = next(e for e in record["events"] if e["kind"] == WARNING_EVENT)
    assert warning["message"] == "log marker not seen: 'never printed selected.'"
    assert proof_from_events(record["events"]).problems == ["log marker not seen: 'never printed selected.'"]


class _LogOnly:
    """A runtime at the seam that only serves the engine log (no EngineFiles capability)."""

    def read_logs(self, handle: object, offset: int) -> tuple[str, int]:
        text = LOG.encode()[offset:].decode()
        return text, offset + len(text.encode())


def test_an_engine_on_another_machine_is_not_proven_by_this_hosts_files(tmp_path: Path) -> None:
    """Same declared file, same cache root on this host: digested for a local process, but for a
    remote runtime (kubernetes: the engine's files are on its node) recorded as unreadable, and the
    cache and swap as not read from here — never this host's figures passed off as the engine's."""
    from controller.evaluation.proof import collect
    from controller.runtime.base import EngineHandle
    from tests.unit.spec_helpers import launch_spec

    lib = tmp_path / "lib.so"
    lib.write_bytes(b"kernel library")
    digest = hashlib.sha256(b"kernel library").hexdigest()
    cache = tmp_path / "cache"
    (cache / "inductor").mkdir(parents=True)
    (cache / "inductor" / "artifact").write_bytes(b"x")
    handle = EngineHandle(launch_id="L1", runtime="process", ref="1", recipe="r", spec_hash="h",
                          started_at=0.0)
    checksums = {str(lib): digest}

    local = collect(_LogOnly(), handle, launch_spec("process", cache_root=str(cache)),  # type: ignore[arg-type]
                    (), checksums)
    assert local.checksums == {str(lib): True} and not local.problems
    assert local.compile_cache["files"] == 1
    assert local.host["swap_total_bytes"] is not None

    remote_spec = launch_spec("kubernetes", {"image": "vllm-cpu:0.11.0"}, cache_root=str(cache))
    remote = collect(_LogOnly(), handle, remote_spec, (), checksums)  # type: ignore[arg-type]
    assert remote.actual_checksums == {str(lib): None}
    assert remote.problems == [f"checksum mismatch: {lib} (unreadable)"]
    assert remote.compile_cache == {"root": str(cache), "files": None, "on_this_host": False}
    assert remote.host == {"swap_total_bytes": None, "swappiness": None}
    assert remote.versions == local.versions  # the log is still read, through the runtime


H200_RUNS = Path(__file__).resolve().parents[1] / "fixtures/engine_logs/gpu-h200-accept-2026-12-01d/runs"


def _h200_log(recipe: str) -> str:
    (run,) = sorted(H200_RUNS.glob(f"*-{recipe}-*"))[:1]
    return (run / "engine.log").read_text()


@pytest.mark.parametrize("recipe", ["cuda-smollm2-eager", "cuda-smollm2-graph", "cuda-smollm2-piecewise"])
def test_each_cuda_recipes_path_markers_are_in_its_real_h200_log_and_in_no_sibling_s(recipe: str) -> None:
    # Issue 33: markers prove the kernel path, not the mode. Every declared marker is a line vLLM 0.26
    # really printed for that recipe on the H200, at least one proves more than the mode, and the
    # set is not satisfied by a sibling's log (piecewise and full graphs share `enforce_eager=False`).
    from appliance.observe.launch_proof import evaluate, proves_path
    from tests.unit.recipe_helpers import shipped

    markers = shipped()[recipe].expect.markers
    assert any(proves_path(m) for m in markers)
    assert all(evaluate(_h200_log(recipe), markers, {}, {}).markers.values())
    for other in {"cuda-smollm2-eager", "cuda-smollm2-graph", "cuda-smollm2-piecewise"} - {recipe}:
        assert not all(evaluate(_h200_log(other), markers, {}, {}).markers.values()), other


def test_every_shipped_gpu_recipe_but_the_generic_one_declares_a_path_marker() -> None:
    from appliance.observe.launch_proof import proves_path
    from tests.unit.recipe_helpers import shipped

    lacking = sorted(n for n, r in shipped().items()
                     if r.platform.value != "cpu" and not r.abstract
                     and not any(proves_path(m) for m in r.expect.markers))
    assert lacking == ["cuda-generic"]  # an upstream image whose log lines are not on record here


def test_the_effective_scheduler_limits_are_read_from_the_engines_own_log() -> None:
    # Issue 33: record what the engine used, not None for a default. vLLM 0.26 on the H200 states
    # max_num_batched_tokens at INFO; it states a defaulted max_num_seqs only at DEBUG.
    from appliance.evaluation.arm_settings import ENGINE_DEFAULT, settings_of
    from appliance.observe.launch_proof import evaluate

    proof = evaluate(_h200_log("cuda-smollm2-graph"), (), {}, {})
    assert proof.engine_limits == {"max_num_batched_tokens": 8192}
    s = settings_of({"engine": {}}, output_tokens=64, ignore_eos=False, logged=proof.engine_limits)
    assert s["max_num_batched_tokens"] == 8192
    assert s["limits_source"]["max_num_batched_tokens"] == "engine log"
    assert s["max_num_seqs"] == ENGINE_DEFAULT  # never None: None read as "equal" for any two defaults
    recipe_set = settings_of({"engine": {"max_num_seqs": 8}}, output_tokens=64, ignore_eos=False)
    assert recipe_set["max_num_seqs"] == 8
