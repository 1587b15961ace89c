"""How the per-launch engine key reaches vLLM: a small vLLM config file, never a `VLLM_*` variable. Pure.

Measured on an H200 with vLLM 0.26.0 (docs/measured.md): vLLM names its torch.compile cache directory after a
hash of `envs.compile_factors()` — every known `VLLM_*` variable except an ignore list — and 0.26.0's
list does not hold `VLLM_API_KEY`. A fresh key per launch in `VLLM_API_KEY` therefore gave every
launch its own compile cache: four warm restarts of the graph recipe, four cache directories, four
full recompiles. (vLLM 0.32, the CPU engine, ignores `VLLM_API_KEY`; the gfx906 build's 0.18/0.2x
base may hash it or hash a fixed list: the appliance must not depend on which.)

So the key goes where no vLLM version hashes it: a YAML file of one line (`api-key: …`), mode 0600,
given to vLLM with `--config PATH`. vLLM's argument parser (`FlexibleArgumentParser.
_pull_args_from_config`) reads the file and inserts `--api-key KEY` into the parsed arguments only:
the key is never in `/proc/PID/cmdline`, never in the environment, and `--api-key` is a front-end
argument that no `compute_hash()` of vLLM's configs covers. The path in argv is the same for every
launch of a variant (`stable_config_path`), so argv itself carries nothing per launch either
(tests/unit/test_compile_key_guard.py holds every shipped recipe to that, under every vLLM version's
rule in appliance/observe/vllm_compile_rules.py).

One cost, read in vLLM 0.26.0's `api_server.setup_server`: it logs `non-default args: {…}` with
`api_key` in clear (0.32 redacts it: `redact_sensitive_args`). `redact` removes engine keys from any
engine log text the appliance shows or stores; the raw log lives beside the key file, readable by
the engine's user only.

vLLM takes one `--config` (`assert args.count("--config") <= 1`): a recipe that brings its own is
refused by the runtimes with the reason (`config_flag_in`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import yaml

CONFIG_FLAG = "--config"
CONFIG_KEY = "api-key"
# vLLM accepts only .yaml/.yml config files (load_config_file checks the extension).
KEY_FILE_NAME = "engine-key.yaml"
# Where a container engine finds it: docker puts the file into the created container before it
# starts; kubernetes mounts the launch's Secret there. The same path for every launch.
CONTAINER_KEY_DIR = "/run/appliance-engine"
CONTAINER_KEY_PATH = f"{CONTAINER_KEY_DIR}/{KEY_FILE_NAME}"

# controller/supervisor/engine_key.py makes keys as "eng_" + secrets.token_urlsafe(32): 43 characters.
_ENGINE_KEY = re.compile(r"eng_[A-Za-z0-9_-]{43}")
# vLLM 0.26.0's "non-default args: {…, 'api_key': ['KEY'], …}" (a key of any shape, e.g. a recipe's own).
_ARGS_API_KEY = re.compile(r"""(['"]api_key['"]\s*:\s*)(\[[^\]]*\]|'[^']*'|"[^"]*")""")
REDACTED = "<redacted>"
# A secret-looking word as a whole `_`-separated component (HF_TOKEN, OPENAI_API_KEY, APIKEY...):
# a bare substring match redacted TOKENIZERS_PARALLELISM and hid a DOMAIN §2 must-export value.
_SECRET_NAME = re.compile(
    r"(?:^|_)(?:TOKEN|TOKENS|KEY|KEYS|APIKEY|SECRET|SECRETS|PASSWORD|PASSWD|CREDENTIALS?)(?:_|$)",
    re.IGNORECASE,
)


def config_yaml(key: str) -> str:
    """The config file's text. safe_dump quotes whatever the key holds (a recipe's own key may be
    any string), so vLLM's yaml.safe_load reads back exactly `key`."""
    if not key:
        raise ValueError("an empty engine key cannot guard the engine")
    return yaml.safe_dump({CONFIG_KEY: key}, default_flow_style=False)


def key_from_config(text: str) -> str | None:
    """The key a config file written by `config_yaml` holds; None when it holds none."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    value = data.get(CONFIG_KEY) if isinstance(data, dict) else None
    return str(value) if isinstance(value, str) and value else None


def config_flag_in(argv: Sequence[str]) -> bool:
    return any(a == CONFIG_FLAG or a.startswith(CONFIG_FLAG + "=") for a in argv)


def with_key_config(argv: Sequence[str], path: str) -> tuple[str, ...]:
    """argv with `--config PATH` appended. vLLM inserts the file's arguments before the command
    line's (command line > config > defaults), so nothing the recipe says is overridden."""
    if config_flag_in(argv):
        raise ValueError(
            f"the engine's argv already has {CONFIG_FLAG}: vLLM takes one config file, and the appliance "
            "passes the engine key in it (appliance/engine_secret.py); put those options in the "
            "recipe's "
            "engine fields or engine.extra_args instead"
        )
    return (*argv, CONFIG_FLAG, path)


def stable_config_path(directory: str, variant: str) -> str:
    """The host path of a variant's key file for the process runtime: the same for every launch of
    the variant (argv carries nothing per launch), distinct per variant."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", variant)[:64] or "engine"
    return f"{directory.rstrip('/')}/{safe}.{KEY_FILE_NAME}"


def redact(text: str, keys: Iterable[str] = ()) -> str:
    """`text` with every engine key removed: the appliance's own key shape, the `api_key` value of
    vLLM's non-default-args line, and each of `keys` (a recipe's own key) wherever it appears."""
    for key in keys:
        if key and len(key) >= 8:  # a very short "key" would blank ordinary words
            text = text.replace(key, REDACTED)
    text = _ARGS_API_KEY.sub(lambda m: m.group(1) + f"'{REDACTED}'", text)
    return _ENGINE_KEY.sub(REDACTED, text)


class StreamRedactor:
    """`redact` over a byte stream cut anywhere (the engine's pipe, read in chunks): the process shim
    writes the engine log through it, so no file on disk holds a key. Whole lines are redacted and
    passed on (a line ends at LF or CR: progress bars redraw with CR); an unfinished line is kept
    until its end arrives, so a key split across two reads is still seen whole. A line longer than
    `max_line` is cut at its last whitespace (a key holds none: appliance/recipe/key_chars.py), so a
    stream that never ends its line cannot grow the buffer without bound. Bytes that are not UTF-8
    pass through unchanged (surrogateescape)."""

    def __init__(self, keys: Iterable[str] = (), max_line: int = 64 * 1024) -> None:
        self._keys = [k for k in keys if k]
        self._max_line = max_line
        self._pending = b""

    def feed(self, chunk: bytes) -> bytes:
        """The redacted bytes that may be written now."""
        data = self._pending + chunk
        end = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
        if end == 0 and len(data) > self._max_line:
            end = max(data.rfind(b" "), data.rfind(b"\t")) + 1 or len(data)
        self._pending = data[end:]
        return self._redact(data[:end])

    def flush(self) -> bytes:
        """The rest (the stream ended without a final newline)."""
        rest, self._pending = self._pending, b""
        return self._redact(rest)

    def _redact(self, data: bytes) -> bytes:
        if not data:
            return b""
        return redact(data.decode("utf-8", "surrogateescape"), self._keys).encode("utf-8", "surrogateescape")


# ---- secret-shaped values: the one place every shown recipe, spec and launch record is redacted ----


def is_secret_name(name: str) -> bool:
    """An environment variable or flag name that looks like it holds a secret (HF_TOKEN, API_KEY...)."""
    return bool(_SECRET_NAME.search(name))


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """Values of variables whose names look secret are replaced (HF_TOKEN, OPENAI_API_KEY, ...)."""
    return {k: (REDACTED if is_secret_name(k) else v) for k, v in env.items()}


def redact_argv(argv: Sequence[str]) -> list[str]:
    """`--api-key X` and `--api-key=X` (any flag whose name looks secret) lose their value."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if arg.startswith("-") and is_secret_name(arg.lstrip("-").split("=", 1)[0].replace("-", "_")):
            if "=" in arg:
                out.append(arg.split("=", 1)[0] + "=" + REDACTED)
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(arg)
    return out


def redact_recipe_data(data: Mapping[str, Any]) -> dict[str, Any]:
    """A recipe's `model_dump(mode="json")` fit to show: the value of every secret-named variable of
    `env.vars` (a recipe's own VLLM_API_KEY, HF_TOKEN...) and of every secret-named flag in
    `engine.extra_args` (`--api-key KEY`) replaced. Anything else is returned as it was."""
    out = dict(data)
    env = out.get("env")
    if isinstance(env, Mapping) and isinstance(env.get("vars"), Mapping):
        shown_vars: dict[str, Any] = {}
        for name, var in env["vars"].items():
            if is_secret_name(name):
                var = {**var, "value": REDACTED} if isinstance(var, Mapping) else REDACTED
            shown_vars[name] = var
        out["env"] = {**env, "vars": shown_vars}
    engine = out.get("engine")
    if isinstance(engine, Mapping) and isinstance(engine.get("extra_args"), list | tuple):
        out["engine"] = {**engine, "extra_args": redact_argv([str(a) for a in engine["extra_args"]])}
    return out
