"""``controller/gateway/protocol.py`` subclasses uvicorn's private ``HttpToolsProtocol`` and reaches
into its request cycles. Nothing in uvicorn promises these names, so they are pinned here: the exact
uvicorn and httptools versions (pyproject.toml says ``==``), the methods the subclass overrides with
their parameters, and the attributes it reads or sets on the protocol and on a request cycle. An
upgrade is then a deliberate commit: bump the pin, run this, re-read protocol.py against the new
uvicorn source where it fails."""

from __future__ import annotations

import asyncio
import inspect
import re
import tomllib
from collections import deque
from importlib import metadata
from pathlib import Path
from typing import Any

from uvicorn.config import Config
from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from controller.gateway.protocol import GuardedHttpToolsProtocol

ROOT = Path(__file__).resolve().parents[2]

# Each method of HttpToolsProtocol that GuardedHttpToolsProtocol overrides, with its parameters.
OVERRIDDEN = {
    "__init__": ["self", "config", "server_state", "app_state", "_loop"],
    "connection_made": ["self", "transport"],
    "connection_lost": ["self", "exc"],
    "eof_received": ["self"],
    "data_received": ["self", "data"],
    "on_message_begin": ["self"],
    "on_header": ["self", "name", "value"],
    "on_headers_complete": ["self"],
    "on_body": ["self", "body"],
    "on_message_complete": ["self"],
}
# Attributes of the protocol that protocol.py reads or sets, and what they must be after a request's
# headers were parsed.
PROTOCOL_ATTRIBUTES = ["client", "cycle", "scope", "url", "headers", "transport", "loop",
                       "timeout_keep_alive_task", "pipeline"]
# Attributes of a RequestResponseCycle that protocol.py reads or sets.
CYCLE_ATTRIBUTES = ["scope", "transport", "disconnected", "message_event", "response_started",
                    "response_complete"]


def pinned(name: str) -> str:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for dep in deps:
        m = re.fullmatch(rf"{re.escape(name)}(\[[^\]]*\])?==([0-9][0-9.]*)", dep.replace(" ", ""))
        if m:
            return m.group(2)
    raise AssertionError(f"pyproject.toml must pin {name} with == (protocol.py reaches into it)")


def test_uvicorn_and_httptools_are_the_pinned_versions() -> None:
    assert metadata.version("uvicorn") == pinned("uvicorn")
    assert metadata.version("httptools") == pinned("httptools")


def test_the_overridden_methods_exist_with_these_parameters() -> None:
    for name, params in OVERRIDDEN.items():
        method = getattr(HttpToolsProtocol, name, None)
        assert method is not None, f"uvicorn's HttpToolsProtocol has no {name} any more"
        assert list(inspect.signature(method).parameters) == params, name
    # Every override is pinned: a new one must be added above, with the uvicorn source read.
    overrides = {
        name for name, value in vars(GuardedHttpToolsProtocol).items()
        if callable(value) and hasattr(HttpToolsProtocol, name)
    }
    assert overrides == set(OVERRIDDEN)


def test_the_cycle_constructor_and_send_receive_are_as_pinned() -> None:
    assert list(inspect.signature(RequestResponseCycle.__init__).parameters) == [
        "self", "scope", "transport", "flow", "logger", "access_logger", "access_log",
        "default_headers", "message_event", "expect_100_continue", "keep_alive", "on_response",
    ]
    assert list(inspect.signature(RequestResponseCycle.send).parameters) == ["self", "message"]
    assert list(inspect.signature(RequestResponseCycle.receive).parameters) == ["self"]
    # on_headers_complete builds the cycle by this module-level name.
    assert httptools_impl.RequestResponseCycle is RequestResponseCycle


class FakeTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5555), "sockname": ("127.0.0.1", 80)}.get(name, default)

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def test_the_attributes_protocol_py_reads_are_there_and_behave_as_relied_on() -> None:
    started: list[tuple[dict[str, Any], Any]] = []
    gate = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        started.append((scope, receive))
        await gate.wait()

    config = Config(app, http="httptools", lifespan="off")
    proto = HttpToolsProtocol(config, ServerState(), {}, asyncio.get_running_loop())
    transport = FakeTransport()
    proto.connection_made(transport)  # type: ignore[arg-type]
    # Two pipelined requests: the second is queued behind the first.
    proto.data_received(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n")
    for name in PROTOCOL_ATTRIBUTES:
        assert hasattr(proto, name), name
    assert proto.client == ("127.0.0.1", 5555)
    assert proto.transport is transport and proto.url == b"/b"
    assert proto.headers is proto.scope["headers"]  # on_header appends to the app's header list
    assert isinstance(proto.pipeline, deque) and len(proto.pipeline) == 1
    queued, _ = proto.pipeline[0]
    assert queued is proto.cycle  # self.cycle is the newest cycle, not the running one
    await asyncio.sleep(0)
    [(scope, receive)] = started
    assert scope["path"] == "/a" and scope["raw_path"] == b"/a"  # raw_path: what the proxy forwards
    running = receive.__self__
    assert isinstance(running, RequestResponseCycle) and running is not proto.cycle
    for name in CYCLE_ATTRIBUTES:
        assert hasattr(running, name), name
    assert isinstance(running.message_event, asyncio.Event)
    # uvicorn marks only its newest cycle on a lost connection: why protocol.py tracks them all. If
    # this fails, uvicorn tells every cycle itself and protocol.py's tracking may go.
    proto.connection_lost(None)
    assert proto.cycle.disconnected and not running.disconnected
    # A cycle marked disconnected writes nothing and reads a disconnect (what detaching relies on).
    running.disconnected = True
    await running.send({"type": "http.response.start", "status": 200, "headers": []})
    assert transport.writes == [] and not running.response_started
    assert (await running.receive())["type"] == "http.disconnect"
    gate.set()
    await asyncio.sleep(0)
