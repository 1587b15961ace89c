"""Kernel-path and deployment proof, gathered at ready and kept with the launch (DOMAIN §7).

When a launch becomes ready the supervisor calls the hook made by `ready_hook`: it reads the
engine's whole log and the files the recipe declares (`expect.markers`, `expect.checksums`; on the
host for the process runtime, inside the container for docker), digests the compile-cache artifacts
under the launch's cache root, counts loads/compiles per rank, notes the engine's reported versions
and the host's swap total and swappiness, and records all of it as one `kernel-proof` event on the
launch. A missing marker or a digest mismatch is also a `kernel-proof-warning` event (the warning at
ready); a bench reads the proof back from the launch record, and the gate rejects on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Callable, Coroutine, Iterable
from pathlib import Path
from typing import Any

from appliance.engine_secret import redact as redact_keys
from appliance.evaluation.bench_result import ProofResult
from appliance.observe.launch_proof import DEFAULT_FORBIDDEN_MARKERS, LaunchProof, digest_algorithm, evaluate
from appliance.recipe.launch_spec import LaunchSpec
from appliance.recipe.recipe_loader import RecipeError
from appliance.recipe.recipe_model import DeploymentCheck
from appliance.runtimes.base import Placement
from appliance.runtimes.registry import for_spec
from controller.evaluation.deployment import DEPLOYMENT_EVENT, deployment_record
from controller.evaluation.deployment import summary as deployment_summary
from controller.runtime.base import EngineExec, EngineFiles, EngineHandle, EngineRuntimeError, Runtime
from controller.supervisor.preflight import UnknownRecipe, caches_elsewhere

log = logging.getLogger("appliance.evaluation.proof")

PROOF_EVENT = "kernel-proof"
WARNING_EVENT = "kernel-proof-warning"
MAX_LOG_BYTES = 256 * 1024 * 1024
MAX_DIGEST_FILE = 64 * 1024 * 1024  # compile-cache files larger than this are listed by size only
MAX_LISTED_ARTIFACTS = 50


def proof_from_events(events: Iterable[dict[str, Any]]) -> ProofResult:
    """The latest `kernel-proof` event of a launch record; empty when the recipe declares nothing."""
    latest: dict[str, Any] | None = None
    deployment: dict[str, Any] | None = None
    for event in events:
        if event.get("kind") == PROOF_EVENT:
            latest = event.get("data") or {}
        elif event.get("kind") == DEPLOYMENT_EVENT:
            deployment = event.get("data") or {}
    if latest is None:
        return ProofResult()
    return ProofResult(
        markers=dict(latest.get("markers") or {}),
        checksums=dict(latest.get("checksums") or {}),
        forbidden=dict(latest.get("forbidden") or {}),
        engine_limits={str(k): int(v) for k, v in (latest.get("engine_limits") or {}).items()},
        deployment_declared=bool(latest.get("deployment_declared")),
        deployment=deployment,
    )


def _sha256_file(path: Path, algorithm: str = "sha256") -> str:
    h = hashlib.new(algorithm)
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_whole_log(runtime: Runtime, handle: EngineHandle) -> str:
    parts: list[str] = []
    offset, size = 0, 0
    while size < MAX_LOG_BYTES:
        text, offset_next = runtime.read_logs(handle, offset)
        if not text or offset_next == offset:
            break
        parts.append(redact_keys(text))  # vLLM 0.26.0 logs the engine key (appliance/engine_secret.py)
        size += len(text)
        offset = offset_next
    return "".join(parts)


def engine_file_digests(
    runtime: Runtime,
    handle: EngineHandle,
    paths: Iterable[str],
    *,
    engine_on_this_host: bool = True,
    algorithms: dict[str, str] | None = None,
) -> dict[str, str | None]:
    """The digest of each file as the engine sees it (sha256, or the algorithm `algorithms` names for
    the path: md5 where the recipe declared an md5); None when it cannot be read (a mismatch).

    A runtime whose engine sees another filesystem (a container) reads the file there
    (`EngineFiles`). One whose engine runs on another machine and cannot read its files
    (`engine_on_this_host` False, e.g. a cluster node) gets None: the file of the same name on
    this host proves nothing about the engine's, and a digest of it would be a false proof.
    """
    out: dict[str, str | None] = {}
    files = runtime if isinstance(runtime, EngineFiles) else None
    for path in paths:
        if files is None and not engine_on_this_host:
            log.info("cannot digest %s: the engine runs elsewhere; its runtime reads no files", path)
            out[path] = None
            continue
        try:
            algorithm = (algorithms or {}).get(path, "sha256")
            if files is None:
                out[path] = _sha256_file(Path(path), algorithm)
                continue
            out[path] = hashlib.new(algorithm, files.engine_file(handle, path)).hexdigest()
        except Exception as exc:  # noqa: BLE001 — any failure to read is recorded as "unreadable"
            log.info("cannot digest %s: %s", path, exc)
            out[path] = None
    return out


def compile_cache_digest(root: str) -> dict[str, object]:
    """The compile-cache artifacts under the launch's cache root: count, bytes, one aggregate sha256
    over (path, size, sha256) and the first files (DOMAIN §4/S14e: "same artifact md5")."""
    base = Path(root)
    if not base.is_dir():
        return {"root": root, "files": 0}
    files = sorted(p for p in base.rglob("*") if p.is_file() and not p.is_symlink())
    agg = hashlib.sha256()
    listed: dict[str, str] = {}
    total = 0
    for p in files:
        rel = str(p.relative_to(base))
        try:
            size = p.stat().st_size
            digest = _sha256_file(p) if size <= MAX_DIGEST_FILE else f"size:{size}"
        except OSError:
            continue  # removed while walking (the engine still writes its caches)
        total += size
        agg.update(f"{rel}\0{size}\0{digest}\n".encode())
        if len(listed) < MAX_LISTED_ARTIFACTS:
            listed[rel] = digest
    return {"root": root, "files": len(files), "bytes": total, "sha256": agg.hexdigest(), "first": listed}


def host_swap(proc: Path = Path("/proc")) -> dict[str, int | None]:
    """Swap total (bytes) and vm.swappiness, as the seed records them for every run (DOMAIN §3)."""
    swap: int | None = None
    swappiness: int | None = None
    try:
        for line in (proc / "meminfo").read_text().splitlines():
            if line.startswith("SwapTotal:"):
                swap = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    with contextlib.suppress(OSError, ValueError):
        swappiness = int((proc / "sys" / "vm" / "swappiness").read_text().strip())
    return {"swap_total_bytes": swap, "swappiness": swappiness}


def collect(
    runtime: Runtime,
    handle: EngineHandle,
    spec: LaunchSpec,
    markers: tuple[str, ...],
    checksums: dict[str, str],
    forbidden: tuple[str, ...] = (),
) -> LaunchProof:
    """Blocking (file reads, hashing): run it in a thread.

    For a runtime placed on another machine (`traits.placement` REMOTE) this host's swap and its
    directory of the cache root's name say nothing about the engine's: both are recorded as not
    read from here (None), never as this host's figures.
    """
    text = read_whole_log(runtime, handle)
    here = for_spec(spec).traits.placement is not Placement.REMOTE
    algorithms = {p: digest_algorithm(d) for p, d in checksums.items()}
    digests = engine_file_digests(runtime, handle, checksums, engine_on_this_host=here, algorithms=algorithms)
    proof = evaluate(text, markers, checksums, digests, (*DEFAULT_FORBIDDEN_MARKERS, *forbidden))
    cache: dict[str, object] = (
        {"root": spec.cache_root, "files": None, "on_this_host": False}
        if caches_elsewhere(spec)
        else compile_cache_digest(spec.cache_root)
    )
    host: dict[str, int | None] = (
        host_swap() if here else {"swap_total_bytes": None, "swappiness": None}
    )
    return proof.model_copy(update={"compile_cache": cache, "host": host})


def _cache_summary(cache: dict[str, object]) -> str:
    if cache.get("on_this_host") is False:
        return f"compile cache {cache.get('root')} is on the runtime's volume (not read from here)"
    return f"compile cache {cache.get('files')} file(s)"


Note = Callable[[str, str, str | None, dict[str, Any] | None], None]
# (markers, checksums) or (markers, checksums, forbidden markers) of a recipe.
Declared = tuple[tuple[str, ...], dict[str, str]] | tuple[tuple[str, ...], dict[str, str], tuple[str, ...]]
ReadyHook = Callable[[str, LaunchSpec, EngineHandle], Coroutine[Any, Any, None]]


def ready_hook(
    runtimes: dict[str, Runtime],
    expectations: Callable[[str], Declared],
    note: Note,
    deployment: Callable[[str], DeploymentCheck | None] | None = None,
) -> ReadyHook:
    """The supervisor's on-ready hook. `expectations(recipe)` → (markers, checksums[, forbidden
    markers]) of the recipe; the default must-not-appear markers are always checked.
    `deployment(recipe)` → its `expect.deployment` (home substituted): after the kernel-path proof,
    the deployment probe runs in the engine's interpreter and lands as a `deployment-proof` event."""

    async def on_ready(launch_id: str, spec: LaunchSpec, handle: EngineHandle) -> None:
        runtime = runtimes.get(handle.runtime)
        if runtime is None:
            return
        check: DeploymentCheck | None = None
        if deployment is not None:
            try:
                check = await asyncio.to_thread(deployment, spec.recipe)
            except (RecipeError, UnknownRecipe, KeyError, OSError, ValueError):
                check = None
        await kernel_proof(launch_id, spec, handle, runtime, check is not None)
        if deployment is None or (check is None and not isinstance(runtime, EngineExec)):
            return  # nothing declared and nothing this runtime can read: no record to make
        record = await asyncio.to_thread(deployment_record, runtime, spec, handle, check)
        note(DEPLOYMENT_EVENT, deployment_summary(record), launch_id, record)
        if record["problems"]:
            note(WARNING_EVENT, "; ".join(record["problems"]), launch_id, {"problems": record["problems"]})

    async def kernel_proof(
        launch_id: str, spec: LaunchSpec, handle: EngineHandle, runtime: Runtime, deployment_declared: bool
    ) -> None:
        forbidden: tuple[str, ...] = ()
        try:
            declared = await asyncio.to_thread(expectations, spec.recipe)
            markers, checksums = declared[0], declared[1]
            if len(declared) == 3:
                forbidden = declared[2]
        except (RecipeError, UnknownRecipe, KeyError, OSError, ValueError):
            markers, checksums = (), {}  # a recipe gone from the directory: record what can be seen
        try:
            proof = await asyncio.to_thread(collect, runtime, handle, spec, markers, checksums, forbidden)
        except (EngineRuntimeError, OSError) as exc:
            note(WARNING_EVENT, f"kernel-path proof could not be gathered: {exc}", launch_id, None)
            return
        problems = proof.problems
        summary = (
            f"{len(markers)} marker(s), {len(checksums)} checksum(s) declared; "
            f"{'; '.join(problems) if problems else 'all proven'}; "
            f"{_cache_summary(proof.compile_cache)}; "
            f"loads/compiles per rank { ({k: (v.loads, v.compiles) for k, v in proof.ranks.items()}) }"
        )
        # Whether a deployment-proof event is to follow: a bench that reads the record before it
        # lands fails the proof instead of passing without it (ProofResult.problems).
        note(PROOF_EVENT, summary, launch_id, {**proof.model_dump(mode="json"),
                                               "deployment_declared": deployment_declared})
        if problems:
            note(WARNING_EVENT, "; ".join(problems), launch_id, {"problems": problems})

    return on_ready


def recipe_expectations(
    recipe_of: Callable[[str], Any],
) -> Callable[[str], Declared]:
    """(markers, checksums, forbidden markers) of a recipe, from a `Preflight.recipe`-like lookup."""

    def lookup(name: str) -> Declared:
        expect = recipe_of(name).expect
        return tuple(expect.markers), dict(expect.checksums), tuple(expect.forbidden_markers)

    return lookup


def recipe_deployment(recipe_of: Callable[[str], Any], home: str) -> Callable[[str], DeploymentCheck | None]:
    """A recipe's `expect.deployment` with ${APPLIANCE_HOME} substituted (None: none declared)."""

    def lookup(name: str) -> DeploymentCheck | None:
        check: DeploymentCheck | None = recipe_of(name).expect.deployment
        return check.expanded(home) if check is not None else None

    return lookup
