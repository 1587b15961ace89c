"""Engine keys out of engine output: the redaction rules, stdlib only. Pure, the lowest leaf.

Split from appliance/engine_secret.py (which re-exports `redact`, `StreamRedactor` and `REDACTED`)
because these rules also run *inside* an engine container: the Docker runtime copies this file,
`engine_names.py` and controller/runtime/container_wrapper.py into the container and runs the
wrapper as its entrypoint with the image's own `python -I -S` — no site-packages there (the gfx906
image's torch-first `.pth` would import torch into the wrapper), so nothing but the standard
library may be imported here, and nothing of the appliance (it is not in the container).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

CONFIG_KEY = "api-key"  # the one entry of the engine's key config file (engine_secret.config_yaml)
API_KEY_FLAG = "--api-key"
REDACTED = "<redacted>"

# controller/supervisor/launch_key.py makes keys as "eng_" + secrets.token_urlsafe(32): 43 characters.
_ENGINE_KEY = re.compile(r"eng_[A-Za-z0-9_-]{43}")
# vLLM 0.26.0's "non-default args: {…, 'api_key': ['KEY'], …}" (a key of any shape, e.g. a recipe's own).
_ARGS_API_KEY = re.compile(r"""(['"]api_key['"]\s*:\s*)(\[[^\]]*\]|'[^']*'|"[^"]*")""")
# The config file as yaml.safe_dump writes `{api-key: KEY}` for a key of visible ASCII (key_chars.py):
# a plain scalar, or single-quoted with '' for a quote. Double quotes (escapes) are never produced
# for such a key; they are not decoded here.
_CONFIG_LINE = re.compile(r"api-key:[ ]+(?:'((?:[^']|'')*)'|([^'\"\s][^\s]*))[ ]*")


def redact(text: str, keys: Iterable[str] = ()) -> str:
    """`text` with every engine key removed: the appliance's own key shape, the `api_key` value of
    vLLM's non-default-args line, and each of `keys` (a recipe's own key) wherever it appears."""
    for key in keys:
        if key and len(key) >= 8:  # a very short "key" would blank ordinary words
            text = text.replace(key, REDACTED)
    text = _ARGS_API_KEY.sub(lambda m: m.group(1) + f"'{REDACTED}'", text)
    return _ENGINE_KEY.sub(REDACTED, text)


def config_key(text: str) -> str | None:
    """The key of a key config file written by `engine_secret.config_yaml`, read without a YAML
    library (the container wrapper has none); None for anything else. engine_secret.key_from_config
    (PyYAML) stays the reader everywhere PyYAML is importable."""
    match = _CONFIG_LINE.fullmatch(text.strip())
    if match is None:
        return None
    quoted, plain = match.groups()
    return quoted.replace("''", "'") if quoted is not None else plain


def argv_keys(argv: Sequence[str]) -> list[str]:
    """A recipe's own `--api-key K` / `--api-key=K` values in an engine command line."""
    keys: list[str] = []
    for i, arg in enumerate(argv):
        if arg == API_KEY_FLAG and i + 1 < len(argv):
            keys.append(argv[i + 1])
        elif arg.startswith(API_KEY_FLAG + "="):
            keys.append(arg.split("=", 1)[1])
    return keys


class StreamRedactor:
    """`redact` over a byte stream cut anywhere (the engine's pipe, read in chunks): the process shim
    and the Docker runtime's container wrapper copy the engine's output through it, so no file on
    disk holds a key. Whole lines are redacted and passed on (a line ends at LF or CR: progress bars
    redraw with CR); an unfinished line is kept until its end arrives, so a key split across two
    reads is still seen whole. A line longer than `max_line` is cut at its last whitespace (a key
    holds none: appliance/recipe/key_chars.py), so a stream that never ends its line cannot grow
    the buffer without bound. Bytes that are not UTF-8 pass through unchanged (surrogateescape)."""

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
