"""How often the driver looks, and how patiently (`appliance serve` builds it from its options)."""

from __future__ import annotations

from dataclasses import dataclass, field

from controller.supervisor.hold_plan import HoldPolicy


@dataclass(frozen=True)
class DriverConfig:
    poll_interval_s: float = 1.0
    probe_interval_s: float = 2.0  # readiness probes while starting
    health_interval_s: float = 10.0  # liveness probes while ready
    health_failures: int = 3  # consecutive failed health probes → HealthLost
    # The kernel's OOM record can trail the process's death a little; wait this long for the kmsg
    # watch before classifying an exit (its detection latency goal is < 1 s).
    oom_settle_s: float = 1.0
    stop_retries: int = 3
    # While ready: ask the gateway (GET /admin/upstream) whether it still routes to the engine. A
    # gateway restarted under a running controller has no slot and answers 503 until told again.
    gateway_check_interval_s: float = 10.0
    # A thread per engine blocks in Runtime.wait (pidfd / docker) so that a death is known at once,
    # not at the next poll; it re-checks that its launch is still current this often.
    watch_exits: bool = True
    exit_watch_s: float = 30.0
    # How long the gateway holds new requests during a planned switch (hold_plan.py).
    hold: HoldPolicy = field(default_factory=HoldPolicy)
