"""Prometheus follows the engine: the target file its file-based service discovery reads.

A blue/green switch moves the serving engine to another port (blue_green.py, launch_port.py), so a
static scrape target loses it. The driver publishes, after every transition, the engines that have
been probed ready and still run — the current launch once ready, and the old one of a blue/green
switch until it is stopped — as a `file_sd_configs` file (`$APPLIANCE_HOME/prometheus/engines.json`,
`Paths.prometheus_targets`), each target labelled with its recipe, launch id and served model. No
engine: an empty list, so Prometheus drops the old target instead of keeping the last one it read.

The address is `LaunchSpec.base_url`'s host:port, the one the controller's probes and the gateway use.
Prometheus reaches it at the same address: on a host every process shares loopback, and in compose
every service (Prometheus included) and the engine container use the host's network
(compose.yaml), so 127.0.0.1:PORT means the same engine everywhere.

The file is replaced atomically (a temporary file in the same directory, then rename): Prometheus
re-reads it on the rename and never sees half a list. The temporary name does not end in `.json`,
so the `*.json` glob of the scrape config never picks it up.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from controller.supervisor.machine import Launch, Machine

log = logging.getLogger(__name__)

TargetGroup = dict[str, Any]  # {"targets": ["host:port"], "labels": {...}}: Prometheus' file_sd format


def _group(launch: Launch) -> TargetGroup:
    spec = launch.spec
    return {
        "targets": [urlsplit(spec.base_url).netloc],
        "labels": {"recipe": spec.recipe, "launch": launch.launch_id, "model": spec.served_model_name},
    }


def engine_targets(m: Machine) -> list[TargetGroup]:
    """The engines to scrape now: the old engine of a blue/green switch while it still runs, then the
    current one once it has been probed ready (a starting engine's /metrics does not answer yet)."""
    groups: list[TargetGroup] = []
    if m.old is not None and m.old.handle is not None:
        groups.append(_group(m.old))
    launch = m.launch
    if launch is not None and launch.handle is not None and launch.ready_at is not None:
        groups.append(_group(launch))
    return groups


def write_atomically(path: Path, groups: list[TargetGroup]) -> None:
    """Replace `path` with `groups` as JSON in one rename (readable by Prometheus' own user)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(groups, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        # mkstemp makes it 0600; Prometheus runs as its own user (images/prometheus) and must read it.
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class ScrapeTargets:
    """Writes the `engine_targets` of every driver's machine to `path` whenever they change.

    Several engines on one host (engine_set.py) share one file: each driver publishes its machine
    under its engine name (`engine`: None for the primary), and the file lists them all, the
    primary's first, so that one driver's transition never drops another's engines from it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._written: list[TargetGroup] | None = None
        self._failing = False
        self._machines: dict[str | None, Machine] = {}

    def publish(self, m: Machine, engine: str | None = None) -> None:
        self._machines[engine] = m
        self._write()

    def forget(self, engine: str) -> None:
        """That engine's driver is gone (stopped and removed from the set): its targets go."""
        if self._machines.pop(engine, None) is not None:
            self._write()

    def _write(self) -> None:
        order = sorted(self._machines, key=lambda name: (name is not None, name or ""))
        groups = [g for name in order for g in engine_targets(self._machines[name])]
        if groups == self._written:
            return
        try:
            write_atomically(self.path, groups)
        except OSError as exc:
            # Monitoring must never stop supervision; the next transition tries again. Said once.
            if not self._failing:
                log.warning("cannot write the Prometheus engine targets %s: %s", self.path, exc)
            self._failing = True
            return
        self._failing = False
        self._written = groups
