"""Build the small tensor-parallel model: Llama architecture, 8 attention heads, 4 KV heads, random weights.

Runs INSIDE the engine venv (it needs torch and safetensors; numpy comes with torch), started by
`controller.engine_setup` as `<engine python> scripts/make_tp_model.py --tokenizer-from <dir> --out <dir>`,
and on the GPU device by scripts/gpu_h200/tp_acceptance.sh with the device's python.

Why a made-up model: the bundled SmolLM2-135M has 9 attention heads and 3 KV heads, and vLLM refuses
any tensor-parallel size that does not divide both (seen at TP=2 on the H200, docs/gpu-h200.md); nothing
can be downloaded. This one has 8 heads and 4 KV heads (divisible by 2 and 4), head_dim 64 (what
vLLM's CPU and CUDA attention backends both take), SmolLM2's tokenizer (copied from the bundled model),
tied embeddings, and weights drawn from a fixed seed. Its text is noise; its kernels, compile, graph
capture, collectives and memory are real.

Size: hidden 256 with head_dim 64 × 8 heads (q_proj 256→512, o_proj 512→256; vLLM reads head_dim from
the config), 4 layers, vocabulary 49,152 (the tokenizer's) → 17.3 M parameters, 35 MB in bfloat16 — one
device upload part.

Reproducible byte for byte: the weights come from numpy's legacy `RandomState` (its stream is frozen by
numpy's compatibility policy, unlike torch's generators across versions), are rounded to bfloat16 by
torch's round-to-nearest-even cast, and are written by `safetensors.torch.save_file` with fixed metadata;
config.json is written with sorted keys by this script (not `save_pretrained`, which stamps the
transformers version). `--check` compares the sha256 of the generated files with `EXPECTED_SHA256`.

Writes into `<out>.partial` and renames at the end, so a crash never leaves a half folder that looks
finished.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

SEED = 20261201
HIDDEN = 256
HEADS = 8
KV_HEADS = 4
HEAD_DIM = 64
INTERMEDIATE = 1024
LAYERS = 4
VOCAB = 49152  # SmolLM2's tokenizer
INIT_STD = 0.02  # the Llama config's initializer_range

CONFIG: dict[str, object] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
    "head_dim": HEAD_DIM,
    "hidden_act": "silu",
    "hidden_size": HIDDEN,
    "initializer_range": INIT_STD,
    "intermediate_size": INTERMEDIATE,
    "max_position_embeddings": 8192,
    "mlp_bias": False,
    "num_attention_heads": HEADS,
    "num_hidden_layers": LAYERS,
    "num_key_value_heads": KV_HEADS,
    "rms_norm_eps": 1e-05,
    # Both spellings: transformers 5 reads rope_parameters, the 4.x that vLLM 0.26 brings reads rope_theta.
    "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": VOCAB,
}

GENERATION_CONFIG: dict[str, object] = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}

# Copied byte for byte from the bundled SmolLM2 folder (those present).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "special_tokens_map.json", "tokenizer.model")

# The digests this script produces (recorded from a run; checked by --check and by the unit test that
# builds nothing but compares this table with docs). Tokenizer files are copies and not listed.
EXPECTED_SHA256: dict[str, str] = {
    "model.safetensors": "2befcda8138168f665fc399078332fa7514fa5701b096a0feb9ff0fab15df1fa",
    "config.json": "ced6c9fbb25ce83713a26f94f7bb1ed587d880cabe1160540868f5621106dc4f",
    "generation_config.json": "8025b6679dcf077f5d339bd154238d70891decb48f35f294bfaa33a343140439",
}


def tensor_shapes() -> list[tuple[str, tuple[int, ...]]]:
    """Every tensor in file order (the order the random stream is drawn in)."""
    shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (VOCAB, HIDDEN))]
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        shapes += [
            (f"{p}.input_layernorm.weight", (HIDDEN,)),
            (f"{p}.self_attn.q_proj.weight", (HEADS * HEAD_DIM, HIDDEN)),
            (f"{p}.self_attn.k_proj.weight", (KV_HEADS * HEAD_DIM, HIDDEN)),
            (f"{p}.self_attn.v_proj.weight", (KV_HEADS * HEAD_DIM, HIDDEN)),
            (f"{p}.self_attn.o_proj.weight", (HIDDEN, HEADS * HEAD_DIM)),
            (f"{p}.post_attention_layernorm.weight", (HIDDEN,)),
            (f"{p}.mlp.gate_proj.weight", (INTERMEDIATE, HIDDEN)),
            (f"{p}.mlp.up_proj.weight", (INTERMEDIATE, HIDDEN)),
            (f"{p}.mlp.down_proj.weight", (HIDDEN, INTERMEDIATE)),
        ]
    shapes.append(("model.norm.weight", (HIDDEN,)))
    return shapes


def parameter_count() -> int:
    total = 0
    for _, shape in tensor_shapes():
        n = 1
        for d in shape:
            n *= d
        total += n
    return total


def _weights() -> dict[str, object]:
    import numpy as np
    import torch

    rng = np.random.RandomState(SEED)
    out: dict[str, object] = {}
    for name, shape in tensor_shapes():
        if name.endswith("norm.weight"):
            # RMSNorm scales start at one (as Llama initialises them): the activations stay bounded.
            values = np.ones(shape, dtype=np.float32)
        else:
            values = (rng.standard_normal(size=shape) * INIT_STD).astype(np.float32)
        out[name] = torch.from_numpy(values).to(torch.bfloat16).contiguous()
    return out


def _json_bytes(data: dict[str, object]) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def build(tokenizer_from: Path, out: Path) -> dict[str, str]:
    """Write the model folder; return the sha256 of each generated file."""
    from safetensors.torch import save_file

    missing = [f for f in ("tokenizer.json", "tokenizer_config.json") if not (tokenizer_from / f).is_file()]
    if missing:
        raise SystemExit(f"--tokenizer-from {tokenizer_from}: missing {', '.join(missing)} "
                         "(give the bundled SmolLM2 folder)")
    partial = out.with_name(out.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    print(f"[tp-model] drawing {parameter_count() / 1e6:.1f} M parameters from seed {SEED}", flush=True)
    save_file(_weights(), str(partial / "model.safetensors"), metadata={"format": "pt"})  # type: ignore[arg-type]
    (partial / "config.json").write_bytes(_json_bytes(CONFIG))
    (partial / "generation_config.json").write_bytes(_json_bytes(GENERATION_CONFIG))
    for name in TOKENIZER_FILES:
        if (tokenizer_from / name).is_file():
            shutil.copyfile(tokenizer_from / name, partial / name)
    digests = {name: sha256(partial / name) for name in EXPECTED_SHA256}
    source = {
        "made_by": "scripts/make_tp_model.py",
        "seed": SEED,
        "parameters": parameter_count(),
        "dtype": "bfloat16",
        "tokenizer_from": str(tokenizer_from),
        "sha256": digests,
    }
    (partial / "appliance-source.json").write_bytes(_json_bytes(source))
    if out.exists():
        shutil.rmtree(out)
    partial.rename(out)
    size = (out / "model.safetensors").stat().st_size
    print(f"[tp-model] wrote {out} ({size / 1e6:.1f} MB safetensors)", flush=True)
    for name, digest in digests.items():
        print(f"[tp-model] sha256 {name} {digest}", flush=True)
    return digests


def check(digests: dict[str, str]) -> list[str]:
    """Files whose digest differs from EXPECTED_SHA256 (empty: byte-identical)."""
    return [name for name, want in EXPECTED_SHA256.items() if digests.get(name) != want]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tokenizer-from", type=Path, required=True,
                        help="the bundled SmolLM2 folder (its tokenizer files are copied)")
    parser.add_argument("--out", type=Path, required=True, help="the model folder to create")
    parser.add_argument("--check", action="store_true",
                        help="fail unless the generated files match the recorded sha256 digests")
    args = parser.parse_args(argv)
    digests = build(args.tokenizer_from, args.out)
    if args.check:
        bad = check(digests)
        if bad:
            for name in bad:
                print(f"[tp-model] DIGEST MISMATCH {name}: got {digests[name]}, "
                      f"expected {EXPECTED_SHA256[name] or '(none recorded)'}", flush=True)
            return 1
        print("[tp-model] digests match the recorded ones (byte-identical build)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
