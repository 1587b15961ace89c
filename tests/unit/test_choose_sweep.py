"""The sweep stage of a choice (appliance/evaluation/sweep.py and its place in tournament.py): the
grid's rules (each bad input named with its rule), the variants as real recipes with their own
compile-cache key and spec hash by the ordinary rules, the plan's sweep lines before the tournament,
the pick of one variant per recipe, and the runner gating variants under `--allow-diff` for exactly
the swept fields and the tournament with none."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from appliance.evaluation.sweep import (
    MAX_VARIANTS,
    SweepInputError,
    check_sweep,
    parse_sweep,
    points,
    variant_name,
    variant_sources,
)
from appliance.evaluation.tournament import ArmCost, ChoiceRecord, Entry, judged, markdown, plan, skipped
from appliance.recipe.cache_key import cache_key
from appliance.recipe.recipe_loader import read_sources
from controller.catalogue import Catalogue
from controller.evaluation.choice_seam import write_variants
from tests.unit.test_choose_runner import Clock, FakeSeam, rig

REPO = Path(__file__).resolve().parents[2]
COST = ArmCost(cold_ready_s=100, warm_ready_s=20, bench_s=60, from_history=True)  # 260 s an arm


@pytest.mark.parametrize(
    "specs, words",
    [
        (["gpu_memory_utilization=0.8,0.9"], "only max_num_seqs and max_num_batched_tokens may be swept "
                                             "(rule: sweep-field"),
        (["max_num_seqs="], "max_num_seqs: no values (rule: sweep-empty)"),
        (["max_num_seqs=64,64"], "[64] listed twice (rule: sweep-duplicate)"),
        (["max_num_seqs=64", "max_num_seqs=128"],
         "given twice; list all its values once (rule: sweep-duplicate)"),
        (["max_num_seqs=-8,64"], "[-8] out of range; each value is 1..1048576 (rule: sweep-value)"),
        (["max_num_seqs=0"], "[0] out of range"),
        (["max_num_seqs=lots"], "values must be whole numbers, got 'lots' (rule: sweep-value)"),
        (["max_num_seqs"], "say it as FIELD=V1,V2,... (rule: sweep-syntax)"),
        (["max_num_seqs=1,2,3", "max_num_batched_tokens=512,1024,2048"],
         f"sweep grid of 9 variants per recipe (3 × 3): the cap is {MAX_VARIANTS} (rule: sweep-too-large)"),
    ],
)
def test_bad_sweeps_name_the_field_and_the_rule(specs: list[str], words: str) -> None:
    with pytest.raises(SweepInputError) as caught:
        parse_sweep(specs)
    assert words in str(caught.value)


def test_a_grid_is_its_points_in_the_declared_order() -> None:
    grid = parse_sweep(["max_num_batched_tokens=2048,4096", "max_num_seqs=64,128"])
    assert grid == {"max_num_batched_tokens": [2048, 4096], "max_num_seqs": [64, 128]}
    assert points(grid) == [
        {"max_num_seqs": 64, "max_num_batched_tokens": 2048},
        {"max_num_seqs": 64, "max_num_batched_tokens": 4096},
        {"max_num_seqs": 128, "max_num_batched_tokens": 2048},
        {"max_num_seqs": 128, "max_num_batched_tokens": 4096},
    ]
    assert variant_name("cpu-smollm2", {"max_num_seqs": 64, "max_num_batched_tokens": 2048}) == (
        "cpu-smollm2.sweep.mns64.mnbt2048")
    # the API's body goes through the same rules (booleans are not numbers)
    with pytest.raises(SweepInputError, match="sweep-value"):
        check_sweep({"max_num_seqs": [True]})


def test_variants_are_recipes_with_their_own_cache_key_and_identity(tmp_path: Path) -> None:
    """The generated files load with the catalogue (`extends` the swept recipe), differ from it in the
    swept field only, and get their own compile-cache key by cache_key.py's ordinary rule."""
    texts = variant_sources(["cpu-smollm2"], {"max_num_seqs": [4, 8]})["cpu-smollm2"]
    write_variants(tmp_path, texts)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "cpu-smollm2.sweep.mns4.yaml", "cpu-smollm2.sweep.mns8.yaml"]  # no temporary file left
    recipes = Catalogue(REPO / "recipes", tmp_path).load()
    base, four, eight = (recipes[n]
                         for n in ("cpu-smollm2", "cpu-smollm2.sweep.mns4", "cpu-smollm2.sweep.mns8"))
    assert (four.engine.max_num_seqs, eight.engine.max_num_seqs, base.engine.max_num_seqs) == (4, 8, None)
    assert four.engine.model_dump(exclude={"max_num_seqs", "why"}) == base.engine.model_dump(
        exclude={"max_num_seqs", "why"})
    assert four.env == base.env and four.memory == base.memory and four.platform == base.platform
    assert len({cache_key(base), cache_key(four), cache_key(eight)}) == 3
    # read as a plan before writing, they are the same recipes (so the plan's spec hash holds)
    unwritten = Catalogue(REPO / "recipes").load_with(
        {str(tmp_path / f"{n}.yaml"): t for n, t in texts.items()})
    assert unwritten["cpu-smollm2.sweep.mns4"] == four
    assert set(read_sources(tmp_path)) == {str(tmp_path / f"{n}.yaml") for n in texts}


def e(name: str, mode: str, margin: float, admitted: bool = True, sweep_of: str | None = None,
      point: dict[str, int] | None = None) -> Entry:
    return Entry(recipe=name, mode=mode, spec_hash=f"h-{name}", admitted=admitted,
                 admission="admit" if admitted else "refuse", margin_gib=margin,
                 reason=None if admitted else "gpu_memory_short: KV cache does not fit",
                 sweep_of=sweep_of, point=point or {})


ENTRIES = [e("eager", "eager", 9), e("graph", "graph", 4)]
VARIANTS = [
    e("eager.sweep.mns64", "eager", 8, sweep_of="eager", point={"max_num_seqs": 64}),
    e("eager.sweep.mns256", "eager", 6, sweep_of="eager", point={"max_num_seqs": 256}),
    e("graph.sweep.mns64", "graph", 3, sweep_of="graph", point={"max_num_seqs": 64}),
    e("graph.sweep.mns256", "graph", 1, sweep_of="graph", point={"max_num_seqs": 256}),
    e("graph.sweep.mns512", "graph", -2, admitted=False, sweep_of="graph", point={"max_num_seqs": 512}),
]
GRID = {"max_num_seqs": [64, 256, 512]}


def _plan(**kw: object) -> ChoiceRecord:
    args: dict[str, object] = dict(
        choice_id="c1", platform="cuda", entries=ENTRIES, pattern="*", baseline=None,
        costs={x.recipe: COST for x in ENTRIES + VARIANTS if x.admitted}, budget_s=None, started_at=1000.0,
        serving_before="eager", variants=VARIANTS, sweep=GRID)
    args.update(kw)
    return plan(**args)  # type: ignore[arg-type]


def test_the_plan_puts_each_recipes_sweep_before_the_tournament() -> None:
    record = _plan()
    assert [(x.stage, x.recipe, x.status, x.eta_s) for x in record.lines] == [
        ("sweep", "eager.sweep.mns64", "baseline", None),
        ("sweep", "eager.sweep.mns256", "planned", 260.0),
        ("sweep", "graph.sweep.mns64", "baseline", None),
        ("sweep", "graph.sweep.mns256", "planned", 260.0),
        ("sweep", "graph.sweep.mns512", "refused", None),  # admitted before it is tried: refused here
        ("tournament", "eager", "baseline", None),
        ("tournament", "graph", "planned", 260.0),
    ]
    assert record.line("graph.sweep.mns512").why == "gpu_memory_short: KV cache does not fit"
    assert record.sweep_champions == {"eager": "eager.sweep.mns64", "graph": "graph.sweep.mns64"}
    assert record.sweep == GRID and record.eta_s == 3 * 260.0 and record.picked == {}


def test_variants_past_the_budget_by_the_eta_are_planned_and_the_cli_plan_says_the_budget_may_stop_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from controller.cli.choose_cmd import print_plan

    record = _plan(budget_s=400.0)  # 260 s a gate: only the first fits by the ETAs
    assert [(x.stage, x.recipe, x.status) for x in record.lines if x.status == "planned"] == [
        ("sweep", "eager.sweep.mns256", "planned"), ("sweep", "graph.sweep.mns256", "planned"),
        ("tournament", "graph", "planned")]
    assert record.line("eager.sweep.mns256", "sweep").why == "variant 2 of eager's sweep"
    assert record.line("graph.sweep.mns256", "sweep").why == (
        "variant 2 of graph's sweep; by the ETA it may not fit: expected 260 s, 140 s of 400 s "
        "left at its turn")
    assert record.line("graph", "tournament").why == (
        "candidate 1 by the rule; by the ETA it may not fit: expected 260 s, 0 s of 400 s left at its turn")
    assert record.eta_s == 3 * 260.0
    print_plan(record.model_dump(mode="json"))
    expected = [x for x in capsys.readouterr().out.splitlines() if x.startswith("expected duration:")]
    assert expected == [
        "expected duration: 13.0 min of a 6.7 min budget (a forecast over the budget: the budget is checked "
        "at each candidate's turn against the time spent, so it may stop the choice before the last "
        "candidates); serving now: eager (returned to at the end)"]
    print_plan(_plan(budget_s=780.0).model_dump(mode="json"))  # the forecast fits: no such words
    assert "a forecast over the budget" not in capsys.readouterr().out


def test_a_sweep_win_moves_only_its_recipes_pick_and_the_tournament_line_names_the_pick() -> None:
    record = judged(_plan(), "eager.sweep.mns256", "accept", "cmp-1", ["faster"], 250.0, "sweep")
    x = record.line("eager.sweep.mns256", "sweep")
    assert (x.status, x.against, x.comparison_id) == ("won", "eager.sweep.mns64", "cmp-1")
    assert x.why == "beat eager.sweep.mns64 (accept) with --allow-diff max_num_seqs"
    # nothing of the eager sweep is left: its pick is the baseline of the tournament
    assert record.picked == {"eager": "eager.sweep.mns256"}
    assert (record.baseline, record.champion, record.champion_verdict) == (
        "eager.sweep.mns256", "eager.sweep.mns256", None)
    t = record.line("eager.sweep.mns256", "tournament")
    assert (t.status, t.sweep_of, t.point, t.spec_hash) == (
        "baseline", "eager", {"max_num_seqs": 256}, "h-eager.sweep.mns256")
    # a failed start in a sweep is skipped like any; the first variant stands and is picked
    record = skipped(record, "graph.sweep.mns256", "failed-start", "failed to start: cuda_oom", 10.0, "sweep")
    assert record.picked["graph"] == "graph.sweep.mns64"
    assert record.line("graph.sweep.mns64", "tournament").status == "planned"
    text = markdown(record)
    assert "## Sweep stage" in text and "## Tournament" in text
    assert "- sweep stage: max_num_seqs=64,256,512 (gated under --allow-diff max_num_seqs); picked: " in text


def test_a_recipe_with_one_admitted_variant_is_picked_at_once_and_none_keeps_it_as_written() -> None:
    only = [v for v in VARIANTS if v.recipe != "eager.sweep.mns256"]
    record = _plan(variants=only, costs={x.recipe: COST for x in ENTRIES + only if x.admitted})
    assert record.picked == {"eager": "eager.sweep.mns64"} and record.baseline == "eager.sweep.mns64"
    none = [v for v in VARIANTS if v.sweep_of == "graph"]
    record = _plan(variants=none)
    assert record.baseline == "eager" and "as written: no variant of its sweep is admitted" in record.line(
        "eager").why


async def test_the_runner_gates_variants_under_allow_diff_then_the_picks_without(tmp_path: Path) -> None:
    clock = Clock()
    seam = FakeSeam(clock, {"eager.sweep.mns256": "accept", "graph.sweep.mns256": "hold",
                            "graph.sweep.mns64": "accept"})
    chooser, store, _ = rig(tmp_path, seam, clock)
    record = chooser.begin(list(ENTRIES), platform="cuda", pattern="*", baseline=None,
                           costs={x.recipe: COST for x in ENTRIES + VARIANTS if x.admitted}, budget_s=None,
                           serving_before="eager", variants=list(VARIANTS), sweep=GRID)
    record = await chooser.run(record)
    assert seam.gates == [
        ("eager.sweep.mns64", "eager.sweep.mns256"),   # the sweep of eager
        ("graph.sweep.mns64", "graph.sweep.mns256"),   # the sweep of graph: 256 does not beat 64
        ("eager.sweep.mns256", "graph.sweep.mns64"),   # the tournament between the picks
    ]
    assert seam.allowed == [frozenset({"max_num_seqs"}), frozenset({"max_num_seqs"}), frozenset()]
    assert record.picked == {"eager": "eager.sweep.mns256", "graph": "graph.sweep.mns64"}
    assert (record.state, record.champion) == ("done", "graph.sweep.mns64")
    assert record.line("graph.sweep.mns64", "tournament").status == "won"
    assert record.line("graph.sweep.mns64", "sweep").status == "baseline"
    assert seam.switches == ["eager"] and store.get(record.id) == record


def test_the_cli_refuses_a_bad_sweep_with_exit_2_before_asking_the_controller() -> None:
    from controller.cli import main

    if not main.app.registered_commands:
        main._register()
    out = CliRunner().invoke(main.app, ["choose", "--sweep", "temperature=0,1", "--api", "http://127.0.0.1:9"])
    assert out.exit_code == 2
    assert "only max_num_seqs and max_num_batched_tokens may be swept (rule: sweep-field" in out.output


def test_a_generated_variant_that_no_longer_loads_never_breaks_the_catalogue(tmp_path: Path) -> None:
    (tmp_path / "gone.sweep.mns4.yaml").write_text("name: gone.sweep.mns4\nextends: gone\n")
    write_variants(tmp_path, variant_sources(["cpu-smollm2"], {"max_num_seqs": [4]})["cpu-smollm2"])
    recipes = Catalogue(REPO / "recipes", tmp_path).load()
    assert "cpu-smollm2.sweep.mns4" in recipes and "gone.sweep.mns4" not in recipes
    assert "cpu-smollm2" in recipes


def test_the_cli_plan_names_the_sweep_stage_and_marks_guessed_etas(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from controller.cli.choose_cmd import print_plan

    record = _plan(costs={x.recipe: COST.model_copy(update={"from_history": x.recipe != "graph"})
                          for x in ENTRIES + VARIANTS if x.admitted})
    print_plan(record.model_dump(mode="json"))
    out = capsys.readouterr().out
    assert "sweep stage first: max_num_seqs=64,256,512" in out and "(--allow-diff max_num_seqs)" in out
    assert "  sweep planned    eager.sweep.mns256" in out
    graph = next(line for line in out.splitlines() if line.startswith("  planned    graph "))
    assert "ETA 4.3 min*" in graph  # the recipe without history: the defaults' guess, marked
    assert "its ETA is the defaults' guess" in out


def test_the_time_left_while_following_never_passes_the_budget() -> None:
    """A fresh host's ETA (2,100 s an arm) over a 40-minute budget: what the CLI says is left is the
    budget's rest, since the budget stops the choice there; within the budget, the ETA's rest."""
    from controller.cli.choose_cmd import time_left

    assert time_left(4200.0, 2400.0, 200.0) == 2200.0  # the budget's rest, not the ETA's 4,000 s
    assert time_left(1000.0, 2400.0, 200.0) == 800.0  # the ETA's rest
    assert time_left(1000.0, None, 200.0) == 800.0
    assert time_left(1000.0, 2400.0, 2500.0) == 0.0  # never negative
