"""A cache miss explains itself — the driver records each launch's compile factors, the
log's cache lines (real vLLM 0.26.0 lines from the H200), and why a miss happened; the metric
counts it by reason; bad cache roots are named."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner, Result

from appliance.recipe.compile_factors import DirState, MissReason, Variant, root_warnings
from appliance.recipe.launch_spec import LaunchSpec
from controller.api_client import ApiError
from controller.cli import api_cmd, recipes_cmd
from controller.metrics import ControllerMetrics
from controller.runtime.base import Provenance
from controller.store import Store
from controller.supervisor import compile_cache
from controller.supervisor.machine import State
from controller.supervisor.signals import Apply
from tests.unit.recipe_helpers import HOSTS, RECIPES_DIR, B
from tests.unit.supervisor_helpers import FakeEngine, make_spec
from tests.unit.test_supervisor_driver import Rig, make_rig

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "engine_logs" / "gpu-h200"
LOGGED_ROOT = "/root/app/cache/cuda-smollm2-graph-99ebe56812d3"
KEY_1 = "eng_" + "a" * 43
KEY_2 = "eng_" + "b" * 43


def _spec(root: Path, key: str) -> LaunchSpec:
    base = make_spec()
    return base.model_copy(update={
        "cache_root": str(root), "argv": ("/usr/bin/python3", "-m", "engine", "--dtype", "bfloat16"),
        "env": {**base.env, "VLLM_CACHE_ROOT": f"{root}/vllm", "VLLM_API_KEY": key},
    })


def _log(name: str, root: Path) -> str:
    """A real log, its cache paths moved under this test's root (the engine writes there); a name
    not ending in .log is the log text itself."""
    text = (LOGS / name).read_text() if name.endswith(".log") else name
    return text.replace(LOGGED_ROOT, str(root))


def _boot(root: Path, logs: dict[str, str]) -> Callable[[FakeEngine], None]:
    def boot(engine: FakeEngine) -> None:
        engine.log = _log(logs[engine.handle.launch_id], root)
        hashed = root / "vllm" / "torch_compile_cache" / "f100a03e45" / "rank_0_0" / "backbone"
        hashed.mkdir(parents=True, exist_ok=True)
        (hashed / "artifact").write_text("compiled")
        engine.healthy = True
    return boot


async def _ready(rig: Rig, launch_id: str) -> None:
    # force: the same spec hash again is a restart (the key was never part of the spec).
    assert rig.driver.submit(Apply("test-recipe", force=True)) is None
    await rig.run_until(
        lambda: rig.driver.machine.state is State.READY and rig.driver.machine.launch is not None
        and rig.driver.machine.launch.launch_id == launch_id, 300,
    )


async def _two_launches(tmp_path: Path, logs: dict[str, str], key_2: str = KEY_1,
                        between: Callable[[Path], None] | None = None) -> Rig:
    root = tmp_path / "cache" / "test-recipe-0123"
    rig = make_rig(tmp_path, _spec(root, KEY_1))
    rig.runtime.on_start = _boot(root, logs)
    await _ready(rig, "L1")
    if between is not None:
        between(root)
    rig.preflight.spec = _spec(root, key_2)
    await _ready(rig, "L2")
    return rig


def _misses(metrics: ControllerMetrics) -> dict[str, float | None]:
    return {r.value: metrics.value("appliance_compile_cache_misses_total", {"reason": r.value})
            for r in MissReason}


async def test_the_vllm_api_key_bug_is_named_and_the_key_is_never_stored(tmp_path: Path) -> None:
    rig = await _two_launches(tmp_path, {"L1": "graph-cold.log", "L2": "graph-cold.log"}, key_2=KEY_2)
    first, second = rig.store.get_launch("L1"), rig.store.get_launch("L2")
    assert first is not None and second is not None
    assert first.compile_cache["miss"] == {"reason": "cold_first", "compared_with": None,
                                           "details": ["first launch on this cache root"]}
    assert second.compile_cache["miss"] == {"reason": "env", "compared_with": "L1",
                                            "details": ["env VLLM_API_KEY changed"]}
    assert second.compile_cache["previous_launch"] == "L1"
    assert second.compile_cache["seen"]["cache_hash"] == "f100a03e45"
    assert second.compile_cache["seen"]["aot_path"].endswith("/rank_0_0/model")
    assert second.compile_cache["cache_root_state"]["non_empty"] is True
    assert second.compile_cache["previous_cache_dir"]["exists"] is True
    assert second.compile_cache["factors"]["versions"] == {}
    everything = json.dumps([r.model_dump(mode="json") for r in (first, second)]) + json.dumps(
        [e.model_dump(mode="json") for e in rig.store.events(limit=1000)])
    assert KEY_1 not in everything and KEY_2 not in everything and "eng_" not in everything
    assert {k: v for k, v in _misses(rig.driver.metrics).items() if v} == {"cold_first": 1.0, "env": 1.0}
    assert any(e.kind == "compile-cache-miss" and "VLLM_API_KEY" in e.message for e in rig.store.events())
    shown = rig.driver.status()["launch"]["compile_cache"]  # `appliance status` (status_view)
    assert (shown["cache_hash"], shown["miss"]["reason"], shown["previous_launch"]) == (
        "f100a03e45", "env", "L1")


async def test_a_warm_hit_records_its_cache_lines_and_no_miss(tmp_path: Path) -> None:
    rig = await _two_launches(tmp_path, {"L1": "graph-cold.log", "L2": "graph-warm.log"})
    second = rig.store.get_launch("L2")
    assert second is not None and second.cache == "hit" and "miss" not in second.compile_cache
    seen = second.compile_cache["seen"]
    assert seen["cache_hash"] == "f100a03e45"
    assert any("Directly load AOT compilation from path" in line for line in seen["evidence"])
    assert second.compile_cache["warnings"] == []


async def test_a_cache_root_deleted_between_launches_is_named(tmp_path: Path) -> None:
    rig = await _two_launches(tmp_path, {"L1": "graph-cold.log", "L2": "graph-cold.log"},
                              between=lambda root: shutil.rmtree(root))
    second = rig.store.get_launch("L2")
    assert second is not None
    assert second.compile_cache["miss"]["reason"] == "cache_emptied"
    assert second.compile_cache["previous_cache_dir"]["exists"] is False
    assert [w for w in second.compile_cache["warnings"] if "is gone now" in w]
    assert any(e.kind == "compile-cache-warning" and "is gone now" in e.message for e in rig.store.events())


async def test_a_root_shared_with_another_variant_is_named(tmp_path: Path) -> None:
    root = tmp_path / "cache" / "shared"
    rig = make_rig(tmp_path, _spec(root, KEY_1))
    rig.runtime.on_start = _boot(root, {"L1": "graph-cold.log", "L2": "graph-warm.log"})
    await _ready(rig, "L1")
    other = _spec(root, KEY_1).model_copy(update={"recipe": "other-recipe", "spec_hash": "fedcba9876543210"})
    rig.preflight.spec = other
    rig.driver.submit(Apply("other-recipe"))
    await rig.run_until(
        lambda: rig.driver.machine.state is State.READY and rig.driver.machine.recipe == "other-recipe", 300)
    second = rig.store.get_launch("L2")
    assert second is not None
    assert second.compile_cache["warnings"] == [
        f"cache root {root} is shared with other variants: test-recipe (spec 0123456789abcdef)"]
    assert second.compile_cache["previous_launch"] is None  # another variant is no baseline


def test_every_miss_reason_is_exported_at_zero_from_start_up() -> None:
    m = ControllerMetrics()
    assert _misses(m) == dict.fromkeys([r.value for r in MissReason], 0.0)
    m.record_compile_cache_miss(MissReason.FLAG)
    assert _misses(m)["flag"] == 1.0
    assert b'appliance_compile_cache_misses_total{reason="cache_emptied"} 0.0' in m.render()[0]


# ---- the CLI: `appliance status` and `appliance launches ID`

MISS = {"reason": "env", "compared_with": "L1", "details": ["env VLLM_API_KEY changed"]}
WARNING = "cache root /c is shared with other variants: other (spec fedcba9876543210)"


class _Client:
    base = "http://127.0.0.1:1"
    token = "t"

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers

    def get(self, path: str) -> Any:
        if path == "/load" and path not in self.answers:  # a controller without the load sampler
            raise ApiError(404, "Not Found")
        return self.answers[path]


def _cli(monkeypatch: pytest.MonkeyPatch, answers: dict[str, Any], *args: str) -> Result:
    app = typer.Typer()
    api_cmd.register(app)
    monkeypatch.setattr(api_cmd, "_client", lambda api: _Client(answers))
    return CliRunner().invoke(app, list(args))


def test_status_says_why_the_compile_cache_missed(monkeypatch: pytest.MonkeyPatch) -> None:
    launch = {"id": "L2", "kind": "normal", "runtime": "process", "ref": "1", "engine_url": "http://e",
              "served_model_name": "m", "ready_s": 230.0, "cache": "miss", "phases": [],
              "compile_cache": {"cache_hash": "f100a03e45", "aot_path": "/c/aot/model", "miss": MISS,
                                "previous_launch": "L1", "warnings": [WARNING]}}
    result = _cli(monkeypatch, {"/status": {"state": "ready", "recipe": "r", "launch": launch}}, "status")
    assert result.exit_code == 0, result.output
    assert "compile:    vLLM cache dir f100a03e45, AOT /c/aot/model" in result.output
    assert "cache miss: env vs launch L1: env VLLM_API_KEY changed" in result.output
    assert f"WARNING:    {WARNING}" in result.output


def test_launches_id_keeps_json_on_stdout_and_says_why_on_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    record = {"id": "L2",
              "compile_cache": {"seen": {"cache_hash": "f100a03e45"}, "miss": MISS, "warnings": []}}
    result = _cli(monkeypatch, {"/launches/L2": record}, "launches", "L2", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == record
    assert "cache miss: env vs launch L1: env VLLM_API_KEY changed" in result.stderr


# ---- `launches ID` is a page to read; `--json` the record; a unique prefix will do

FULL_RECORD = {
    "id": "cpu-smollm2-20261201-110000-ab12", "recipe": "cpu-smollm2", "spec_hash": "0123456789abcdef0123",
    "kind": "normal", "runtime": "process", "status": "ready", "created_at": 1_700_000_000.0,
    "started_at": 1_700_000_000.0, "ready_at": 1_700_000_036.2, "ready_s": 36.2, "ended_at": None,
    "cache": "miss", "exit_code": None, "exit_signal": None, "oom_killed": None,
    "mem_available_min_bytes": 3 * 2**30, "swap_peak_bytes": 2**29,
    "phases": [{"name": "spawned", "at": 1_700_000_000.5, "elapsed_s": 0.5, "detail": ""},
               {"name": "weights_loaded", "at": 1_700_000_012.0, "elapsed_s": 12.0, "detail": "0.26 GiB"},
               {"name": "ready", "at": 1_700_000_036.2, "elapsed_s": 36.2, "detail": ""}],
    "gpu_peaks": {"warmup": {"0": {"used_max_bytes": 60 * 2**30, "total_bytes": 140 * 2**30,
                                   "busy_max_percent": 97.0}}},
    "oom": [{"task": "VLLM::Worker"}],
    "diagnosis": {"code": "oom_host", "severity": "error", "summary": "the host ran out of memory",
                  "hint": "lower max_model_len", "evidence": ["Out of memory: Killed process 1"]},
    "compile_cache": {"seen": {"cache_hash": "f100a03e45"}, "miss": MISS, "previous_launch": "L1",
                      "warnings": []},
    "argv": ["x"] * 200, "env": {f"V{i}": "1" for i in range(100)}, "events": [],
}


class _LookupClient(_Client):
    """Answers like the API: 404 for an unknown launch ID."""

    def get(self, path: str) -> Any:
        if path not in self.answers:
            raise ApiError(404, f"no launch {path!r}")
        return self.answers[path]


def _lookup_cli(monkeypatch: pytest.MonkeyPatch, answers: dict[str, Any], *args: str) -> Result:
    app = typer.Typer()
    api_cmd.register(app)
    monkeypatch.setattr(api_cmd, "_client", lambda api: _LookupClient(answers))
    return CliRunner().invoke(app, list(args))


def test_launches_id_is_a_readable_page_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    lid = FULL_RECORD["id"]
    result = _lookup_cli(monkeypatch, {f"/launches/{lid}": FULL_RECORD}, "launches", str(lid))
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert not out.lstrip().startswith("{") and len(out.splitlines()) < 40
    for expected in ("status     ready", "ready in   36.2 s", "weights_loaded  0.26 GiB", "    12.0 s",
                     "compile cache miss (compared with launch L1)",
                     "cache miss: env vs launch L1: env VLLM_API_KEY changed",
                     "MemAvailable low 3.0 GiB, swap peak 0.5 GiB",
                     "GPU 0 during warmup: 60.0 GiB of 140.0 GiB, busy up to 97%",
                     "OOM        1 kernel OOM record(s); victims: VLLM::Worker",
                     "diagnosis  oom_host (error): the host ran out of memory",
                     "hint:     lower max_model_len",
                     f"appliance launches {lid} --json"):
        assert expected in out, (expected, out)
    full = _lookup_cli(monkeypatch, {f"/launches/{lid}": FULL_RECORD}, "launches", str(lid), "--json")
    assert json.loads(full.stdout) == FULL_RECORD


def _summaries(*ids: str) -> list[dict[str, str]]:
    return [{"id": i} for i in ids]


def test_launches_accepts_a_unique_id_prefix_and_names_the_candidates_of_an_ambiguous_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    lid = str(FULL_RECORD["id"])
    other = "cpu-smollm2-20261201-120000-cd34"
    answers = {f"/launches/{lid}": FULL_RECORD, "/launches?limit=1000": _summaries(other, lid, "gfx-1")}
    unique = _lookup_cli(monkeypatch, answers, "launches", "cpu-smollm2-20261201-11", "--json")
    assert unique.exit_code == 0, unique.output
    assert json.loads(unique.stdout)["id"] == lid
    ambiguous = _lookup_cli(monkeypatch, answers, "launches", "cpu-smollm2")
    assert ambiguous.exit_code == 2
    assert "ambiguous" in ambiguous.stderr and lid in ambiguous.stderr and other in ambiguous.stderr
    assert "gfx-1" not in ambiguous.stderr and "Traceback" not in ambiguous.output
    missing = _lookup_cli(monkeypatch, answers, "launches", "nope")
    assert missing.exit_code == 2 and "no launch 'nope'" in missing.stderr


# ---- `appliance plan`: bad cache roots are named before anything starts


def _plan(monkeypatch: pytest.MonkeyPatch, home: Path, *args: str) -> tuple[int, str]:
    monkeypatch.setenv("APPLIANCE_RECIPES", str(RECIPES_DIR))
    monkeypatch.setenv("APPLIANCE_HOME", str(home))
    app = typer.Typer()
    recipes_cmd.register(app)
    result = CliRunner().invoke(app, ["plan", B, "--host-root", str(HOSTS / "reference"), *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout


def test_plan_names_a_cache_root_that_is_not_writable(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    code, out = _plan(monkeypatch, tmp_path, "--json")
    data = json.loads(out)
    assert code == 0 and data["cache_warnings"] == []  # a fresh root under a writable home: fine
    # Tests run as root, to whom access(2) says yes: the seam says no.
    monkeypatch.setattr(compile_cache, "writable", lambda path: False)
    code, out = _plan(monkeypatch, tmp_path)
    assert code == 0  # a warning, not a refusal
    assert f"compile cache root: {data['cache_root']}" in out
    assert f"WARNING cache root {data['cache_root']} is not writable: every start compiles" in out


def test_plan_names_a_root_deleted_since_a_launch_and_one_shared_with_another_variant(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    root = json.loads(_plan(monkeypatch, tmp_path, "--json")[1])["cache_root"]
    store = Store(tmp_path / "appliance.sqlite3")
    ran = make_spec(recipe=B).model_copy(update={"cache_root": root})
    store.create_launch("L1", ran, "normal", Provenance(), now=100.0)
    # A harness launch of another variant pinned to the same directory (render's cache_root=).
    other = make_spec(recipe="other").model_copy(update={"cache_root": root, "spec_hash": "fedcba9876543210"})
    store.create_launch("L2", other, "normal", Provenance(), now=200.0)
    store.close()
    data = json.loads(_plan(monkeypatch, tmp_path, "--json")[1])
    assert data["cache_warnings"] == [
        f"cache root {root} was used by launch L2 and is gone now: this start is cold",
        f"cache root {root} is shared with other variants: other (spec fedcba9876543210)",
    ]
    Path(root).mkdir(parents=True)
    (Path(root) / "x").write_text("kept")
    data = json.loads(_plan(monkeypatch, tmp_path, "--json")[1])
    assert [w for w in data["cache_warnings"] if "gone" in w] == []


def test_root_warnings_are_pure_words() -> None:
    root = DirState(path="/c/r", exists=False, non_empty=False, writable=False)
    assert root_warnings(root, "a", "h1", others=[Variant(recipe="a", spec_hash="h2"),
                                                   Variant(recipe="b", spec_hash="h1"),
                                                   Variant(recipe="b", spec_hash="h3")],
                         used_by="L9") == [
        "cache root /c/r is not writable: every start compiles, nothing is kept",
        "cache root /c/r was used by launch L9 and is gone now: this start is cold",
        "cache root /c/r is shared with other variants: b (spec h3)",
    ]
    assert root_warnings(root.model_copy(update={"writable": True}), "a", "h1", used_by="L9",
                         emptied_on_purpose=True) == []


async def test_an_earlier_launch_that_never_reached_the_compile_is_no_baseline(tmp_path: Path) -> None:
    # L1 logged no cache line (it was stopped while loading weights, say): L2's cold start is
    # cold_first, not "unknown" — L1 left nothing to reuse.
    rig = await _two_launches(tmp_path, {"L1": "INFO Loading weights took 1.00 seconds\n",
                                         "L2": "graph-cold.log"})
    second = rig.store.get_launch("L2")
    assert second is not None and second.compile_cache["previous_launch"] is None
    assert second.compile_cache["miss"] == {
        "reason": "cold_first", "compared_with": None,
        "details": ["no earlier launch of this variant on this root reached torch.compile (L1)"]}
