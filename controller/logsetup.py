"""The controller's and gateway's logging, configured the same way on every host.

On the H200 host `logs/controller.log` held uvicorn's lines only. `logging.basicConfig` does
nothing when the root logger already has a handler (a `sitecustomize`, a `.pth` hook or any imported
package may add one; the root then stays at WARNING and every INFO line of ours is dropped), and a
dictConfig run by a library with `disable_existing_loggers: True` silences loggers created before
it — ours are created at import time. So: one dictConfig that *replaces* the root's handlers and
level, and the same dict handed to uvicorn as its `log_config`, so uvicorn's own configure step
re-applies it instead of layering its defaults on top. `disable_existing_loggers: False` also
re-enables any logger an earlier config disabled (logging.config resets `disabled` on every
existing logger it does not configure).
"""

from __future__ import annotations

import logging.config
from typing import Any

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def logging_config(level: str) -> dict[str, Any]:
    """A dictConfig: our format on stderr at `level`; uvicorn's loggers propagate to it."""
    lvl = level.upper()
    uvicorn_logger = {"level": lvl, "handlers": [], "propagate": True}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"plain": {"format": FORMAT}},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "plain",
                                "stream": "ext://sys.stderr"}},
        "root": {"level": lvl, "handlers": ["stderr"]},
        "loggers": {"uvicorn": uvicorn_logger, "uvicorn.error": uvicorn_logger,
                    "uvicorn.access": uvicorn_logger},
    }


def configure(level: str) -> dict[str, Any]:
    """Apply `logging_config(level)` now and return it (pass it to uvicorn as `log_config`)."""
    config = logging_config(level)
    logging.config.dictConfig(config)
    return config
