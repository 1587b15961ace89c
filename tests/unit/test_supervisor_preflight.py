"""Preflight over the shipped recipes and the reference host's fixture trees (no host changes)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from appliance.host_facts import GIB, HostFacts
from controller.supervisor.preflight import Preflight, cache_is_empty, empty_cache_root
from controller.supervisor.signals import PreflightFailed, PreflightOk
from tests.unit.model_helpers import seed_models

REPO = Path(__file__).resolve().parents[2]

HOSTS = REPO / "tests" / "fixtures" / "hosts"


def _preflight(home: Path, host: str = "reference") -> Preflight:
    seed_models(home)
    return Preflight(recipes_dir=REPO / "recipes", appliance_home=home, facts_root=HOSTS / host)


async def test_the_default_recipe_passes_and_renders_under_the_appliance_home(tmp_path: Path) -> None:
    answer = await _preflight(tmp_path)(7, "cpu-smollm2", False)
    assert isinstance(answer, PreflightOk), answer
    assert answer.token == 7 and answer.spec.recipe == "cpu-smollm2"
    assert answer.spec.cache_root.startswith(str(tmp_path / "cache"))
    assert answer.cache_empty is True and answer.warm_restart is False
    assert "cpu-smollm2" in answer.launch_id


async def test_unknown_and_abstract_recipes_are_refused(tmp_path: Path) -> None:
    for name in ("no-such-recipe", "gfx906-base"):
        answer = await _preflight(tmp_path)(1, name, False)
        assert isinstance(answer, PreflightFailed) and answer.failure.code == "unknown_recipe"
        assert not answer.failure.retryable


async def test_admission_refuses_default_graph_tp4_on_the_stock_reference_host(tmp_path: Path) -> None:
    # DOMAIN §2/§3: C′ (default FULL_AND_PIECEWISE, TP=4) needed 16 GiB swap and still reached a
    # 66 MiB MemAvailable; the stock host has 4 GiB swap.
    answer = await _preflight(tmp_path)(1, "gfx906-c-prime-tp4-graph-default", False)
    assert isinstance(answer, PreflightFailed)
    assert answer.failure.code == "admission_refused" and "global OOM" in answer.failure.summary
    assert not answer.failure.retryable
    # The same recipe on the prepared host (16 GiB swap, swappiness 200) passes.
    prepared_host = _preflight(tmp_path, "reference-swap16-swappiness200")
    prepared = await prepared_host(2, "gfx906-c-prime-tp4-graph-default", False)
    assert isinstance(prepared, PreflightOk), prepared


def test_the_plan_report_shows_everything_without_starting(tmp_path: Path) -> None:
    report = _preflight(tmp_path).report("cpu-smollm2")
    assert report.launchable and report.spec is not None and report.refusals == []
    assert report.admission.verdict in ("admit", "warn")


def test_fresh_cache_only_ever_empties_a_root_inside_the_cache_directory(tmp_path: Path) -> None:
    base = tmp_path / "cache"
    root = base / "cpu-smollm2-abc"
    (root / "inductor").mkdir(parents=True)
    (root / "inductor" / "artifact.bin").write_bytes(b"x")
    assert not cache_is_empty(root)
    empty_cache_root(root, [base])
    assert cache_is_empty(root)
    with pytest.raises(PermissionError):
        empty_cache_root(tmp_path / "elsewhere", [base])
    with pytest.raises(PermissionError):
        empty_cache_root(base, [base])  # the base itself is not a recipe's root
    with pytest.raises(PermissionError):
        empty_cache_root(base / ".." / "outside", [base])


async def test_fresh_cache_makes_the_next_start_cold(tmp_path: Path) -> None:
    pre = _preflight(tmp_path)
    first = await pre(1, "cpu-smollm2", False)
    assert isinstance(first, PreflightOk)
    root = Path(first.spec.cache_root)
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "x").write_text("compiled")
    warm = await pre(2, "cpu-smollm2", False)
    assert isinstance(warm, PreflightOk) and warm.cache_empty is False
    cold = await pre(3, "cpu-smollm2", True)
    assert isinstance(cold, PreflightOk) and cold.cache_empty is True
    # Emptied by the driver right before the start, not now (the old engine may still run on it).
    assert cold.empty_cache_first == str(root.resolve()) and root.exists()


async def test_fresh_cache_empties_a_variant_root_under_the_recipes_own_cache_volume(tmp_path: Path) -> None:
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "cpu-smollm2.yaml").write_text((REPO / "recipes" / "cpu-smollm2.yaml").read_text())
    volume = tmp_path / "volume" / "compile-cache"
    (recipes / "vol-smollm2.yaml").write_text(
        f"name: vol-smollm2\nextends: cpu-smollm2\ncache:\n  root: {volume}\n"
    )
    # Lint would refuse a root under /tmp (a moving root); this test is about the deletion guard.
    pre = Preflight(recipes_dir=recipes, appliance_home=tmp_path / "home", facts_root=HOSTS / "reference",
                    checks=())
    first = await pre(1, "vol-smollm2", False)
    assert isinstance(first, PreflightOk)
    root = Path(first.spec.cache_root)
    assert root.parent == volume
    (root / "inductor").mkdir(parents=True)
    (root / "inductor" / "graph").write_text("compiled")
    (volume / "other-recipe-variant").mkdir()
    again = await pre(2, "vol-smollm2", True)
    assert isinstance(again, PreflightOk) and again.cache_empty is True
    assert again.empty_cache_first == str(root.resolve())
    empty_cache_root(Path(again.empty_cache_first), [volume])
    assert not root.exists() and (volume / "other-recipe-variant").is_dir()


def _tiny_host() -> HostFacts:
    """2 GiB RAM, no swap, 64 KiB memlock, a 1 GiB cgroup, no GPU driver, no GPU: refuses recipe B here."""
    return HostFacts(mem_total_bytes=2 * GIB, mem_available_bytes=1 * GIB, swap_total_bytes=0,
                     swap_free_bytes=0, swappiness=0, memlock_soft_bytes=65536, memlock_hard_bytes=65536,
                     cgroup_version=2, cgroup_memory_limit_bytes=1 * GIB, appliance_home="/var/lib/appliance")


@dataclass
class _TinyHostPreflight(Preflight):
    def facts(self) -> HostFacts:
        return _tiny_host()


async def test_a_cluster_recipe_is_not_refused_on_this_hosts_facts(tmp_path: Path) -> None:
    pre = _TinyHostPreflight(recipes_dir=REPO / "recipes", appliance_home=tmp_path)
    local = await pre(1, "gfx906-b-tp4-eager", False)
    assert isinstance(local, PreflightFailed) and local.failure.code == "admission_refused"
    assert "global OOM" in local.failure.summary

    remote = await pre(2, "gfx906-b-tp4-eager-k8s", False)
    assert isinstance(remote, PreflightOk), remote
    report = pre.report("gfx906-b-tp4-eager-k8s")
    assert report.refusals == [] and report.admission.verdict == "admit"
    assert report.admission.checks[-1].message.startswith(
        "runs on a cluster node: this host is not checked; the node needs: ")


async def test_a_cluster_recipes_cache_is_not_judged_or_emptied_on_this_host(tmp_path: Path) -> None:
    # Its caches live on a cluster claim: a local path says nothing about it (no "cold" claim, no
    # warm-up planned), and `fresh_cache` cannot empty it from here — refused with what to do.
    pre = _TinyHostPreflight(recipes_dir=REPO / "recipes", appliance_home=tmp_path)
    ok = await pre(1, "gfx906-b-tp4-eager-k8s", False)
    assert isinstance(ok, PreflightOk)
    assert not ok.cache_empty and ok.empty_cache_first is None and not ok.warm_restart
    assert pre.report("gfx906-b-tp4-eager-k8s").cache_empty is None
    fresh = await pre(2, "gfx906-b-tp4-eager-k8s", True)
    assert isinstance(fresh, PreflightFailed) and fresh.failure.code == "cache_not_emptied"
    assert "cluster volume" in fresh.failure.summary and "claim" in fresh.failure.hint


async def test_a_missing_model_folder_is_refused_before_anything_is_stopped(tmp_path: Path) -> None:
    """Hardening 2 (item 5): a wrong model path passed plan and preflight, the working engine was
    stopped, and the new one failed four times with vLLM's `OSError: Repo id must be in the form …`."""
    bare = Preflight(recipes_dir=REPO / "recipes", appliance_home=tmp_path / "bare",
                     facts_root=HOSTS / "reference")
    answer = await bare(1, "cpu-smollm2", False)
    assert isinstance(answer, PreflightFailed)
    assert answer.failure.code == "model_missing" and not answer.failure.retryable
    assert "is not a folder on this host" in answer.failure.summary
    assert "never downloads" in answer.failure.hint
    assert not bare.report("cpu-smollm2").launchable  # `appliance plan` says so too
    folder = tmp_path / "bare" / "models" / "smollm2-135m-instruct"
    folder.mkdir(parents=True)
    answer = await bare(2, "cpu-smollm2", False)
    assert isinstance(answer, PreflightFailed) and "has no config.json" in answer.failure.summary
    (folder / "config.json").write_text("{}")
    assert isinstance(await bare(3, "cpu-smollm2", False), PreflightOk)
    # A docker recipe is checked at its host_path (the folder mounted into the container).
    docker = await _preflight(tmp_path / "d")(4, "cpu-smollm2-docker", False)
    assert not (isinstance(docker, PreflightFailed) and docker.failure.code == "model_missing"), docker


def test_a_model_path_that_is_no_folder_path_is_refused_in_words(tmp_path: Path) -> None:
    from appliance.recipe.recipe_model import Recipe
    from controller.supervisor.preflight import model_check
    from tests.unit.recipe_helpers import fixed_facts, shipped, with_changes

    recipe: Recipe = with_changes(shipped()["cpu-smollm2"], model__path="Qwen/Qwen2.5-0.5B")
    failure = model_check(recipe, fixed_facts())
    assert failure is not None and "Hugging Face repo id" in failure.summary
