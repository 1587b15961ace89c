"""Unit tests run beside a running appliance (README: `make up`, then `make test`): none of them may
reach its state or its controller. A code path that falls back to the default APPLIANCE_HOME (as
root /var/lib/appliance: the key store the running gateway reads, the `run/controller-api` file the
CLI follows to the running controller) lands in a fresh directory instead, and the operator's
shell cannot point the CLI at the real controller or hand it the real admin token."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

# What a shell that runs an appliance may export (controller/api_client.py, controller/admin_token.py).
OPERATOR_ENV = ("APPLIANCE_API", "APPLIANCE_ADMIN_TOKEN", "APPLIANCE_ADMIN_TOKEN_SHA256")


@pytest.fixture(autouse=True, scope="session")
def _own_appliance_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("default-appliance-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("APPLIANCE_HOME", str(home))  # tests that need their own still set it (monkeypatch)
        for name in OPERATOR_ENV:
            mp.delenv(name, raising=False)
        yield home
