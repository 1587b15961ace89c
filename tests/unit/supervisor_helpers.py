"""Shared values and fakes for the supervisor and API tests: fakes only at the declared seams
(Runtime, Clock, Prober, GatewayLink, preflight)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from appliance.recipe.launch_spec import LaunchSpec
from appliance.runtimes.process import ProcessLaunch
from controller.gateway.control import GatewayControlError
from controller.runtime.base import EngineHandle, ExitInfo
from controller.supervisor.gateway_link import DrainResult, GatewayUpstream, HoldPlan
from controller.supervisor.signals import Failure, PreflightFailed, PreflightOk


def make_spec(
    recipe: str = "test-recipe", budget: int = 600, stall: int = 120, port: int = 18000
) -> LaunchSpec:
    return LaunchSpec(
        recipe=recipe,
        spec_hash="0123456789abcdef",
        platform="cpu",
        runtime=ProcessLaunch(python="/usr/bin/python3"),
        argv=("/usr/bin/python3", "-m", "engine", "--api-key", "not-printed"),
        env={"VLLM_LOGGING_LEVEL": "INFO", "HF_TOKEN": "hf_secret", "MY_API_KEY": "k", "PATH": "/usr/bin"},
        port=port,
        served_model_name="smollm2",
        cache_root="/tmp/cache",
        ready_budget_s=budget,
        stall_window_s=stall,
    )


def make_handle(
    launch_id: str, recipe: str = "test-recipe", ref: str = "4242", started_at: float = 0.0
) -> EngineHandle:
    return EngineHandle(
        launch_id=launch_id, runtime="process", ref=ref, recipe=recipe, spec_hash="0123456789abcdef",
        log_path=None, started_at=started_at,
    )


class FakeClock:
    def __init__(self, start: float = 1_000_000.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += seconds


@dataclass
class FakeEngine:
    handle: EngineHandle
    log: str = ""
    cpu: float = 0.0
    running: bool = True
    exit_code: int | None = None
    signal: int | None = None
    oom_killed: bool | None = None
    reason: str | None = None  # ExitInfo.reason: a runtime's own words (kubernetes: Unschedulable: …)
    healthy: bool = False
    ended: threading.Event = field(default_factory=threading.Event)

    def die(self, signal: int | None = None, exit_code: int | None = None) -> None:
        self.running = False
        self.signal = signal
        self.exit_code = exit_code if exit_code is not None else (128 + signal if signal else None)
        self.ended.set()


@dataclass
class FakeRuntime:
    clock: FakeClock
    name: str = "process"
    engines: dict[str, FakeEngine] = field(default_factory=dict)
    started: list[tuple[str, float]] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    on_start: Callable[[FakeEngine], None] | None = None
    keys: dict[str, str | None] = field(default_factory=dict)  # launch id → the key delivered

    def start(self, spec: LaunchSpec, launch_id: str, engine_key: str | None = None) -> EngineHandle:
        self.keys[launch_id] = engine_key
        # Labelled with an instance id, as every real runtime labels what it starts.
        handle = EngineHandle(launch_id=launch_id, runtime="process", ref=str(1000 + len(self.started)),
                              recipe=spec.recipe, spec_hash=spec.spec_hash, started_at=self.clock.now(),
                              instance="i-test")
        engine = FakeEngine(handle)
        self.engines[launch_id] = engine
        self.started.append((launch_id, self.clock.now()))
        if self.on_start is not None:
            self.on_start(engine)
        return handle

    def _exit(self, e: FakeEngine) -> ExitInfo:
        return ExitInfo(running=e.running, exit_code=e.exit_code, signal=e.signal, oom_killed=e.oom_killed,
                        reason=e.reason)

    def stop(self, handle: EngineHandle, grace_s: float) -> ExitInfo:
        e = self.engines[handle.launch_id]
        if e.running:
            e.die(signal=15)
        self.stopped.append(handle.launch_id)
        return self._exit(e)

    def inspect(self, handle: EngineHandle) -> ExitInfo:
        return self._exit(self.engines[handle.launch_id])

    def wait(self, handle: EngineHandle, timeout_s: float) -> ExitInfo:
        self.engines[handle.launch_id].ended.wait(timeout_s)  # blocks like the real ones (pidfd)
        return self.inspect(handle)

    def read_logs(self, handle: EngineHandle, offset: int) -> tuple[str, int]:
        data = self.engines[handle.launch_id].log.encode()
        return data[offset:].decode(), len(data)

    def adopt(self) -> list[EngineHandle]:
        return [e.handle for e in self.engines.values() if e.running]

    def read_engine_key(self, handle: EngineHandle) -> str | None:
        return self.keys.get(handle.launch_id)

    def engine_pids(self, handle: EngineHandle) -> list[int]:
        return [int(handle.ref)]

    def cpu_seconds(self, handle: EngineHandle) -> float:
        return self.engines[handle.launch_id].cpu

    def current(self) -> FakeEngine:
        return self.engines[self.started[-1][0]]


class FakeProber:
    def __init__(self, runtime: FakeRuntime) -> None:
        self.rt = runtime
        self.keys: list[str | None] = []  # the engine key each completion probe sent

    def _engine(self) -> FakeEngine | None:
        running = [e for e in self.rt.engines.values() if e.running]
        return running[-1] if running else None

    async def health(self, spec: LaunchSpec) -> str | None:
        e = self._engine()
        return None if e is not None and e.healthy else "GET /health: connection refused"

    async def completion(self, spec: LaunchSpec, api_key: str | None = None) -> str | None:
        self.keys.append(api_key)
        return await self.health(spec)


class FakePreflight:
    def __init__(self, spec: LaunchSpec, warm_restart: bool = False) -> None:
        self.spec = spec
        self.warm_restart = warm_restart
        self.calls = 0
        self.refuse: str | None = None

    async def __call__(self, token: int, name: str, fresh: bool) -> PreflightOk | PreflightFailed:
        self.calls += 1
        if self.refuse:
            return PreflightFailed(token, Failure("admission_refused", self.refuse, retryable=False))
        return PreflightOk(token, f"L{self.calls}", self.spec, self.warm_restart, cache_empty=self.calls == 1)


class RecordingGateway:
    """A fake gateway link that keeps the slot the way the gateway process does: in memory, so
    `restart()` forgets it; `down` makes every call fail as an unreachable gateway does."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []
        self.upstream: GatewayUpstream | None = None
        self.down = False
        self.checks = 0
        self.keys: list[str | None] = []  # the engine key each point_to carried
        self.holds: list[HoldPlan | None] = []  # the hold each drain/clear carried
        self.details: list[str | None] = []  # the reason each clear gave held requests
        self.renewals: list[HoldPlan] = []
        self.cut = 0  # what a drain reports as cut at its deadline
        self.held = 0  # how many requests a hold renewal reports held

    def _reach(self) -> None:
        if self.down:
            raise GatewayControlError("gateway http://127.0.0.1:8080 unreachable: connection refused")

    def restart(self) -> None:
        self.upstream = None

    async def point_to(
        self, url: str, served_model: str, api_key: str | None = None, aliases: Sequence[str] = ()
    ) -> None:
        self.calls.append(("point_to", url))
        self.keys.append(api_key)
        self._reach()
        self.upstream = GatewayUpstream(url.rstrip("/"), served_model, frozenset(aliases))

    async def switch(
        self, url: str, served_model: str, api_key: str | None, deadline_s: float,
        aliases: Sequence[str] = (),
    ) -> DrainResult | None:
        self.calls.append(("switch", url))
        self.keys.append(api_key)
        self._reach()
        self.upstream = GatewayUpstream(url.rstrip("/"), served_model, frozenset(aliases))
        return DrainResult(drained=self.cut == 0, aborted=self.cut, remaining=0, waited_s=0.0)

    async def drain(
        self, deadline_s: float, retry_after_s: float, hold: HoldPlan | None = None
    ) -> DrainResult | None:
        self.calls.append(("drain", deadline_s))
        self.holds.append(hold)
        self._reach()
        self.upstream = None
        return DrainResult(drained=self.cut == 0, aborted=self.cut, remaining=0, waited_s=0.0)

    async def clear(
        self, retry_after_s: float, hold: HoldPlan | None = None, detail: str | None = None
    ) -> None:
        self.calls.append(("clear", retry_after_s))
        self.holds.append(hold)
        self.details.append(detail)
        self._reach()
        self.upstream = None

    async def renew_hold(self, hold: HoldPlan) -> dict[str, object] | None:
        self.renewals.append(hold)
        self._reach()
        return {"holding": True, "reason": hold.reason, "waiting": self.held,
                "ready_in_s": hold.expected_ready_s}

    async def current(self) -> GatewayUpstream | None:
        self.checks += 1
        self._reach()
        return self.upstream
