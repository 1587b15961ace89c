"""Run by the CPU engine's own interpreter (its vLLM): what each launch would feed vLLM's compile key.

stdin: a JSON list of {"env": {...}, "argv": [...], "key": str|null}. For each: `env_hash`, vLLM's
own `hash_factors(compile_factors())` computed with os.environ set to exactly that environment, the
names vLLM hashed, and `engine_args`: the EngineArgs vLLM's own parser makes of the argv (what
`VllmConfig.compute_hash()` is built from), or `parse_error`. A `--config` file path in argv is
replaced by a temporary file holding that launch's key (the runtime's key file, which vLLM reads at
parse time). stdout: a JSON list. Standard library + vLLM only: it runs outside the appliance's venv.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile


def engine_argv(argv: list[str]) -> list[str]:
    if "-m" in argv:
        return argv[argv.index("-m") + 2:]
    if "serve" in argv:
        return argv[argv.index("serve"):]
    return argv[1:]


def main() -> int:
    items = json.load(sys.stdin)
    # The engine's venv, not the appliance's: mypy has no vLLM to read.
    import vllm.envs as envs  # type: ignore[import-not-found,unused-ignore]
    from vllm.config.utils import hash_factors  # type: ignore[import-not-found,unused-ignore]
    from vllm.engine.arg_utils import EngineArgs  # type: ignore[import-not-found,unused-ignore]
    try:  # vLLM 0.32 moved the server's parser (0.26: vllm.entrypoints.openai.cli_args)
        from vllm.entrypoints.launchers.cli_args import make_arg_parser  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        from vllm.entrypoints.openai.cli_args import make_arg_parser  # type: ignore[import-not-found,unused-ignore]
    from vllm.utils.argparse_utils import FlexibleArgumentParser  # type: ignore[import-not-found,unused-ignore]

    out = []
    saved = dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        for n, item in enumerate(items):
            os.environ.clear()
            os.environ.update(item["env"])
            try:
                factors = envs.compile_factors()
                env_hash = hash_factors(factors)
            finally:
                os.environ.clear()
                os.environ.update(saved)
            args = engine_argv(list(item["argv"]))
            if "--config" in args and item.get("key"):
                path = os.path.join(tmp, f"key-{n}.yaml")
                with open(path, "w") as f:
                    f.write(f"api-key: {item['key']}\n")
                args[args.index("--config") + 1] = path
            result = {"env_hash": env_hash, "hashed": sorted(factors)}
            try:
                ns = make_arg_parser(FlexibleArgumentParser()).parse_args(args)
                engine = EngineArgs.from_cli_args(ns)
                fields = dataclasses.fields(engine)
                result["engine_args"] = {f.name: repr(getattr(engine, f.name)) for f in fields}
                result["api_key_given"] = bool(getattr(ns, "api_key", None))
            except BaseException as exc:  # noqa: BLE001 — argparse exits (SystemExit) on an unknown flag
                result["parse_error"] = f"{type(exc).__name__}: {exc}"
            out.append(result)
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
