"""The real controller (`appliance serve`) and the real gateway (`appliance gateway`) as `appliance up`
wires them, no engine needed: the controller's `--gateway-url` is the gateway's control listener,
and it still reads and sets the gateway's upstream while every connection 127.0.0.1 may hold on the
client port is taken (as a reverse proxy on the host does with held requests)."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from controller import admin_token
from controller.gateway import control
from controller.settings import Paths
from tests.integration.controller_harness import REPO, TOKEN, Controller, free_port

pytestmark = pytest.mark.timeout(180)


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[int, int, str]]:
    """(client port, control port, control token) of a gateway process with a client cap of 2."""
    home = tmp_path / "home"
    token = admin_token.write_gateway_token(home / "run")
    port, control_port = free_port(), free_port()
    env = {**os.environ, "APPLIANCE_HOME": str(home), admin_token.HASH_ENV: admin_token.hash_token(token)}
    log = (tmp_path / "gateway.log").open("ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "controller.cli.main", "gateway", "--listen", f"127.0.0.1:{port}",
         "--control-listen", f"127.0.0.1:{control_port}", "--keys", str(Paths(home).keys_db),
         "--max-connections-per-client", "2", "--header-timeout", "60"],
        env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if _get(f"http://127.0.0.1:{control_port}/healthz") == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None, (tmp_path / "gateway.log").read_text()
            assert time.monotonic() < deadline, "the gateway's control listener did not answer"
            time.sleep(0.1)
        yield port, control_port, token
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def test_the_controller_reaches_the_gateway_with_its_client_cap_full(
    tmp_path: Path, gateway: tuple[int, int, str]
) -> None:
    port, control_port, token = gateway
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    ctl = Controller(tmp_path / "home", recipes, free_port(), free_port(), recipe=None,
                     extra_args=("--gateway-url", f"http://127.0.0.1:{control_port}"))
    held: list[socket.socket] = []
    try:
        ctl.start()
        # The client port's cap from 127.0.0.1, full of connections that never send a head.
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
        time.sleep(0.2)
        with socket.create_connection(("127.0.0.1", port)) as over:
            over.settimeout(5)
            assert over.recv(4096).startswith(b"HTTP/1.1 429 ")
        # What the controller's supervisor does at ready (PUT /admin/upstream), then what its
        # console reads back (GET /admin/upstream), both on the control listener.
        switched = asyncio.run(control.set_upstream(
            f"http://127.0.0.1:{control_port}", token, "http://127.0.0.1:9", "m", drain_deadline_s=0))
        assert switched.upstream is not None and switched.upstream["url"] == "http://127.0.0.1:9"

        async def console_page() -> str:
            async with httpx.AsyncClient(base_url=ctl.url) as c:
                page = await c.get("/console/login")
                found = re.search(r'name="form_token" value="([^"]+)"', page.text)
                assert found
                await c.post("/console/login", data={"token": TOKEN, "form_token": found.group(1),
                                                     "next": "/console/"})
                return (await c.get("/console/")).text

        page = asyncio.run(console_page())
        assert '<dd id="gateway-upstream">http://127.0.0.1:9</dd>' in page, page
        assert _get(f"http://127.0.0.1:{control_port}/metrics") == 200  # the Prometheus scrape
    finally:
        for s in held:
            s.close()
        ctl.stop()
