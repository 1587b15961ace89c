"""What the controller API is built from (`create_app(ctx)` in controller/api/app.py).

Its own module, below both the API and the console (controller/console/ mounts its pages on the
same app and reads the same driver, store and preflight): the console no longer imports the API
module that mounts it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.api.gate import MAX_BODY_BYTES
from controller.store import Store
from controller.supervisor.driver import Driver
from controller.supervisor.preflight import Preflight


@dataclass
class ApiContext:
    driver: Driver
    store: Store
    preflight: Preflight
    home: Path  # where the admin token's hash file lives
    default_recipe: str | None = None
    extra_routers: tuple[Any, ...] = ()  # e.g. keys_router(require_admin)
    listen_host: str | None = None  # the address the API is bound to: also an accepted Host
    extra_hosts: tuple[str, ...] = ()  # more accepted Host names (besides loopback, $APPLIANCE_ADMIN_HOSTS)
    max_body_bytes: int = MAX_BODY_BYTES
