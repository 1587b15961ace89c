"""A model folder where a recipe expects it, for tests whose preflight checks it (the model check:
the folder exists on this host and holds a readable config.json)."""

from __future__ import annotations

from pathlib import Path

DEFAULT_MODEL = "smollm2-135m-instruct"  # the embedded default's folder under $APPLIANCE_HOME/models


# Every folder a shipped recipe names under $APPLIANCE_HOME/models (recipes/*.yaml).
SHIPPED_MODELS = (DEFAULT_MODEL, "tp-llama-8h4kv", "model", "qwen3.8-27b-w8a8", "qwen3.8-27b-fp8")


def seed_models(home: Path) -> None:
    for name in SHIPPED_MODELS:
        seed_model(home, name)


def seed_model(home: Path, name: str = DEFAULT_MODEL) -> Path:
    folder = home / "models" / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}\n')
    return folder
