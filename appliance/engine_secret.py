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
`api_key` in clear (0.32 redacts it: `redact_sensitive_args`). `redact` (appliance/engine_redact.py,
re-exported here) removes engine keys from any engine log text the appliance shows or stores, and
the engine's output is redacted *as it is written*: by the process shim into `engine.log`, by the
Docker runtime's container wrapper before the daemon's json log sees it — no file on disk holds it.

vLLM takes one `--config` (`assert args.count("--config") <= 1`): a recipe that brings its own is
refused by the runtimes with the reason (`config_flag_in`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from appliance.engine_redact import CONFIG_KEY as CONFIG_KEY
from appliance.engine_redact import REDACTED as REDACTED
from appliance.engine_redact import StreamRedactor as StreamRedactor
from appliance.engine_redact import redact as redact

CONFIG_FLAG = "--config"
# vLLM accepts only .yaml/.yml config files (load_config_file checks the extension).
KEY_FILE_NAME = "engine-key.yaml"
# Where a container engine finds it: docker puts the file into the created container before it
# starts; kubernetes mounts the launch's Secret there. The same path for every launch.
CONTAINER_KEY_DIR = "/run/appliance-engine"
CONTAINER_KEY_PATH = f"{CONTAINER_KEY_DIR}/{KEY_FILE_NAME}"

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
