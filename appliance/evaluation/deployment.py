"""Seed 004's deployment check and the versions seed 004 §11 asks for, as one probe script run in the
engine's own interpreter, and the pure judgement of what it printed. Pure: text in, text out.

Seed 004 §7: deployment errors come from combinations of files ("a GDN deployment copied envs.py,
utils.py and cscc_qwen35_gemv.py; the installed platforms/rocm.py was still the old one"), so every
candidate is verified in three steps — `python3 -m py_compile <all patched files>`,
`cmp -s "$SRC/$F" "$SITE/$F"`, `cd /tmp && python3 -c "import vllm; print(vllm.__file__)"` — and the
log's path markers are the fourth (`expect.markers`). Seed 004 §11 item 1: record the device's gfx
(or compute capability), its memory, DTK/CUDA, PyTorch/HIP and vLLM versions.

The controller runs `probe_script(check)` through the runtime's exec seam
(controller/evaluation/deployment.py) after ready, reads the one JSON line it prints
(`parse_probe_output`) and records `evaluate(check, facts)`'s problems with the launch; the gate's
proof step fails on them.
"""

from __future__ import annotations

import json
import os.path
from typing import Any

from pydantic import BaseModel, Field

from appliance.recipe.launch_spec import LaunchSpec
from appliance.recipe.recipe_model import DeploymentCheck

RESULT_PREFIX = "APPLIANCE-DEPLOYMENT "

# Runs in the engine's interpreter, with the engine's environment: stdlib and what that interpreter
# has (torch, vllm) only. torch is imported before vllm (S4: vllm first → std::bad_alloc, SIGABRT 134
# on the gfx906 fork). Every step is caught and reported, so one failure still records the rest.
_SCRIPT = r'''
import filecmp, json, os, py_compile, sys, tempfile
CHECK = json.loads(__CHECK__)
out = {"python": sys.executable, "files": {}, "versions": {}, "devices": []}
os.chdir(tempfile.gettempdir())  # seed 004: `cd /tmp` so the working directory shadows nothing
sys.path[:] = [p for p in sys.path if p not in ("", ".")]
def err(exc):
    return (type(exc).__name__ + ": " + str(exc))[:500]
try:
    import torch
    out["versions"]["torch"] = str(torch.__version__)
    out["versions"]["cuda"] = getattr(torch.version, "cuda", None)
    out["versions"]["hip"] = getattr(torch.version, "hip", None)
    try:
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                out["devices"].append({
                    "index": i, "name": p.name,
                    "capability": "%d.%d" % (p.major, p.minor),
                    "gfx": ((getattr(p, "gcnArchName", "") or "").split(":")[0] or None)
                           if getattr(torch.version, "hip", None) else None,
                    "total_memory_bytes": int(p.total_memory)})
    except Exception as exc:
        out["devices_error"] = err(exc)
except Exception as exc:
    out["torch_error"] = err(exc)
rocm = os.environ.get("ROCM_PATH")
if rocm:
    for name in (".info/version", ".info/version-dev"):
        try:
            with open(os.path.join(rocm, name)) as f:
                out["versions"]["rocm_path_version"] = f.read().strip()[:100]
            break
        except OSError:
            pass
try:
    import vllm
    out["vllm_file"] = vllm.__file__
    out["vllm_dir"] = os.path.dirname(os.path.realpath(vllm.__file__))
    out["versions"]["vllm"] = str(getattr(vllm, "__version__", None))
except BaseException as exc:
    out["vllm_error"] = err(exc)
site = CHECK.get("site_root")
if site is None and out.get("vllm_dir"):
    site = os.path.dirname(out["vllm_dir"])
out["site_root"] = site
src = CHECK.get("source_root")
cdir = tempfile.mkdtemp(prefix="appliance-pyc-")
for n, rel in enumerate(CHECK.get("files") or []):
    r = {}
    s = os.path.join(src, rel)
    if not os.path.isfile(s):
        r["source"] = "missing"
    else:
        r["source"] = "present"
        if rel.endswith(".py"):
            try:  # compiled into a scratch directory: the source tree gets no __pycache__
                py_compile.compile(s, cfile=os.path.join(cdir, "%d.pyc" % n), doraise=True)
                r["compiles"] = True
            except Exception as exc:
                r["compiles"] = False
                r["compile_error"] = err(exc)
    if site is None:
        r["installed"] = "unknown"
    else:
        i = os.path.join(site, rel)
        r["installed_path"] = i
        if not os.path.isfile(i):
            r["installed"] = "missing"
        elif r["source"] == "present":
            r["installed"] = "same" if filecmp.cmp(s, i, shallow=False) else "differs"
        else:
            r["installed"] = "present"
    out["files"][rel] = r
print(__PREFIX__ + json.dumps(out, sort_keys=True), flush=True)
'''


def probe_script(check: DeploymentCheck | None) -> str:
    """The Python source the engine's interpreter runs (`python -c`). Without a declared check it
    still reports the import path and the versions."""
    spec: dict[str, Any] = (
        {"files": [], "source_root": None, "site_root": None}
        if check is None
        else {"files": list(check.files), "source_root": check.source_root, "site_root": check.site_root}
    )
    return (_SCRIPT.replace("__CHECK__", repr(json.dumps(spec)))
            .replace("__PREFIX__", repr(RESULT_PREFIX)).lstrip())


class DeviceFacts(BaseModel):
    index: int
    name: str
    capability: str | None = None  # CUDA compute capability "9.0"; HIP reports its own pair
    gfx: str | None = None  # gcnArchName without its feature suffix, e.g. "gfx906"
    total_memory_bytes: int | None = None


class DeploymentFacts(BaseModel):
    """What the probe printed (or why nothing came back: `error`)."""

    error: str | None = None  # the probe did not run or printed no result
    python: str | None = None
    vllm_file: str | None = None
    vllm_dir: str | None = None
    vllm_error: str | None = None
    torch_error: str | None = None
    devices_error: str | None = None
    site_root: str | None = None
    files: dict[str, dict[str, Any]] = Field(default_factory=dict)
    versions: dict[str, str | None] = Field(default_factory=dict)
    devices: list[DeviceFacts] = Field(default_factory=list)


def parse_probe_output(text: str) -> DeploymentFacts:
    """The probe's result line from its output (the engine's env scripts may print before it)."""
    for line in reversed(text.splitlines()):
        if line.startswith(RESULT_PREFIX):
            try:
                return DeploymentFacts.model_validate(json.loads(line[len(RESULT_PREFIX):]))
            except ValueError as exc:
                return DeploymentFacts(error=f"unreadable probe result: {exc}"[:500])
    tail = text.strip()[-300:]
    return DeploymentFacts(error=f"the probe printed no result{': ' + tail if tail else ''}")


def _same_dir(actual: str, expected: str) -> bool:
    return os.path.normpath(actual) == os.path.normpath(expected)


def evaluate(check: DeploymentCheck | None, facts: DeploymentFacts) -> list[str]:
    """The deployment problems (empty: deployed as declared). Versions are recorded, never judged."""
    if check is None:
        return []
    if facts.error is not None:
        return [f"deployment check did not run: {facts.error}"]
    out: list[str] = []
    if facts.vllm_error is not None or facts.vllm_dir is None:
        out.append(f"vllm does not import in the engine's interpreter: {facts.vllm_error or 'no path'}")
    elif not (_same_dir(facts.vllm_dir, check.import_root)
              or (facts.vllm_file is not None
                  and _same_dir(os.path.dirname(facts.vllm_file), check.import_root))):
        out.append(f"vllm imports from {os.path.dirname(facts.vllm_file or facts.vllm_dir)}, "
                   f"expected {check.import_root}")
    for rel in check.files:
        r = facts.files.get(rel)
        if r is None:
            out.append(f"patched file not checked: {rel}")
            continue
        if r.get("source") != "present":
            out.append(f"patched file missing from the source root {check.source_root}: {rel}")
        if r.get("compiles") is False:
            out.append(f"patched file does not compile: {rel} ({r.get('compile_error')})")
        installed = r.get("installed")
        if installed == "missing":
            out.append(f"patched file not installed: {r.get('installed_path') or rel}")
        elif installed == "differs":
            out.append(f"installed file differs from its source: {r.get('installed_path') or rel}")
        elif installed == "unknown":
            out.append(f"patched file's installed copy unknown (vllm did not import): {rel}")
    return out


def version_summary(facts: DeploymentFacts) -> str:
    """One line for the launch view: vLLM, torch, CUDA/HIP, each device and its memory."""
    v = facts.versions
    parts = [f"{k} {v[k]}" for k in ("vllm", "torch", "cuda", "hip", "rocm_path_version") if v.get(k)]
    for d in facts.devices:
        arch = d.gfx or (f"cc {d.capability}" if d.capability else "?")
        mem = f", {d.total_memory_bytes / 2**30:.0f} GiB" if d.total_memory_bytes is not None else ""
        parts.append(f"GPU{d.index} {d.name} ({arch}{mem})")
    return "; ".join(parts) if parts else "no versions reported"


def probe_argv(spec: LaunchSpec, script: str) -> tuple[str, ...]:
    """The probe's command where the engine runs: the engine's own interpreter (the process
    runtime's `python`, else argv[0] of an engine started as `python …`), behind the same sourcing
    wrapper as the engine (DOMAIN §2: the DTK env scripts first)."""
    python = spec.runtime.engine_python()
    if python is None:
        head = spec.argv[0] if spec.argv else ""
        python = head if os.path.basename(head).startswith("python") else "python3"
    return spec.model_copy(update={"argv": (python, "-c", script)}).command()
