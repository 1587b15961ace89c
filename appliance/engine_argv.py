"""The one reader of an engine argv's shape. Pure, no imports of the appliance.

render (appliance/recipe/render.py) writes the engine command as `LAUNCHER FLAG-GROUPS`: the launcher is the
words before the first flag (`vllm serve MODEL`, `python -c CODE serve MODEL`, `python -m MODULE`), each
flag group a flag with its values (`--dtype auto`, `--cudagraph-capture-sizes 1 2 4`, `-cc.k=v`).

The facts render already knows (model, tensor parallel size, listen address) are typed fields of the
LaunchSpec, set from the recipe; the renders read those. This module is what remains: the split into
launcher and flag groups (the Helm and vLLM-config renders pass flags through, the pod rewrites
`--host`), a flag's value (a recipe's own `--api-key`, which is never a typed field), and — for a spec
built without the typed fields (a launch record written before them, a spec built by hand) — the
facts read back from argv, once, by `LaunchSpec`'s validator.
"""

from __future__ import annotations

from collections.abc import Sequence

# A flag starts a group; `-c`/`-m` of the launcher and their code/module are not flags.
_FLAG_PREFIXES = ("--", "-cc.")


def split(argv: Sequence[str]) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]:
    """(launcher, flag groups): the words before the first flag, then each flag with its values."""
    start = next((i for i, a in enumerate(argv) if a.startswith(_FLAG_PREFIXES)), len(argv))
    groups: list[list[str]] = []
    for arg in argv[start:]:
        if arg.startswith(_FLAG_PREFIXES) or not groups:
            groups.append([arg])
        else:
            groups[-1].append(arg)
    return tuple(argv[:start]), tuple(tuple(g) for g in groups)


def join(launcher: Sequence[str], groups: Sequence[Sequence[str]]) -> tuple[str, ...]:
    """The inverse of `split`."""
    return (*launcher, *(word for group in groups for word in group))


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The value of the first `FLAG VALUE` or `FLAG=VALUE`; None if absent."""
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def model_of(argv: Sequence[str]) -> str | None:
    """The model as the engine is told: the word after `serve` in the launcher, else `--model`."""
    launcher, _ = split(argv)
    if "serve" in launcher and launcher.index("serve") + 1 < len(launcher):
        return launcher[launcher.index("serve") + 1]
    return flag_value(argv, "--model")


def facts_of(argv: Sequence[str]) -> dict[str, object]:
    """The typed LaunchSpec facts as argv states them (for a spec built without them)."""
    tp = flag_value(argv, "--tensor-parallel-size")
    return {"model": model_of(argv), "tensor_parallel_size": int(tp) if tp is not None else 1,
            "listen": flag_value(argv, "--host")}
