"""The response head shares a write with the first body bytes; a stream's head still leaves at once."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from controller.gateway.protocol import HeadCoalescer, raw_response


class FakeCycle:
    transport: Any = None


class FakeTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


def coalescer() -> tuple[HeadCoalescer, FakeTransport, FakeCycle]:
    t = FakeTransport()
    cycle = FakeCycle()
    cycle.transport = HeadCoalescer(cast(Any, t), asyncio.get_running_loop(), cycle)
    return cycle.transport, t, cycle


async def test_a_ready_response_is_one_write() -> None:
    _, t, cycle = coalescer()
    cycle.transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    cycle.transport.write(b"{}")
    assert cycle.transport is t  # after the head, writes go straight to the transport
    cycle.transport.write(b"")
    await asyncio.sleep(0)  # the scheduled flush finds nothing left
    assert t.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}", b""]


async def test_a_stream_head_leaves_at_the_end_of_the_loop_iteration() -> None:
    _, t, cycle = coalescer()
    cycle.transport.write(b"HEAD")
    assert t.writes == []
    await asyncio.sleep(0)
    assert t.writes == [b"HEAD"] and cycle.transport is t
    cycle.transport.write(b"chunk1")
    cycle.transport.write(b"chunk2")
    assert t.writes == [b"HEAD", b"chunk1", b"chunk2"]  # each chunk as it came, no copies


async def test_close_sends_a_held_head_first() -> None:
    c, t, _ = coalescer()
    c.write(b"HEAD")
    c.close()
    assert t.writes == [b"HEAD"] and t.closed and c.is_closing()


def test_raw_refusals_are_complete_json_responses() -> None:
    raw = raw_response(431, "too big")
    head, body = raw.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
    assert b"connection: close" in head and f"content-length: {len(body)}".encode() in head
    assert b'"type": "invalid_request_error"' in body
