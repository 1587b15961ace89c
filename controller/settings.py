"""Where the appliance keeps its state, and the knobs an operator sets through the environment
(every APPLIANCE_* variable is a field of appliance.settings.Settings, re-exported here).

One place decides the data directory so that the engine environment, the model cache, the launch
store, the key store and the compile caches all land under the same root (and survive a
controller restart or a fresh clone of the code).
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

# The APPLIANCE_* variables themselves (names, types, defaults, meanings) are appliance/settings.py,
# re-exported here for the controller.
from appliance.settings import Settings as Settings
from appliance.settings import SettingsError as SettingsError
from appliance.settings import current as current


def default_home() -> Path:
    """$APPLIANCE_HOME, else the rule in appliance/settings.py (root: /var/lib/appliance)."""
    return current().appliance_home()


@dataclass(frozen=True)
class Paths:
    """Every on-disk location the appliance uses, derived from one root."""

    home: Path

    @property
    def engine_venv(self) -> Path:
        return self.home / "engine" / "venv"

    @property
    def engine_python(self) -> Path:
        return self.engine_venv / "bin" / "python"

    @property
    def models(self) -> Path:
        return self.home / "models"

    @property
    def cache(self) -> Path:
        return self.home / "cache"

    @property
    def generated_recipes(self) -> Path:
        """Recipes the appliance writes itself: a choice's sweep variants (controller/catalogue.py)."""
        return self.home / "recipes-generated"

    @property
    def runs(self) -> Path:
        """Per-launch log files and PID files."""
        return self.home / "runs"

    @property
    def db(self) -> Path:
        return self.home / "appliance.sqlite3"

    @property
    def api_file(self) -> Path:
        """The URL of the controller `appliance up` started here (`up --port`): every command of this
        home talks to it when $APPLIANCE_API is not set (controller/api_client.py)."""
        return self.home / "run" / "controller-api"

    @property
    def instance_file(self) -> Path:
        """This appliance instance's id (`instance_id`), written at first start."""
        return self.home / "instance-id"

    @property
    def keys_db(self) -> Path:
        return self.home / "keys.sqlite3"

    @property
    def prometheus_targets(self) -> Path:
        """The engines Prometheus scrapes (file_sd, written by the controller: scrape_targets.py);
        compose.yaml mounts this directory into the Prometheus container."""
        return self.home / "prometheus" / "engines.json"

    @property
    def host_changes(self) -> Path:
        """The journal of host changes made by `appliance host apply`, read by `revert`."""
        return self.home / "host-changes.json"


def paths() -> Paths:
    return Paths(home=default_home())


def recipes_dir() -> Path:
    """The recipe directory: $APPLIANCE_RECIPES, else the `recipes/` folder beside the code."""
    explicit = current().recipes
    if explicit is not None:
        return explicit
    return Path(__file__).resolve().parent.parent / "recipes"


DEFAULT_RECIPE = "cpu-smollm2"
CONTROLLER_PORT = 8090  # admin API + controller /metrics, 127.0.0.1 unless configured
GATEWAY_PORT = 8080  # DOMAIN §1: the api-gateway on :8080 in front of the engine on :8000
ENGINE_PORT = 8000


def instance_id(paths: Paths) -> str:
    """This appliance instance's id: random, written under APPLIANCE_HOME at first start and read
    back after. Every engine carries it (LABEL_INSTANCE) so that a runtime adopts only its own
    instance's engines — two appliances may share one Docker daemon."""
    path = paths.instance_file
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        text = ""
    if text:
        return text
    new = secrets.token_hex(8)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(new + "\n")
    try:
        os.link(tmp, path)  # never replaces an id another process wrote meanwhile
    except FileExistsError:
        return path.read_text().strip() or new
    finally:
        tmp.unlink(missing_ok=True)
    return new
