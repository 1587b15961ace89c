"""Do clients notice a planned restart? A bounded client loop through the gateway across switches of
the real CPU engine, counting what failed and what the switch added to each request.

    flock /tmp/appliance-engine.lock .venv/bin/python bench/hold_bench.py            # every case
    flock /tmp/appliance-engine.lock .venv/bin/python bench/hold_bench.py --cases restart,sigkill --clients 4

What runs: a gateway process (`appliance gateway`, as `appliance up` starts it) and a controller
(`appliance serve --gateway-url …`, the integration tests' harness: a temporary APPLIANCE_HOME, the
installed engine and model, the persistent test compile cache), `--clients` concurrent clients (half
streaming, half not; each a loop of small chat completions with a short pause) through the gateway,
and per case:

- restart: `POST /restart` (a warm restart of cpu-smollm2);
- apply: `POST /apply cpu-smollm2-eager`, ready, then `POST /apply cpu-smollm2` again, ready, both
  with `blue_green: false` (drain, stop, start while the gateway holds);
- bluegreen: the same two applies with blue/green: two small CPU engines fit in RAM here, so each new
  engine starts beside the serving one (on another port), the gateway switches when it is ready and
  the old one is drained and stopped (the path each apply took is printed);
- sigkill: SIGKILL to the engine's process group: the controller sees the death, backs off and
  relaunches it.

Per case it prints requests, failed requests (and, for sigkill, how many were in flight at the kill),
the added latency p50/p99 of the requests that overlapped the switch (their latency minus the median
latency before it) and the longest of them. The goal (README "Restarts that clients do not notice"):
0 failed in restart and apply when the start fits the hold's bound, 0 in bluegreen (nothing is held:
the added latency is the switch's own); after a SIGKILL only the requests
in flight at the kill. `run_load` and `summarise` are what tests/integration/test_hold_engine.py uses.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from controller import admin_token  # noqa: E402
from controller.gateway.keystore import KeyStore  # noqa: E402


@dataclass
class Req:
    t0: float
    t1: float
    stream: bool
    status: int
    ok: bool
    error: str | None = None

    @property
    def latency(self) -> float:
        return self.t1 - self.t0


@dataclass
class Load:
    """Clients running until `stop` is set; their requests, in the order they ended."""

    gateway_url: str
    key: str
    clients: int = 4
    pause_s: float = 0.2
    max_tokens: int = 8
    requests: list[Req] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def _one(self, session: aiohttp.ClientSession, stream: bool) -> Req:
        body = {"model": "smollm2", "max_tokens": self.max_tokens, "temperature": 0, "stream": stream,
                "messages": [{"role": "user", "content": "Say hello."}]}
        t0 = time.monotonic()
        try:
            async with session.post(f"{self.gateway_url}/v1/chat/completions", json=body,
                                    headers={"Authorization": f"Bearer {self.key}"}) as r:
                text = (await r.read()).decode(errors="replace")
                # A stream is whole only with its [DONE]; an error event after held comments is not.
                ok = r.status == 200 and ("data: [DONE]" in text if stream else '"choices"' in text)
                error = None if ok else text[-300:]
                return Req(t0, time.monotonic(), stream, r.status, ok, error)
        except (aiohttp.ClientError, TimeoutError) as exc:
            return Req(t0, time.monotonic(), stream, 0, False, repr(exc))

    async def _client(self, i: int) -> None:
        timeout = aiohttp.ClientTimeout(total=900)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while not self.stop.is_set():
                self.requests.append(await self._one(session, stream=i % 2 == 1))
                await asyncio.sleep(self.pause_s)

    async def run(self) -> None:
        await asyncio.gather(*(self._client(i) for i in range(self.clients)))


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def summarise(name: str, reqs: list[Req], switch_t0: float, switch_t1: float,
              kill_t: float | None = None) -> dict[str, Any]:
    """Failed requests, and what the switch added to the requests that overlapped it."""
    before = [r.latency for r in reqs if r.t1 <= switch_t0 and r.ok]
    base = statistics.median(before) if before else 0.0
    during = [r for r in reqs if r.t1 >= switch_t0 and r.t0 <= switch_t1]
    added = [max(0.0, r.latency - base) for r in during if r.ok]
    failed = [r for r in reqs if not r.ok]
    out: dict[str, Any] = {
        "case": name,
        "requests": len(reqs),
        "failed": len(failed),
        "failed_examples": [f"{r.status} {r.error}"[:200] for r in failed[:3]],
        "overlapping_switch": len(during),
        "baseline_latency_s": round(base, 3),
        "added_p50_s": _round(_pct(added, 0.5)),
        "added_p99_s": _round(_pct(added, 0.99)),
        "longest_hold_s": _round(max(added) if added else None),
        "switch_s": round(switch_t1 - switch_t0, 1),
    }
    if kill_t is not None:
        out["in_flight_at_kill"] = sum(1 for r in reqs if r.t0 <= kill_t < r.t1)
    return out


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 2)


# ------------------------------------------------------------------------------------------------
# The stack: a gateway process and a controller that tells it about engine slots


class GatewayProcess:
    """`appliance gateway` on a free port with a fresh key store and the controller's control token;
    its control listener (the controller's admin calls) on another free port."""

    def __init__(self, home: Path, port: int, control_port: int) -> None:
        self.home, self.port, self.control_port = home, port, control_port
        self.proc: subprocess.Popen[bytes] | None = None
        self.key = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def control_url(self) -> str:
        return f"http://127.0.0.1:{self.control_port}"

    def start(self) -> None:
        run = self.home / "run"
        run.mkdir(parents=True, exist_ok=True)
        control = admin_token.write_gateway_token(run)
        keys = KeyStore(self.home / "keys.sqlite3")
        self.key = keys.create("hold-bench")[1]
        env = {**os.environ, admin_token.HASH_ENV: admin_token.hash_token(control)}
        log = (self.home / "gateway.log").open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "controller.cli.main", "gateway", "--listen", f"127.0.0.1:{self.port}",
             "--control-listen", f"127.0.0.1:{self.control_port}", "--keys", str(keys.path)],
            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
            start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=2):
                    return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"the gateway did not answer on {self.url}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None

    def hold_view(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + "/healthz", timeout=5) as r:
            data: dict[str, Any] = json.loads(r.read())
        return data.get("hold") or {}


@contextmanager
def gateway_process(home: Path, port: int, control_port: int) -> Iterator[GatewayProcess]:
    gw = GatewayProcess(home, port, control_port)
    gw.start()
    try:
        yield gw
    finally:
        gw.stop()


def engine_pid(home: Path, launch_id: str) -> int:
    """The engine's process (group leader) of a launch, from its run directory (process runtime)."""
    data = json.loads((home / "runs" / launch_id / "process.json").read_text())
    return int(data["pid"])


async def across(load: Load, switch: Callable[[], Awaitable[float | None]], settle_s: float = 5.0,
                 warmup_s: float = 5.0, wait_most_s: float = 600.0) -> tuple[float, float, float | None]:
    """Run `load`, then `switch` (which returns the kill time, if any) once it has warmed up, then
    let it run `settle_s` more. Returns (switch start, switch end, kill time).

    Warmed up and settled are events, not only durations: the switch starts once `warmup_s` has passed
    AND every client has had an answer (so some requests end before the switch), and the load stops
    once `settle_s` has passed AND a request begun after the switch has ended (so the new engine
    served). On a slow machine a first answer took longer than the 5 s warm-up, every request
    overlapped the switch, and the row had nothing to compare with. `wait_most_s` bounds each wait:
    past it the load goes on and the caller's assertions say what is missing."""
    runner = asyncio.create_task(load.run())
    await _until(lambda: len(load.requests) >= load.clients, warmup_s, wait_most_s, runner)
    t0 = time.monotonic()
    kill_t = await switch()
    t1 = time.monotonic()
    await _until(lambda: any(r.t0 >= t1 for r in load.requests), settle_s, wait_most_s, runner)
    load.stop.set()
    await runner
    return t0, t1, kill_t


async def _until(done: Callable[[], bool], least_s: float, most_s: float, runner: asyncio.Task[None]) -> None:
    """Sleep `least_s`, then until `done()` — at most `most_s` in all, and never past the load's end."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(least_s, most_s)
    await asyncio.sleep(least_s)
    while not done() and not runner.done() and loop.time() < deadline:
        await asyncio.sleep(0.1)


def beside_cores() -> dict[str, Any]:
    """The eager recipe's env for blue/green beside the compiled one: its worker bound to the last core,
    the one `VLLM_CPU_OMP_THREADS_BIND=auto` leaves to the serving engine's API process (a worker bound
    to the serving engine's busy core is starved, so the controller only switches blue/green when the
    two engines' cores are disjoint: controller/supervisor/blue_green.py)."""
    last = max(0, (os.cpu_count() or 1) - 1)
    why = "blue/green beside the compiled engine, whose worker has the other cores"
    return {"vars": {"VLLM_CPU_OMP_THREADS_BIND": {"value": str(last), "why": why}}}


def beside_interpreter(directory: Path, python: str) -> dict[str, Any]:
    """The eager recipe's runtime section for blue/green beside the compiled one: its interpreter run
    under `taskset` on the core `beside_cores` gives its worker, so every process of the new engine
    starts there (affinity is inherited by the processes it spawns).

    Why: at `import torch`, every process of a starting engine pins itself to each core of its
    affinity mask in turn (cpuinfo reads each core's CPUID: `sched_setaffinity` to {0,1}, {0}, {1},
    then back, seen with strace). On this machine's kernel (6.18, a Firecracker VM) the pin to the core
    the serving engine's worker keeps busy under load can hang in the kernel (`affine_move_task` in
    /proc/PID/stack, state R, no CPU time for 10 minutes, until its affinity is changed from outside):
    the new engine makes no progress and the supervisor fails it as stalled. A process started on the
    last core only visits that core. Test and benchmark only: the product leaves affinity to vLLM."""
    last = max(0, (os.cpu_count() or 1) - 1)
    wrapper = directory / "python-on-last-core"
    wrapper.write_text(f'#!/bin/sh\nexec taskset -c {last} {shlex.quote(python)} "$@"\n')
    wrapper.chmod(0o755)
    return {"python": str(wrapper)}


# ------------------------------------------------------------------------------------------------
# The benchmark


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--cases", default="restart,apply,bluegreen,sigkill")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    from tests.integration.controller_harness import (
        ENGINE,
        Controller,
        engine_recipe,
        free_port,
        recipe_dirs,
        require_engine,
        serving,
    )

    require_engine()
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="hold-bench-"))
    home, recipes = recipe_dirs(base, "cpu-smollm2", "cpu-smollm2-eager")
    engine_port = free_port()
    (recipes / "bench-smollm2.yaml").write_text(engine_recipe("bench-smollm2", "cpu-smollm2", engine_port))
    (recipes / "bench-smollm2-eager.yaml").write_text(
        engine_recipe("bench-smollm2-eager", "cpu-smollm2-eager", engine_port, env=beside_cores(),
                      runtime=beside_interpreter(home, str(ENGINE.engine_python))))
    results: list[dict[str, Any]] = []
    with gateway_process(home, free_port(), free_port()) as gw:
        c = Controller(home, recipes, free_port(), engine_port, recipe="bench-smollm2",
                       extra_args=("--gateway-url", gw.control_url))
        with serving(c):
            c.wait_ready()

            async def ready_again(after: str) -> None:
                def changed() -> bool:
                    s = c.status()
                    return bool(s["state"] == "ready" and (s.get("launch") or {}).get("id") != after)
                await asyncio.to_thread(c.wait, changed, 900, "the engine to be ready again")

            async def restart() -> float | None:
                before = c.status()["launch"]["id"]
                await asyncio.to_thread(c.post, "/restart")
                await ready_again(before)
                return None

            paths: list[str] = []

            async def switch_and_back(blue_green: bool) -> None:
                for recipe in ("bench-smollm2-eager", "bench-smollm2"):
                    before = c.status()["launch"]["id"]
                    answer = await asyncio.to_thread(c.post, "/apply",
                                                     {"recipe": recipe, "blue_green": blue_green})
                    paths.append(f"{recipe}: {(answer.get('switch') or {}).get('path')}")
                    await ready_again(before)
                    if blue_green:  # the old engine drained and stopped: one engine again
                        await asyncio.to_thread(c.wait, lambda: c.status().get("blue_green") is None, 300,
                                                "the old engine to be stopped")

            async def apply_and_back() -> float | None:
                await switch_and_back(False)
                return None

            async def blue_green() -> float | None:
                await switch_and_back(True)
                return None

            async def sigkill() -> float | None:
                launch = c.status()["launch"]["id"]
                os.killpg(engine_pid(home, launch), signal.SIGKILL)
                kill_t = time.monotonic()
                await ready_again(launch)
                return kill_t

            cases: dict[str, Callable[[], Awaitable[float | None]]] = {
                "restart": restart, "apply": apply_and_back, "bluegreen": blue_green, "sigkill": sigkill}
            for name in args.cases.split(","):
                paths.clear()
                load = Load(gw.url, gw.key, clients=args.clients)
                t0, t1, kill_t = asyncio.run(across(load, cases[name]))
                row = summarise(name, load.requests, t0, t1, kill_t)
                row["gateway_hold"] = gw.hold_view()
                row["paths"] = list(paths)
                results.append(row)
                print(json.dumps(row), flush=True)
    print(f"\n{'case':<9} {'requests':>8} {'failed':>6} {'in flight at kill':>17} {'added p50':>9} "
          f"{'added p99':>9} {'longest':>8} {'switch':>7}")
    for r in results:
        print(f"{r['case']:<9} {r['requests']:>8} {r['failed']:>6} {r.get('in_flight_at_kill', '—')!s:>17} "
              f"{_s(r['added_p50_s']):>9} {_s(r['added_p99_s']):>9} {_s(r['longest_hold_s']):>8} "
              f"{_s(r['switch_s']):>7}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


def _s(v: float | None) -> str:
    return "—" if v is None else f"{v:.1f} s"


if __name__ == "__main__":
    _main()
