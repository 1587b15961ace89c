"""Preflight: load → lint → host facts → admission → render, before anything is stopped or started.

ARCHITECTURE "Apply a recipe": the current engine keeps serving while the new recipe is checked;
only a recipe that passes replaces it. The answer is an observation for the state machine
(PreflightOk with the rendered LaunchSpec, or PreflightFailed with a Failure an operator can act
on). File reads and the host-facts scan run in a worker thread.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from appliance.diagnosis.signatures import DiagnosisCode
from appliance.host_facts import HostFacts
from appliance.observe.gpu_events import GpuEvent
from appliance.observe.gpu_health import CardHealth
from appliance.recipe.admission import Admission, admit, gpu_health_checks, gpu_kv_checks
from appliance.recipe.gpu_kv_admission import GpuMemoryView
from appliance.recipe.launch_spec import LaunchSpec
from appliance.recipe.lint import Finding, lint
from appliance.recipe.recipe_loader import RecipeError
from appliance.recipe.recipe_model import Recipe
from appliance.recipe.render import RenderError, render
from appliance.runtimes.base import Placement
from appliance.runtimes.registry import for_recipe, for_spec
from controller.catalogue import Catalogue
from controller.catalogue import UnknownRecipe as UnknownRecipe  # re-exported: callers catch it from here
from controller.supervisor.signals import Failure, PreflightFailed, PreflightOk
from host_setup.facts import HostFactsError, gather_facts

# A check returns None (pass) or the failure that refuses the launch (lint errors, admission).
Check = Callable[[Recipe, HostFacts], Failure | None]


class GpuHealthSource(Protocol):
    """The GPU health watch as preflight reads it (controller/supervisor/gpu_health_watch.py)."""

    @property
    def cards(self) -> Sequence[CardHealth]: ...

    @property
    def blind_note(self) -> str | None: ...  # what the watch cannot see, and why

    @property
    def recent_events(self) -> Sequence[GpuEvent]: ...  # the latest kernel GPU events, oldest first

    def fatal_events(self, card: int) -> list[GpuEvent]: ...


class GpuMemorySource(Protocol):
    """The cards' memory now (controller/supervisor/gpu_memory_check.py). `replaces_running`: the
    start stops the running engine first, so what it holds counts as free."""

    def view(self, replaces_running: bool = True) -> GpuMemoryView: ...



def lint_check(recipe: Recipe, facts: HostFacts) -> Failure | None:
    """Lint errors refuse the launch (each rule is a measured incident, appliance/recipe/lint.py)."""
    errors = [f for f in lint(recipe) if f.severity == "error"]
    if not errors:
        return None
    return Failure(
        "recipe_lint_errors",
        "; ".join(f"{f.field}: {f.message}" for f in errors[:3]) + (" …" if len(errors) > 3 else ""),
        f"fix the recipe (`appliance recipes lint {recipe.name}`); {errors[0].fact}",
        retryable=False,
    )


def admission_check(recipe: Recipe, facts: HostFacts) -> Failure | None:
    """Host admission (DOMAIN §3): a predicted OOM or a missing hard requirement refuses the launch."""
    result = admit(recipe, facts)
    refused = [c for c in result.checks if c.verdict == "refuse"]
    if not refused:
        return None
    return Failure(
        "admission_refused",
        "; ".join(c.message for c in refused),
        f"`appliance plan {recipe.name}` shows the numbers; {refused[0].fact}",
        retryable=False,
    )


def model_check(recipe: Recipe, facts: HostFacts) -> Failure | None:
    """The model folder exists where this host can see it, holds `config.json` and is readable, before
    anything is stopped (a wrong model path passed plan, lint and preflight, the
    working engine was stopped, and the new one failed four times with `OSError: Repo id must be in
    the form …` — vLLM takes a path that is not a folder for a Hugging Face repo id, and the
    appliance never downloads). Only where the folder is on this host: the process runtime's
    `model.path`, or a container's `model.host_path`; a cluster's claim is the cluster's business."""
    if recipe.model.host_path is not None:
        where, field_name = facts.expand(recipe.model.host_path), "model.host_path"
    elif for_recipe(recipe).traits.placement is Placement.LOCAL_PROCESS:
        where, field_name = facts.expand(recipe.model.path), "model.path"
    else:
        return None
    path = Path(where)
    hint = (f"put the model folder (a Hugging Face folder with config.json and the weights) at {where}, "
            f"or point {field_name} at it; the appliance never downloads a model")
    problem: str | None = None
    if not path.is_absolute():
        problem = (f"{field_name} {where!r} is not an absolute folder path: vLLM would take it for a "
                   "Hugging Face repo id and fail offline")
    elif not path.is_dir():
        problem = f"{field_name} {where} is not a folder on this host"
    elif not (path / "config.json").is_file():
        problem = f"{field_name} {where} has no config.json: not a Hugging Face model folder"
    elif not os.access(path / "config.json", os.R_OK):
        problem = f"{field_name} {where}/config.json is not readable by the engine's user"
    if problem is None:
        return None
    return Failure("model_missing", problem, hint, retryable=False)


# Admission first: a predicted OOM is the weightier refusal when both apply.
DEFAULT_CHECKS: tuple[Check, ...] = (lint_check, admission_check, model_check)


def new_launch_id(recipe: str, now: float) -> str:
    """Sortable, readable and unique: `20261129T101500-cpu-smollm2-3fa2c1`."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now))
    return f"{stamp}-{recipe}-{secrets.token_hex(3)}"


def cache_is_empty(root: Path) -> bool:
    """No file anywhere under the cache root (a fresh root, or one that was emptied)."""
    if not root.is_dir():
        return True
    return not any(p.is_file() for p in root.rglob("*"))


def removable_cache_root(root: Path, allowed_under: Sequence[Path]) -> Path:
    """The resolved root, if it may be emptied (apply with fresh_cache): only a directory strictly
    inside a known cache directory — a recipe typo must never become `rm -rf` of something else."""
    resolved = root.resolve()
    bases = [b.resolve() for b in allowed_under]
    if not any(resolved.is_relative_to(base) and resolved != base for base in bases):
        raise PermissionError(
            f"refusing to empty {root}: it is not inside {', '.join(str(b) for b in allowed_under)}"
        )
    return resolved


def empty_cache_root(root: Path, allowed_under: Sequence[Path]) -> None:
    resolved = removable_cache_root(root, allowed_under)
    if resolved.exists():
        shutil.rmtree(resolved)


@dataclass(frozen=True)
class PlanReport:
    recipe: Recipe
    facts: HostFacts
    findings: list[Finding]
    admission: Admission
    spec: LaunchSpec | None
    render_error: str | None
    refusals: list[Failure]
    cache_empty: bool | None

    @property
    def launchable(self) -> bool:
        return self.spec is not None and not self.refusals


def caches_elsewhere(spec: LaunchSpec) -> bool:
    """The launch's compile caches are not on this host (a runtime placed on a cluster node keeps
    them on its volume): their state cannot be read, nor emptied, from here."""
    plug = for_spec(spec)
    return plug.traits.placement is Placement.REMOTE and not plug.host_cache_dirs(spec)


def _local_cache_empty(spec: LaunchSpec) -> bool | None:
    """Whether the launch's compile-cache root is empty on this host; None: not on this host."""
    return None if caches_elsewhere(spec) else cache_is_empty(Path(spec.cache_root))



def runtime_need(recipe: Recipe) -> str:
    """What a recipe lacks when its runtime is not offered here, in the words the controller's
    refusal and `appliance recipes list` share: a remote runtime (Kubernetes) needs a cluster."""
    if for_recipe(recipe).traits.placement is Placement.REMOTE:
        return "needs a cluster"
    return f"needs the {recipe.runtime.kind} runtime"


@dataclass
class Preflight:
    recipes_dir: Path
    appliance_home: Path
    checks: Sequence[Check] = DEFAULT_CHECKS
    facts_root: Path = Path("/")
    # Where `fresh_cache` may delete: the appliance's cache dir, plus roots recipes declare.
    cache_bases: Sequence[Path] = field(default_factory=tuple)
    clock: Callable[[], float] = time.time
    # Card health and fatal kernel events (None: not watched, e.g. `appliance plan` without a controller).
    gpu: GpuHealthSource | None = None
    # Where the apply's GPU warnings are said (the driver's event log); None: only in the plan report.
    note: Callable[[str, str, str | None], None] | None = None
    # The cards' memory, for a GPU recipe's KV request (None: not checked, e.g. a CPU-only test).
    gpu_memory: GpuMemorySource | None = None
    # The runtime kinds this controller can start (None: not known here, e.g. `appliance plan` without a
    # controller), and why each other kind is not offered (service.build: the runtime registry's gaps).
    runtime_kinds: frozenset[str] | None = None
    runtime_gaps: Mapping[str, str] = field(default_factory=dict)
    # The recipes the appliance writes itself (a choice's sweep variants; controller/catalogue.py).
    generated_dir: Path | None = None

    def runtime_check(self, recipe: Recipe) -> Failure | None:
        """A recipe whose runtime this controller does not offer is refused before anything is stopped: a
        Kubernetes recipe on a host with no cluster read `admit` with a live Apply button, and the apply
        failed only at the start, after the serving engine was drained."""
        kind = recipe.runtime.kind
        if self.runtime_kinds is None or kind in self.runtime_kinds:
            return None
        why = self.runtime_gaps.get(kind) or f"no {kind} runtime in this controller"
        if for_recipe(recipe).traits.placement is Placement.REMOTE:
            return Failure("runtime_unavailable", f"{runtime_need(recipe)}: {why}",
                           "give the controller a cluster (a kubeconfig, or run it in the cluster), or "
                           "apply a recipe that runs on this host", retryable=False)
        return Failure("runtime_unavailable", f"{runtime_need(recipe)}: {why}",
                       f"make the {kind} runtime available to the controller, or apply a recipe for another "
                       "runtime", retryable=False)

    def _gpu_args(self) -> tuple[Sequence[CardHealth], dict[int, Sequence[GpuEvent]]]:
        if self.gpu is None:
            return (), {}
        cards = list(self.gpu.cards)
        return cards, {c.index: self.gpu.fatal_events(c.index) for c in cards}

    def gpu_check(self, recipe: Recipe, *, say: bool = True) -> Failure | None:
        """The recipe's cards: a fatal state refuses the launch, the rest is said as a warning
        (`say`: in the event log, once per apply — not for every plan the console shows)."""
        cards, fatal = self._gpu_args()
        checks = gpu_health_checks(recipe, cards, fatal)
        refused = [c for c in checks if c.verdict == "refuse"]
        if say and self.note is not None:
            for c in checks:
                if c.verdict == "warn":
                    self.note("gpu-health", f"{recipe.name}: {c.message}", None)
        if not refused:
            return None
        return Failure("gpu_unhealthy", "; ".join(c.message for c in refused),
                       "reset the card (nvidia-smi -r -i N, or reboot) and say so (`appliance gpu reset-done "
                       "N`), drain the node if it recurs, check cooling; `appliance gpu status` shows the "
                       "cards", retryable=False)

    def gpu_memory_check(self, recipe: Recipe, *, say: bool = True,
                         replaces_running: bool = True) -> Failure | None:
        """`gpu_memory_utilization` × each of the recipe's cards against what is free there (vLLM
        refuses the start otherwise, the same on every retry): a clear shortfall refuses before the
        running engine is stopped; what cannot be told is a warning. A restart/apply stops the running
        engine first (`replaces_running`), so its own share of the card counts as free."""
        if self.gpu_memory is None:
            return None
        checks = gpu_kv_checks(recipe, self.gpu_memory.view(replaces_running))
        if say and self.note is not None:
            for c in checks:
                if c.verdict == "warn":
                    self.note("gpu-memory", f"{recipe.name}: {c.message}", None)
        refused = [c for c in checks if c.verdict == "refuse"]
        if not refused:
            return None
        # The code of vLLM's own refusal (diagnosis): the same failure, caught before the start.
        return Failure(DiagnosisCode.GPU_MEMORY_SHORT.value, "; ".join(c.message for c in refused),
                       f"`appliance plan {recipe.name}` shows each card's numbers; lower "
                       "engine.gpu_memory_utilization or stop what else holds the card (nvidia-smi lists "
                       "its processes)", retryable=False)

    def recipe(self, name: str) -> Recipe:
        """The launchable recipe called `name` (raises UnknownRecipe or RecipeError)."""
        return self.catalogue.launchable(name)

    @property
    def catalogue(self) -> Catalogue:
        """The recipe directory this preflight launches from."""
        return Catalogue(self.recipes_dir, self.generated_dir)

    def generated_path(self, name: str) -> Path:
        """Where a generated recipe called `name` is written (RuntimeError: this preflight has none)."""
        if self.generated_dir is None:
            raise RuntimeError("this controller has no directory for generated recipes")
        return self.generated_dir / f"{name}.yaml"

    def facts(self) -> HostFacts:
        return gather_facts(self.facts_root, appliance_home=self.appliance_home)

    def plan(self, name: str) -> tuple[Recipe, HostFacts, LaunchSpec]:
        """Blocking: the recipe, the host facts, and its rendering (raises on any refusal)."""
        recipe = self.recipe(name)
        facts = self.facts()
        return recipe, facts, render(recipe, facts)

    def report(self, name: str) -> PlanReport:
        """Blocking: everything `POST /recipes/{name}/plan` shows, nothing started or stopped."""
        return self.report_of(self.recipe(name))

    def report_of(self, recipe: Recipe) -> PlanReport:
        """Blocking: `report` of a recipe already loaded (a sweep variant before it is written)."""
        facts = self.facts()
        findings = lint(recipe)
        memory = self.gpu_memory.view() if self.gpu_memory is not None else None
        admission = admit(recipe, facts, *self._gpu_args(), gpu_memory=memory)
        spec: LaunchSpec | None = None
        render_error: str | None = None
        try:
            spec = render(recipe, facts)
        except RenderError as exc:
            render_error = str(exc)
        refusals = [c for c in (check(recipe, facts) for check in self.checks) if c is not None]
        runtime_failure = self.runtime_check(recipe)
        refusals = ([runtime_failure] if runtime_failure is not None else []) + refusals
        gpu_failure = self.gpu_check(recipe, say=False) if self.gpu is not None else None
        refusals += [gpu_failure] if gpu_failure is not None else []
        memory_failure = self.gpu_memory_check(recipe, say=False)
        refusals += [memory_failure] if memory_failure is not None else []
        return PlanReport(
            recipe=recipe, facts=facts, findings=findings, admission=admission, spec=spec,
            render_error=render_error, refusals=refusals,
            cache_empty=_local_cache_empty(spec) if spec else None,
        )

    async def __call__(self, token: int, name: str, fresh_cache: bool) -> PreflightOk | PreflightFailed:
        return await asyncio.to_thread(self._run, token, name, fresh_cache)

    def _run(self, token: int, name: str, fresh_cache: bool) -> PreflightOk | PreflightFailed:
        def failed(code: str, summary: str, hint: str = "", retryable: bool = False) -> PreflightFailed:
            return PreflightFailed(token, Failure(code, summary, hint, retryable))

        try:
            recipe = self.recipe(name)
        except UnknownRecipe:
            return failed("unknown_recipe", f"no launchable recipe named {name!r} in {self.recipes_dir}")
        except RecipeError as exc:
            return failed("recipe_invalid", str(exc), "fix the recipe file; `appliance recipes lint`")
        if (runtime_refusal := self.runtime_check(recipe)) is not None:
            return PreflightFailed(token, runtime_refusal)
        try:
            facts = self.facts()
        except (HostFactsError, OSError) as exc:
            return failed("host_facts_unreadable", str(exc), retryable=True)
        for check in self.checks:
            refusal = check(recipe, facts)
            if refusal is not None:
                return PreflightFailed(token, refusal)
        if self.gpu is not None and (gpu_refusal := self.gpu_check(recipe)) is not None:
            return PreflightFailed(token, gpu_refusal)
        if (memory_refusal := self.gpu_memory_check(recipe)) is not None:
            return PreflightFailed(token, memory_refusal)
        try:
            spec = render(recipe, facts)
        except RenderError as exc:
            return failed("render_failed", str(exc), f"fix field '{exc.field}' of the recipe")
        root = Path(spec.cache_root)
        empty_first: str | None = None
        if caches_elsewhere(spec):
            # The compile caches live on a cluster volume (a claim), not under this host's root:
            # emptying a local directory would start nothing cold, and an empty local path says
            # nothing about the claim. The state is unknown here, so no cold warm-up is planned.
            if fresh_cache:
                return failed("cache_not_emptied",
                              f"the compile cache of {recipe.name!r} lives on its cluster volume, not on "
                              "this host: `fresh_cache` cannot empty it from here",
                              "delete the recipe's cache claim in the cluster to start cold "
                              "(`appliance recipes render NAME --format k8s` names it)")
            return PreflightOk(token=token, launch_id=new_launch_id(recipe.name, self.clock()), spec=spec,
                               warm_restart=False, cache_empty=False, empty_cache_first=None)
        if fresh_cache:
            # The variant root lives under the recipe's own cache.root (render: <root>/<name>-<key>);
            # only that one directory is removed, never the base itself — by the driver, just before
            # the start, once no engine runs on it any more.
            bases = dict.fromkeys([*self.cache_bases, self.appliance_home / "cache",
                                   Path(facts.expand(recipe.cache.root))])
            try:
                empty_first = str(removable_cache_root(root, list(bases)))
            except (PermissionError, OSError) as exc:
                return failed("cache_not_emptied", str(exc))
        return PreflightOk(
            token=token,
            launch_id=new_launch_id(recipe.name, self.clock()),
            spec=spec,
            warm_restart=recipe.expect.warm_restart,
            cache_empty=fresh_cache or cache_is_empty(root),
            empty_cache_first=empty_first,
        )
