"""The compile-cache record of a launch: what it ran with, what the cache looked like, why it missed.

The pure half (factors, the log's cache lines, the comparison) is
appliance/recipe/compile_factors.py; here is what reads the disk and the store: the model directory
(names, sizes, mtimes — no content), the cache root and the earlier launch's cache directory as
found at launch (before the engine writes anything), and the earlier launch on the same root.
The driver calls `begin` (in a thread) at start and `CompileWatch.observe` on every log poll.

"Bad input" is never silent: a root that is not writable, a root an earlier launch used
and that is now gone, and a root that two variants share (other recipe, other spec hash: each
start evicts the other's artifacts or, worse, loads them) become `warnings` in the record and
`compile-cache-warning` events.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from appliance.host_facts import HostFacts
from appliance.observe.log_phases import CacheOutcome, PhaseTracker
from appliance.recipe.compile_factors import (
    CacheSeen,
    CompileFactors,
    DirState,
    MissExplanation,
    MissReason,
    Variant,
    cache_seen,
    explain_miss,
    factors,
    hash_dir,
    model_digest,
    root_warnings,
)
from appliance.recipe.launch_spec import LaunchSpec, Mount
from appliance.recipe.recipe_model import Recipe
from appliance.recipe.render import RenderError, render
from controller.runtime.base import Provenance
from controller.store import EarlierLaunch, Store
from controller.supervisor.preflight import caches_elsewhere

MODEL_FILES_MAX = 20_000  # a model directory has tens of files; a wrong path must not walk a disk


def to_host(path: str, spec: LaunchSpec) -> str:
    """A path as the engine sees it → the host path, through the runtime's bind mounts (docker)."""
    mounts: Sequence[Mount] = getattr(spec.runtime, "mounts", ())
    for m in sorted(mounts, key=lambda m: len(m.target), reverse=True):
        target = m.target.rstrip("/")
        if path == target or path.startswith(target + "/"):
            return m.source.rstrip("/") + path[len(target):]
    return path


def writable(path: Path) -> bool:
    """access(2): a read-only mount says no even to root (tests replace this: they run as root)."""
    return os.access(path, os.W_OK)


def dir_state(path: Path) -> DirState:
    """Exists, holds a file somewhere, and can be written (a missing directory: its nearest existing
    parent decides whether the engine could create it)."""
    exists = path.is_dir()
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    non_empty = exists and any(p.is_file() for p in path.rglob("*"))
    return DirState(path=str(path), exists=exists, non_empty=non_empty, writable=writable(probe))


def model_files(root: Path) -> list[tuple[str, int, float]] | None:
    """(relative name, size, mtime) of the model directory's files; None when it cannot be read."""
    if not root.is_dir():
        return None
    out: list[tuple[str, int, float]] = []
    try:
        for p in root.rglob("*"):
            if p.is_file():
                st = p.stat()
                out.append((str(p.relative_to(root)), st.st_size, st.st_mtime))
                if len(out) >= MODEL_FILES_MAX:
                    break
    except OSError:
        return None
    return out


def launch_factors(spec: LaunchSpec, secret_env: Mapping[str, str], prov: Provenance) -> CompileFactors:
    """The engine's whole environment (the secret one included: hashed, the VLLM_API_KEY bug was
    exactly there), argv, build and model files."""
    model = spec.model
    files = None if model is None or caches_elsewhere(spec) else model_files(Path(to_host(model, spec)))
    return factors({**spec.env, **secret_env}, spec.argv, prov.packages, prov.image_id,
                   model_digest(files) if files is not None else None)


def _same_variant(spec: LaunchSpec, e: EarlierLaunch) -> bool:
    return e.spec_hash == spec.spec_hash or e.recipe == spec.recipe


def _compiled(e: EarlierLaunch) -> bool:
    """The launch's log named a cache directory or an AOT artifact: it left something to reuse."""
    seen = e.compile_cache.get("seen") or {}
    return bool(seen.get("cache_dir") or seen.get("aot_path"))


def baseline(spec: LaunchSpec, earlier: list[EarlierLaunch]) -> tuple[EarlierLaunch | None, list[str]]:
    """The launch a miss is compared with: the newest one of the same variant on this root that got
    as far as the compile cache, else one recorded before factors were kept (no factors: an honest unknown).
    Also the ids of same-variant launches that never got there (a launch that died loading weights
    left nothing behind: the next start is cold by nature, not by a changed factor)."""
    same = [e for e in earlier if _same_variant(spec, e)]
    legacy = [e for e in same if "factors" not in e.compile_cache]
    compiled = [e for e in same if _compiled(e)]
    chosen = compiled[0] if compiled else (legacy[0] if legacy else None)
    return chosen, [e.id for e in same if e not in compiled and e not in legacy]


def other_variants(recipes: Mapping[str, Recipe], facts: HostFacts, spec: LaunchSpec) -> list[Variant]:
    """The other launchable recipes whose rendered cache root is `spec`'s (a recipe that does not
    render is not a user of any root)."""
    out = []
    for name, recipe in sorted(recipes.items()):
        if recipe.abstract or name == spec.recipe:
            continue
        try:
            other = render(recipe, facts)
        except RenderError:
            continue
        if other.cache_root == spec.cache_root:
            out.append(Variant(recipe=name, spec_hash=other.spec_hash))
    return out


def plan_warnings(spec: LaunchSpec, others: list[Variant], earlier: list[EarlierLaunch]) -> list[str]:
    """`appliance plan` (CLI and API): what is wrong with the cache root before anything starts."""
    root = DirState(path=spec.cache_root) if caches_elsewhere(spec) else dir_state(Path(spec.cache_root))
    users = [*others, *(Variant(recipe=e.recipe, spec_hash=e.spec_hash) for e in earlier)]
    return root_warnings(root, spec.recipe, spec.spec_hash, others=users,
                         used_by=earlier[0].id if earlier else None)


@dataclass
class CompileWatch:
    """One launch's compile-cache record as it fills in (held by its LaunchRun)."""

    launch_id: str
    factors: CompileFactors
    previous: EarlierLaunch | None
    previous_dir: DirState | None
    emptied_on_purpose: bool
    seen: CacheSeen = field(default_factory=CacheSeen)
    miss: MissExplanation | None = None
    warnings: list[str] = field(default_factory=list)
    never_compiled: list[str] = field(default_factory=list)  # same-variant launches with nothing to reuse
    scanned: int = 0  # tracker events already looked at (the log is read on every poll)

    def summary(self) -> dict[str, Any]:
        """For `appliance status`: vLLM's cache dir hash, the AOT path, why a miss, the warnings."""
        return {"cache_hash": self.seen.cache_hash, "aot_path": self.seen.aot_path,
                "miss": self.miss.model_dump(mode="json") if self.miss else None,
                "previous_launch": self.previous.id if self.previous else None, "warnings": self.warnings}

    def explain(self) -> MissExplanation:
        prev = self.previous
        if prev is not None and "factors" not in prev.compile_cache:
            return MissExplanation(reason=MissReason.UNKNOWN, compared_with=prev.id,
                                   details=(f"the earlier launch {prev.id} recorded no compile factors",))
        if prev is None and self.never_compiled and not self.emptied_on_purpose:
            ids = ", ".join(self.never_compiled[:5])
            return MissExplanation(reason=MissReason.COLD_FIRST, details=(
                f"no earlier launch of this variant on this root reached torch.compile ({ids})",))
        before = prev.compile_cache.get("seen", {}).get("cache_hash") if prev else None
        return explain_miss(
            self.factors, CompileFactors.model_validate(prev.compile_cache["factors"]) if prev else None,
            previous_id=prev.id if prev else None, previous_dir=self.previous_dir,
            root_emptied_on_purpose=self.emptied_on_purpose, hashes=(before, self.seen.cache_hash),
        )

    def observe(self, tracker: PhaseTracker) -> dict[str, Any]:
        """What changed in the record since the last poll (empty: nothing to write). A miss is
        explained once, when the log first shows it (a miss is final, log_phases.cache_outcome)."""
        patch: dict[str, Any] = {}
        found = cache_seen(tracker.events[self.scanned:], tracker.cache_evidence)
        self.scanned = len(tracker.events)
        old = self.seen
        first = old if old.cache_dir else found  # the first cache directory named, with its hash
        seen = CacheSeen(cache_dir=first.cache_dir, cache_hash=first.cache_hash,
                         aot_path=old.aot_path or found.aot_path, evidence=found.evidence)
        if seen != self.seen:
            self.seen = seen
            patch["seen"] = seen.model_dump(mode="json")
        if self.miss is None and tracker.cache_outcome is CacheOutcome.MISS:
            self.miss = self.explain()
            patch["miss"] = self.miss.model_dump(mode="json")
        return patch


def begin(
    store: Store, launch_id: str, spec: LaunchSpec, secret_env: Mapping[str, str], prov: Provenance,
    *, emptied_on_purpose: bool,
) -> tuple[CompileWatch, list[str]]:
    """Blocking (reads the disk): the watch, and the warnings to note, written to the record now."""
    remote = caches_elsewhere(spec)
    root = DirState(path=spec.cache_root) if remote else dir_state(Path(spec.cache_root))
    earlier = store.earlier_on_root(launch_id, spec.cache_root)
    previous, never_compiled = baseline(spec, earlier)
    previous_dir: DirState | None = None
    seen_dir = (previous.compile_cache.get("seen") or {}).get("cache_dir") if previous else None
    hashed = hash_dir(seen_dir) if isinstance(seen_dir, str) else None
    if hashed is not None:
        previous_dir = DirState(path=hashed) if remote else dir_state(Path(to_host(hashed, spec)))
    elif previous is not None and root.exists is not None and not root.non_empty:
        previous_dir = root  # the earlier start's directory is unknown; the whole root is gone or empty
    warnings = root_warnings(root, spec.recipe, spec.spec_hash,
                             others=[Variant(recipe=e.recipe, spec_hash=e.spec_hash) for e in earlier],
                             used_by=earlier[0].id if earlier else None,
                             emptied_on_purpose=emptied_on_purpose)
    watch = CompileWatch(launch_id, launch_factors(spec, secret_env, prov), previous, previous_dir,
                         emptied_on_purpose, warnings=warnings, never_compiled=never_compiled)
    store.update_compile_cache(launch_id, {
        "factors": watch.factors.model_dump(mode="json"),
        "cache_root_state": root.model_dump(mode="json"),
        "previous_launch": previous.id if previous else None,
        "previous_cache_dir": previous_dir.model_dump(mode="json") if previous_dir else None,
        "warnings": warnings,
        "emptied_on_purpose": emptied_on_purpose,
    })
    return watch, warnings


def resume(store: Store, launch_id: str, spec: LaunchSpec, record: Mapping[str, Any]) -> CompileWatch | None:
    """The watch of a launch adopted mid-start, rebuilt from what `begin` recorded when the
    controller that launched it started it: the log's cache lines after the adoption fill the same
    record. None when that controller recorded no factors (nothing to compare a miss with)."""
    if "factors" not in record:
        return None
    earlier = store.earlier_on_root(launch_id, spec.cache_root)
    _, never_compiled = baseline(spec, earlier)
    prev_id = record.get("previous_launch")
    previous = next((e for e in earlier if e.id == prev_id), None) if prev_id else None
    prev_dir = record.get("previous_cache_dir")
    seen, miss = record.get("seen"), record.get("miss")
    return CompileWatch(
        launch_id, CompileFactors.model_validate(record["factors"]), previous,
        DirState.model_validate(prev_dir) if prev_dir else None,
        bool(record.get("emptied_on_purpose", False)),
        seen=CacheSeen.model_validate(seen) if seen else CacheSeen(),
        miss=MissExplanation.model_validate(miss) if miss else None,
        warnings=list(record.get("warnings") or []), never_compiled=never_compiled,
    )
