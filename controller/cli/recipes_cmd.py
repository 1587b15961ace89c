"""`appliance recipes …` and `appliance plan`: read, check and render recipes before anything runs.

Every command takes `--json`. Exit codes: 0 fine (warnings allowed), 1 the recipe or host has an
error (lint error, admission refused), 2 bad input (a recipe that does not load, an unknown name or
format, a host root that is not a host). Bad input is one paragraph naming file, field and rule —
never a traceback.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from appliance.engine_secret import redact_recipe_data
from appliance.host_facts import GIB, MIB, UNLIMITED, HostFacts
from appliance.observe.gpu_health import CardHealth, card_line
from appliance.recipe.admission import Admission, admit
from appliance.recipe.cache_key import cache_key
from appliance.recipe.formats import FORMATS, FormatError, format_spec
from appliance.recipe.lint import Finding, has_errors, lint
from appliance.recipe.recipe_loader import RecipeError
from appliance.recipe.recipe_model import Recipe
from appliance.recipe.render import RenderError, render
from appliance.runtimes import registry as runtime_registry
from appliance.runtimes.base import Placement
from appliance.runtimes.k8s.kubernetes import render_with_image
from controller.api_client import ApiError, Client, api_url
from controller.catalogue import Catalogue
from controller.cli.options import JsonOpt
from controller.runtime.registry import available_runtimes
from controller.settings import paths, recipes_dir
from controller.store import read_earlier_on_root
from controller.supervisor import compile_cache
from controller.supervisor.gpu_memory_check import GpuMemoryLink
from controller.supervisor.preflight import runtime_need
from controller.watch.gpu import GpuReader
from controller.watch.gpu_health import HealthReader
from host_setup.facts import HostFactsError, gather_facts

recipes_app = typer.Typer(
    name="recipes", help="List, show, render, lint and diff recipes.", no_args_is_help=True
)

HostRootOpt = Annotated[Path, typer.Option("--host-root", help="Read host facts under this root "
                                           "(a copied or fixture tree) instead of /.")]
EXIT_FINDINGS = 1
EXIT_BAD_INPUT = 2


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `appliance` app."""
    app.add_typer(recipes_app)
    app.command("plan")(plan_cmd)


@contextmanager
def _bad_input() -> Iterator[None]:
    """Turn input errors into one paragraph on stderr and exit 2."""
    try:
        yield
    except (RecipeError, RenderError, FormatError, HostFactsError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None


def _recipes() -> dict[str, Recipe]:
    return Catalogue(recipes_dir(), paths().generated_recipes).load()


def _get(name: str) -> Recipe:
    return Catalogue(recipes_dir(), paths().generated_recipes).named(name)


def _facts(host_root: Path) -> HostFacts:
    return gather_facts(host_root, appliance_home=paths().home)


def _print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


@recipes_app.command("list")
def list_cmd(host_root: HostRootOpt = Path("/"), as_json: JsonOpt = False) -> None:
    """Every recipe with its platform, runtime, TP and mode (abstract bases marked), the one the
    controller runs now, and this host's verdict on each (lint and admission, as `plan` decides)."""
    with _bad_input():
        recipes = _recipes()
        facts = _facts(host_root)
    running = _running_recipe()
    verdicts = _verdicts(recipes, facts, host_root)
    rows = [{"name": r.name, "platform": r.platform.value, "runtime": r.runtime.kind, "tp": r.workers,
             "mode": r.engine.mode.value, "abstract": r.abstract, "extends": r.extends,
             "description": r.description, "running": r.name == running,
             "verdict": verdicts.get(r.name)} for r in recipes.values()]
    if as_json:
        _print_json(rows)
        return
    typer.echo(f"  {'RECIPE':<34} {'PLATFORM':<8} {'RUNTIME':<10} {'TP':<3} {'MODE':<6} THIS HOST")
    for row in rows:
        mark = "*" if row["running"] else " "
        verdict = "abstract" if row["abstract"] else (row["verdict"] or "?")
        typer.echo(f"{mark} {row['name']:<34} {row['platform']:<8} {row['runtime']:<10} {row['tp']!s:<3} "
                   f"{row['mode']:<6} {verdict}")
    typer.echo("* running now" if running else "(no recipe running, or no controller answering)")


def _running_recipe() -> str | None:
    """The recipe the controller serves now; None when none runs or no controller answers (a listing
    works without one)."""
    try:
        s = Client(api_url(), timeout_s=2.0).get("/status")
    except ApiError:
        return None
    recipe = s.get("recipe") if isinstance(s, dict) and s.get("launch") else None
    return str(recipe) if recipe else None


def _verdicts(recipes: dict[str, Recipe], facts: HostFacts, host_root: Path) -> dict[str, str]:
    """admit / warn / refuse per launchable recipe on this host; a lint error is a refusal (it
    refuses the launch). The running engine's own memory is the controller's to count (as in `plan`)."""
    cards = HealthReader(host_root).sample()
    gpu_memory = GpuMemoryLink(GpuReader(host_root)).view()
    offered = _offered_runtimes()
    out = {}
    for name, recipe in recipes.items():
        if recipe.abstract:
            continue
        if recipe.runtime.kind not in offered:
            # The controller refuses it before anything is stopped (preflight.runtime_check): a
            # Kubernetes recipe on a host with no cluster is not `admit`.
            out[name] = runtime_need(recipe)
            continue
        try:
            out[name] = "refuse" if has_errors(lint(recipe)) else str(
                admit(recipe, facts, cards, gpu_memory=gpu_memory).verdict)
        except (RecipeError, RenderError):  # one broken recipe does not hide the others' verdicts
            out[name] = "error"
    return out


def _offered_runtimes() -> frozenset[str]:
    """The runtime kinds this host can start, probed as the controller does at start (the registry
    only lists engines and asks the daemon or cluster to answer; nothing is started)."""
    runtimes, _missing = available_runtimes(paths().runs)
    return frozenset(runtimes)


@recipes_app.command("show")
def show_cmd(
    name: str,
    all_fields: Annotated[bool, typer.Option(
        "--all", help="Every field, unset (null) and empty ones included.", metavar="")] = False,
    as_json: JsonOpt = False,
) -> None:
    """The merged recipe (after `extends`), where its launch binds, and its compile-cache key.

    Fields left unset or empty are omitted unless --all. `engine.host` is what the rendered launch
    binds (`--host`): the runtime decides it (the process runtime always binds 127.0.0.1, whatever
    the recipe says); `launch` says where the controller and gateway reach the engine."""
    with _bad_input():
        recipe = _get(name)
    data = redact_recipe_data(recipe.model_dump(mode="json"))
    runtime = runtime_registry.for_recipe(recipe)
    listen, reach = runtime.listen(recipe), runtime.reach(recipe)
    data["engine"]["host"] = listen
    port = recipe.engine.port
    data["launch"] = {"binds": f"{listen}:{port}", "reached_at": f"{reach}:{port}"}
    if recipe.engine.host != listen:
        data["launch"]["recipe_engine_host"] = (f"{recipe.engine.host} (not used: the {recipe.runtime.kind} "
                                                f"runtime binds {listen})")
    data["cache_key"] = cache_key(recipe)
    if not all_fields:
        data = _without_unset(data)
    if as_json:
        _print_json(data)
    else:
        typer.echo(yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=110), nl=False)


def _without_unset(value: Any) -> Any:
    """`value` without the None, empty-string, empty-list and empty-mapping entries of its mappings
    (recursively): a recipe sets a handful of ~100 fields, `recipes show` shows those."""
    if isinstance(value, dict):
        pruned = {k: _without_unset(v) for k, v in value.items()}
        return {k: v for k, v in pruned.items() if v is not None and v != "" and v != [] and v != {}}
    if isinstance(value, list):
        return [_without_unset(v) for v in value]
    return value


@recipes_app.command("render")
def render_cmd(
    name: str,
    fmt: Annotated[str, typer.Option(
        "--format", "-f", help=f"One of: {', '.join(FORMATS)} (default: the runtime's own).")] = "",
    host_root: HostRootOpt = Path("/"),
    image: Annotated[str | None, typer.Option(
        "--image", help="The container image for --format k8s/helm-values of a process recipe "
        "(it names none of its own).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """The exact launch: a docker command, docker SDK kwargs, compose, shell, vLLM config, JSON, or
    what another runtime plug-in adds (k8s manifests, helm-values)."""
    with _bad_input():
        recipe = _get(name)
        spec = render(recipe, _facts(host_root))
        shown = "json" if as_json else fmt or runtime_registry.for_recipe(recipe).default_format
        text = format_spec(spec, shown, recipe) if image is None else \
            render_with_image(shown, spec, recipe, image)
        typer.echo(text, nl=False)


@recipes_app.command("lint")
def lint_cmd(
    names: Annotated[list[str] | None, typer.Argument(help="Recipes (default: all launchable).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Check recipes against the domain's known failure modes; exit 1 when any has an error."""
    with _bad_input():
        recipes = _recipes()
        chosen = [_get(n) for n in names] if names else [r for r in recipes.values() if not r.abstract]
    results = {r.name: lint(r) for r in chosen}
    if as_json:
        _print_json({n: [f.model_dump() for f in fs] for n, fs in results.items()})
    else:
        for n, findings in results.items():
            errors = sum(f.severity == "error" for f in findings)
            typer.echo(f"{n}: {errors} error(s), {len(findings) - errors} other finding(s)")
            for f in findings:
                typer.echo(_finding_line(f))
    if any(has_errors(fs) for fs in results.values()):
        raise typer.Exit(EXIT_FINDINGS)


def _finding_line(f: Finding) -> str:
    return f"  {f.severity:<7} {f.rule} [{f.field}]: {f.message}\n          fact: {f.fact}"


@recipes_app.command("diff")
def diff_cmd(a: str, b: str, as_json: JsonOpt = False) -> None:
    """Field-by-field difference of two merged recipes, and whether they share a compile cache."""
    with _bad_input():
        d = Catalogue(recipes_dir()).diff(a, b)
    changes = [{"field": k, a: va, b: vb} for k, va, vb in d.changes]
    same_cache = d.same_compile_inputs
    if as_json:
        _print_json({"changes": changes, "same_compile_inputs": same_cache})
        return
    for change in changes:
        typer.echo(f"{change['field']}:\n  - {a}: {change[a]!r}\n  + {b}: {change[b]!r}")
    typer.echo(f"compile inputs: {'identical' if same_cache else 'different'} "
               f"(cache keys {d.keys[0]} / {d.keys[1]})")


def plan_cmd(
    name: str,
    host_root: HostRootOpt = Path("/"),
    fmt: Annotated[str, typer.Option("--format", "-f", help=f"Launch shown as: {', '.join(FORMATS)}.")] = "",
    as_json: JsonOpt = False,
) -> None:
    """Facts, lint, admission and the rendered launch for one recipe; exit 1 on an error or a refusal."""
    with _bad_input():
        recipe = _get(name)
        facts = _facts(host_root)
        spec = render(recipe, facts)
        shown_fmt = fmt or runtime_registry.for_recipe(recipe).default_format
        launch_text = format_spec(spec, shown_fmt, recipe)
    findings = lint(recipe)
    # The cards' health as this host reads it now (NVML where the root is `/`, amdgpu sysfs under the
    # root); fatal kernel events are the running controller's to know (its apply preflight checks them).
    reader = HealthReader(host_root)
    cards = reader.sample()
    # The cards' memory now; the running engine's share is the controller's to know (its apply
    # preflight counts it), so here a card that fits only without it is a warning.
    admission = admit(recipe, facts, cards, gpu_memory=GpuMemoryLink(GpuReader(host_root)).view())
    failed = has_errors(findings) or admission.verdict == "refuse"
    # A cache root that is not writable, gone since a launch used it, or shared with
    # another variant is named here, before anything starts (warnings: they do not fail the plan).
    others = compile_cache.other_variants(_recipes(), facts, spec)
    warnings = compile_cache.plan_warnings(spec, others, read_earlier_on_root(paths().db, spec.cache_root))
    # The recipe serving now: the controller knows what its engine holds (this host's plan only).
    running = _running_plan(recipe.name) if host_root == Path("/") else None
    if as_json:
        _print_json({
            "recipe": recipe.name, "host_root": str(host_root), "facts": facts.model_dump(mode="json"),
            "lint": [f.model_dump() for f in findings], "admission": admission.model_dump(mode="json"),
            "launch": spec.model_dump(mode="json"), "cache_root": spec.cache_root, "cache_warnings": warnings,
            "gpu_health": [c.model_dump(mode="json") for c in cards], "gpu_health_blind": reader.blind_note,
            "running": running, "ok": not failed,
        })
    else:
        typer.echo(_plan_text(recipe, host_root, facts, findings, admission, shown_fmt, launch_text,
                              cards, reader.blind_note, running))
        typer.echo(f"\ncompile cache root: {spec.cache_root}")
        for warning in warnings:
            typer.echo(f"  WARNING {warning}")
    if failed:
        raise typer.Exit(EXIT_FINDINGS)


def _running_plan(name: str) -> dict[str, Any] | None:
    """What a restart of `name` would start from, when the controller serves it now (GET /recipes/NAME's
    `running`: MemAvailable plus what its engine holds); None when it does not, or no controller answers."""
    try:
        shown = Client(api_url(), timeout_s=5.0).get(f"/recipes/{name}")
    except ApiError:
        return None
    running = shown.get("running") if isinstance(shown, dict) else None
    return running if isinstance(running, dict) else None


def _plan_text(recipe: Recipe, root: Path, facts: HostFacts, findings: list[Finding], admission: Admission,
               fmt: str, launch: str, cards: list[CardHealth] | None = None, blind: str | None = None,
               running: dict[str, Any] | None = None) -> str:
    memlock = "unknown" if facts.memlock_soft_bytes is None else (
        "unlimited" if facts.memlock_soft_bytes == UNLIMITED else f"{facts.memlock_soft_bytes / MIB:.0f} MiB")
    gpus = ", ".join(sorted({f"{g.vendor}/{g.driver or 'no driver'}" for g in facts.gpus})) or "none"
    # A runtime on another node: this host's facts are shown (render expands paths with them) but are
    # not the engine's; admission says what the node needs instead.
    remote = runtime_registry.for_recipe(recipe).traits.placement is Placement.REMOTE
    where = ", not where the engine runs" if remote else ""
    lines = [
        f"recipe {recipe.name}: {recipe.description}",
        "",
        f"host ({root}{where}): MemTotal {facts.mem_total_gib:.2f} GiB, "
        f"MemAvailable {facts.mem_available_gib:.2f} GiB, "
        f"swap {facts.swap_total_gib:.2f} GiB, swappiness {facts.swappiness}, memlock {memlock}, "
        f"GPUs {len(facts.gpus)} ({gpus}), cgroup v{facts.cgroup_version}, kernel {facts.kernel_release}",
        *(f"  {card_line(c)}" for c in cards or ()),
        *([f"  GPU health: {blind}"] if blind else []),
        "",
        f"lint: {sum(f.severity == 'error' for f in findings)} error(s), {len(findings)} finding(s)",
        *(_finding_line(f) for f in findings),
        "",
        f"admission: {admission.verdict.upper()}",
    ]
    if running is not None:
        # The checks below predict a start on this host as if nothing ran; the engine of this recipe
        # holds memory now, so MemAvailable is already lower than they assume.
        lines.insert(-1, f"running now: {running['text']}")
        lines.insert(-1, "  (the memory checks below predict a start on an empty host)")
    for c in admission.checks:
        lines.append(f"  {c.verdict:<6} {c.name}: {c.message}")
        if c.verdict != "admit":
            lines.append(f"         fact: {c.fact}")
    lines += ["", f"launch ({fmt}):", launch.rstrip("\n")]
    if facts.mem_total_bytes < 1 * GIB:
        lines.append("note: MemTotal under 1 GiB — is --host-root a real host tree?")
    return "\n".join(lines)
