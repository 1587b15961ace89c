"""Which listener accepted a connection (``ConnectionGuard.listener_of``): told by the local address
the connection was accepted on, compared with the control listener's bound addresses."""

from __future__ import annotations

import pytest

from controller.gateway.protocol import ConnectionGuard, Listener, is_admin_path, is_control_path


def guard(*control: tuple[str, int]) -> ConnectionGuard:
    g = ConnectionGuard(max_header_bytes=1024, header_timeout_s=1.0, max_per_client=2, max_total=4)
    g.control_endpoints = list(control)
    return g


@pytest.mark.parametrize(
    ("control", "sockname", "expected"),
    [
        # No control listener: every connection is a client's.
        ((), ("127.0.0.1", 8081), Listener.CLIENT),
        ((("127.0.0.1", 8081),), ("127.0.0.1", 8081), Listener.CONTROL),
        ((("127.0.0.1", 8081),), ("127.0.0.1", 8080), Listener.CLIENT),  # the client port
        # Same port, another local address: another listening socket (clients on 10.0.0.5:8081).
        ((("127.0.0.1", 8081),), ("10.0.0.5", 8081), Listener.CLIENT),
        # A wildcard control address: any local address on its port.
        ((("0.0.0.0", 8081),), ("10.0.0.5", 8081), Listener.CONTROL),
        ((("::", 8081),), ("::1", 8081, 0, 0), Listener.CONTROL),
        ((("::1", 8081),), ("::1", 8081, 0, 0), Listener.CONTROL),
        # A dual-stack socket reports IPv4 as IPv4-mapped IPv6.
        ((("127.0.0.1", 8081),), ("::ffff:127.0.0.1", 8081, 0, 0), Listener.CONTROL),
        # Several addresses (``localhost``: 127.0.0.1 and ::1, each its own port when 0 was asked).
        ((("127.0.0.1", 8081), ("::1", 8082)), ("::1", 8082, 0, 0), Listener.CONTROL),
        ((("127.0.0.1", 8081), ("::1", 8082)), ("::1", 8081, 0, 0), Listener.CLIENT),
        # What a transport without an address gives: never the control listener.
        ((("127.0.0.1", 8081),), None, Listener.CLIENT),
        ((("127.0.0.1", 8081),), "/tmp/sock", Listener.CLIENT),
    ],
)
def test_listener_of(control: tuple[tuple[str, int], ...], sockname: object, expected: Listener) -> None:
    assert guard(*control).listener_of(sockname) is expected


def test_control_connections_have_their_own_cap_and_never_count_as_clients() -> None:
    g = guard(("127.0.0.1", 8081))
    g.max_control = 1
    assert g.admit("127.0.0.1", Listener.CONTROL) is None
    refusal = g.admit("127.0.0.1", Listener.CONTROL)
    assert isinstance(refusal, bytes) and refusal.startswith(b"HTTP/1.1 503 ")
    assert g.total == 0 and g.by_client == {}
    for _ in range(2):
        assert g.admit("127.0.0.1") is None
    assert isinstance(g.admit("127.0.0.1"), bytes)  # the client cap, full: no reserve lent anymore
    g.release("127.0.0.1", Listener.CONTROL)
    assert g.control_open == 0 and g.admit("127.0.0.1", Listener.CONTROL) is None


@pytest.mark.parametrize(
    ("path", "control", "admin"),
    [
        (b"/admin/upstream", True, True),
        (b"/admin", True, True),
        (b"/metrics", True, False),
        (b"/healthz", True, False),
        (b"/administrator", False, False),
        (b"/metrics/x", False, False),
        (b"/v1/chat/completions", False, False),
        (b"/", False, False),
    ],
)
def test_control_paths(path: bytes, control: bool, admin: bool) -> None:
    assert is_control_path(path) is control
    assert is_admin_path(path) is admin
