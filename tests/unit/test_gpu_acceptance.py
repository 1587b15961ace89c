"""The GPU acceptance run's judge (docs/gpu-h200.md) on inputs built from the real H200 run.

tests/fixtures/engine_logs/gpu-h200/ holds the engine logs and launch records of the 2026-11-30 run
(docs/gpu-h200.md); the acceptance folders are assembled from them as
scripts/gpu_h200/acceptance.sh packs them (`launch-ID.json`, `runs/ID/engine.log`, `gateway.jsonl`,
`steps.tsv`). Folders tests/fixtures/engine_logs/gpu-h200-accept-*/ (what `acceptance_judge.py
--fixtures` writes after a real run) are re-judged here and must PASS.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from appliance.evaluation.gpu_acceptance import (
    GatewayAnswer,
    Verdict,
    inputs_from_files,
    judge,
    log_facts,
    redact,
    render_markdown,
    replace_section,
)

ROOT = Path(__file__).resolve().parents[2]
LOGS = ROOT / "tests" / "fixtures" / "engine_logs"
H200 = LOGS / "gpu-h200"
ACCEPT_DIRS = sorted(p for p in LOGS.glob("gpu-h200-accept-*") if p.is_dir())

GRAPH_COLD = "20261130T081159-cuda-smollm2-graph-b43302"
GRAPH_WARM = "20261130T081329-cuda-smollm2-graph-376355"
PW_COLD = "20261130T081516-cuda-smollm2-piecewise-3b7fdf"
PW_WARM = "20261130T081626-cuda-smollm2-piecewise-415a29"
EAGER = "20261130T081743-cuda-smollm2-eager-ce6829"
EAGER_2 = "20261130T081855-cuda-smollm2-eager-e80cfb"
LAUNCH_LOGS = {GRAPH_COLD: "graph-cold", GRAPH_WARM: "graph-warm", PW_COLD: "piecewise-cold",
               PW_WARM: "piecewise-warm", EAGER: "eager-cold", EAGER_2: "eager-warm"}
STEPS = ("up-graph", "apply-piecewise", "apply-eager")


def _record(launch_id: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((H200 / "records" / f"launch-{launch_id}.json").read_text())
    return data


def _files(launches: tuple[str, ...] = tuple(LAUNCH_LOGS), *,
           log_edit: Callable[[str, str], str] = lambda lid, text: text,
           record_edit: Callable[[dict[str, Any]], None] = lambda r: None,
           status: dict[str, int | None] | None = None,
           steps: dict[str, str] | None = None) -> dict[str, str]:
    """An acceptance folder as {relative path: text}, as acceptance.sh packs it."""
    files: dict[str, str] = {}
    for lid in launches:
        rec = _record(lid)
        record_edit(rec)
        files[f"launch-{lid}.json"] = json.dumps(rec)
        files[f"runs/{lid}/engine.log"] = log_edit(lid, (H200 / f"{LAUNCH_LOGS[lid]}.log").read_text())
    # one answer after each step, against the engine then serving: the recipe's last launch
    answers = []
    for step, lid in (("up-graph", GRAPH_WARM), ("apply-piecewise", PW_WARM), ("apply-eager", EAGER)):
        if lid in launches:
            code = (status or {}).get(step, 200)
            answers.append(json.dumps({"step": step, "recipe": _record(lid)["recipe"], "launch_id": lid,
                                       "status": code, "answer": "The capital of France is Paris."}))
    files["gateway.jsonl"] = "\n".join(answers) + "\n"
    files["steps.tsv"] = "".join(f"{s}\t{(steps or {}).get(s, 'ok')}\n" for s in STEPS)
    files["status-up-graph.json"] = "{}"  # what the judge does not read is ignored
    return files


def _judge(files: dict[str, str], expected: tuple[str, ...] | None = None) -> Verdict:
    inputs = inputs_from_files(files)
    if expected is None:
        return judge(inputs.records, inputs.logs, inputs.answers, inputs.steps)
    return judge(inputs.records, inputs.logs, inputs.answers, inputs.steps, expected)


def test_log_facts_of_the_real_lines() -> None:
    cold = log_facts((H200 / "graph-cold.log").read_text())
    warm = log_facts((H200 / "graph-warm.log").read_text())
    assert cold.cache_hash == warm.cache_hash == "f100a03e45"
    assert cold.cache_dir is not None and cold.cache_dir.endswith("/f100a03e45/rank_0_0/backbone")
    assert (cold.aot_saved, cold.aot_loaded, cold.compile_s) == (True, False, 18.35)
    assert (warm.aot_saved, warm.aot_loaded, warm.compile_s) == (False, True, 3.93)
    assert log_facts("(EngineCore pid=1) INFO torch.compile takes 12.5 s in total").compile_s == 12.5
    eager = log_facts((H200 / "eager-cold.log").read_text())
    assert (eager.cache_hash, eager.aot, eager.compile_s) == (None, "–", None)


def test_every_warm_restart_a_hit_passes() -> None:
    v = _judge(_files())
    assert v.passed, v.failures
    assert v.date == "2026-11-30"
    starts = [(r.recipe.removeprefix("cuda-smollm2-"), r.start) for r in v.rows]
    assert starts == [("graph", "cold"), ("graph", "warm"), ("piecewise", "cold"), ("piecewise", "warm"),
                      ("eager", "cold"), ("eager", "warm")]
    pw = next(r for r in v.rows if r.launch_id == PW_WARM)
    assert (pw.cache, pw.facts.cache_hash, pw.facts.aot, pw.facts.compile_s, pw.gateway) == (
        "hit", "6a809c5c86", "loaded", 3.40, (200,))
    assert v.ratios["cuda-smollm2-graph"] == [round(37.497 / 89.396, 3)]  # 0.419
    md = render_markdown(v)
    assert md.startswith("**PASS**") and "| date | recipe | start | ready (s) | cache | cache dir |" in md
    assert ("| 2026-11-30 08:13 | `cuda-smollm2-graph` | warm (warm) | 37.5 | hit | f100a03e45 | loaded "
            "| 3.93 | 200 |") in md
    assert "warm/cold ready: 0.42; median 0.42 (goal ≤ 0.45: met" in md


def test_a_warm_start_in_another_cache_dir_fails_and_says_which() -> None:
    def moved(lid: str, text: str) -> str:
        return text.replace("torch_compile_cache/f100a03e45/", "torch_compile_cache/0123456789/") \
            if lid == GRAPH_WARM else text

    v = _judge(_files(log_edit=moved))
    assert not v.passed
    [failure] = v.failures
    assert failure.startswith(f"graph warm ({GRAPH_WARM}): warm restart is not a hit")
    assert "cache dir 0123456789 ≠ cold start's f100a03e45" in failure


def test_a_miss_fails() -> None:
    def recompiled(lid: str, text: str) -> str:  # the warm start compiled again: saved, not loaded
        return (H200 / "graph-cold.log").read_text() if lid == GRAPH_WARM else text

    def miss(rec: dict[str, Any]) -> None:
        if rec["id"] == GRAPH_WARM:
            rec["cache"] = "miss"

    v = _judge(_files(log_edit=recompiled, record_edit=miss))
    [failure] = v.failures
    assert "record cache 'miss', not 'hit'" in failure
    assert "no `Directly load AOT compilation from path` (AOT saved)" in failure
    # the record alone saying hit is not enough either: the AOT artifact must have been loaded
    assert not _judge(_files(log_edit=recompiled)).passed


def test_a_non_200_gateway_answer_fails() -> None:
    v = _judge(_files(status={"apply-piecewise": 503}))
    assert v.failures == ["gateway after apply-piecewise: 503"]
    assert not _judge(_files(status={"up-graph": None})).passed


def test_eager_needs_no_hit_only_ready_and_the_gateway() -> None:
    v = _judge(_files((EAGER, EAGER_2)), expected=("cuda-smollm2-eager",))
    assert v.passed, v.failures
    assert [r.cache for r in v.rows] == [None, None]

    def never_ready(rec: dict[str, Any]) -> None:
        rec.update(ready_s=None, status="failed", diagnosis_code="engine_config_invalid")

    v = _judge(_files((EAGER,), record_edit=never_ready), expected=("cuda-smollm2-eager",))
    assert v.failures == [
        f"eager cold ({EAGER}): never ready (status failed, diagnosis engine_config_invalid)"]


def test_skipped_steps_missing_recipes_and_a_warm_first_start_fail() -> None:
    assert _judge(_files(steps={"apply-eager": "skipped"})).failures == ["step apply-eager: skipped"]
    v = _judge(_files((GRAPH_COLD, GRAPH_WARM, PW_COLD, PW_WARM)))
    assert v.failures == ["eager: no launch of cuda-smollm2-eager"]
    # a compiled recipe whose first start already hit: the cache root was not empty
    v = _judge(_files((GRAPH_WARM,)), expected=("cuda-smollm2-graph",))
    assert any("the first start was not cold" in f for f in v.failures)
    assert any("no warm restart to judge" in f for f in v.failures)


def test_redact_the_appliance_secrets() -> None:
    eng = "eng_" + "A" * 40 + "-_9"
    text = (f"non-default args: {{'api_key': ['{eng}'], 'port': 8000}}\n"
            "export APPLIANCE_ADMIN_TOKEN=adm_" + "x" * 43 + "\n"
            "client key  'default' (id b568910994e7; shown once): sk-app-b568910994e7-" + "k" * 43 + "\n"
            "Authorization: Bearer sk-app-b568910994e7-" + "Q" * 43 + "\n")
    out = redact(text, secrets=("adm_literal",))
    assert "eng_<redacted>" in out and eng not in out
    assert "APPLIANCE_ADMIN_TOKEN=<redacted>" in out and "x" * 43 not in out
    assert "k" * 43 not in out and "Q" * 43 not in out
    assert redact(out) == out


def test_the_docs_section_is_inserted_once_then_replaced() -> None:
    v = _judge(_files())
    doc = "# H200\n\nintro\n\n## Exact commands\n\nrun it\n"
    once = replace_section(doc, v)
    assert once.index("## Acceptance run 2026-11-30") < once.index("## Exact commands")
    assert "**PASS**" in once
    failed = _judge(_files(status={"apply-eager": 500}))
    twice = replace_section(once, failed)
    assert twice.count("## Acceptance run 2026-11-30") == 1
    assert "**FAIL**" in twice and "**PASS**" not in twice
    assert twice.endswith("## Exact commands\n\nrun it\n")
    assert replace_section("# doc\n", v).startswith("# doc\n\n## Acceptance run 2026-11-30\n")


def _judge_script() -> Any:
    path = ROOT / "scripts" / "gpu_h200" / "acceptance_judge.py"
    spec = importlib.util.spec_from_file_location("acceptance_judge", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_judge_script_prints_writes_docs_and_fixtures(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "accept"
    for rel, text in _files(log_edit=lambda lid, t: t + f"'api_key': ['eng_{'z' * 43}']\n").items():
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        (run / rel).write_text(text)
    doc = tmp_path / "gpu-h200.md"
    doc.write_text("# doc\n\n## Exact commands\n")
    fixtures = tmp_path / "gpu-h200-accept-2026-11-30"
    main = cast(Callable[[list[str]], int], _judge_script().main)
    assert main([str(run), "--write-docs", str(doc), "--fixtures", str(fixtures)]) == 0
    out = capsys.readouterr().out
    assert "## Acceptance run 2026-11-30" in out and out.rstrip().endswith("verdict: PASS")
    assert "## Acceptance run 2026-11-30" in doc.read_text()
    copied = sorted(p.relative_to(fixtures).as_posix() for p in fixtures.rglob("*") if p.is_file())
    assert "gateway.jsonl" in copied and f"runs/{GRAPH_WARM}/engine.log" in copied
    assert "status-up-graph.json" not in copied  # only what the judge read
    assert "z" * 43 not in (fixtures / "runs" / GRAPH_WARM / "engine.log").read_text()
    (run / "gateway.jsonl").write_text(json.dumps({"step": "up-graph", "status": 502}) + "\n")
    assert main([str(run)]) == 1


NO_ACCEPT_RUN = ("no tests/fixtures/engine_logs/gpu-h200-accept-*/ yet "
                 "(scripts/gpu_h200/acceptance_judge.py --fixtures writes one)")


@pytest.mark.parametrize("folder", ACCEPT_DIRS or [
    pytest.param(None, marks=pytest.mark.skip(reason=NO_ACCEPT_RUN))],
    ids=[p.name for p in ACCEPT_DIRS] or ["none"])
def test_committed_acceptance_runs_pass(folder: Path) -> None:
    files = {p.relative_to(folder).as_posix(): p.read_text(errors="replace")
             for p in folder.rglob("*") if p.is_file()}
    v = _judge(files)
    assert v.rows, f"{folder}: no launch records"
    assert v.passed, f"{folder.name}: " + "; ".join(v.failures)
    assert all(isinstance(a, GatewayAnswer) and a.status == 200 for a in v.answers)


SHIM_REDACTED = LOGS / "gpu-h200-accept-2026-12-01d"
# The run after the shim's key list moved to appliance/engine_redact.argv_keys (the Docker wrapper
# shares it): the same facts must hold on the H200.
SHIM_REDACTED_RUNS = [SHIM_REDACTED, LOGS / "gpu-h200-accept-2026-12-02"]


@pytest.mark.parametrize("run", SHIM_REDACTED_RUNS, ids=[p.name for p in SHIM_REDACTED_RUNS])
def test_the_shim_redacts_the_engine_key_as_vllm_logs_it_on_the_h200(run: Path) -> None:
    """The fourth H200 acceptance run: vLLM 0.26.0 prints its non-default args with the key from its
    config file; the process shim wrote `'<redacted>'` into engine.log itself. (The acceptance
    script's own pass over what it brings back writes `eng_<redacted>`, as the third run's logs
    show: there the key had reached the file on disk.) After `down`, no file under the appliance's
    home held a key and no key file was left."""
    logs = sorted((run / "runs").glob("*/engine.log"))
    assert len(logs) == 7
    for log in logs:
        args = [line for line in log.read_text().splitlines() if "non-default args:" in line]
        assert len(args) == 1 and "'api_key': '<redacted>'" in args[0], log
        assert "eng_" not in log.read_text(), log
    earlier = sorted((LOGS / "gpu-h200-accept-2026-12-01c" / "runs").glob("*/engine.log"))
    assert earlier and all("'api_key': ['eng_<redacted>']" in p.read_text() for p in earlier)
    facts = (run / "key-delivery.txt").read_text()
    assert "engine logs with the key in vLLM's non-default args line: 0 of 7" in facts
    assert "after down: files under /root/app holding an engine key: 0" in facts
    assert "after down: key files left: 0" in facts
    assert "VLLM_API_KEY in environ: 0" in facts and "VLLM_API_KEY in environ: 1" not in facts
