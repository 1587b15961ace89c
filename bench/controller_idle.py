"""The controller's host sampler idle beside a ready engine: CPU% of a core and RSS, old policy vs new.

The idle controller was measured at 7.9% of a core (goal < 1%, < 150 MB RSS), nearly all of it in
the once-a-second host sample reading /proc (`controller.watch.sample_policy` explains the policy).
This runs the real sampling loop (`controller.watch.sampler.run_sampler` with `HostSampler`, the
engine's pids found the way the process runtime finds them — psutil children — and every sample fed
to the Prometheus gauges and the launch's watermarks, as `HostWatchLink` does) in two child
processes side by side, one per policy, for the same N seconds, and prints what each cost:

    python bench/controller_idle.py [--seconds 30] [--engine-pid PID]

Without `--engine-pid` it starts a stand-in engine: a process tree shaped like vLLM's (API server,
EngineCore, TP workers) whose processes each hold thousands of separate mappings, so that
`smaps_rollup` costs the kernel a VMA walk as it does for a real worker. Each child imports
`controller.service` first, so its RSS is the controller's import set plus the sampler. CPU is the
child's own user+system time over the measured window (after a warm-up), as a percentage of one core.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import mmap
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]


# --- the stand-in engine ---------------------------------------------------------------------------


def _hold_mappings(count: int, resident_mb: int) -> None:
    """Map `count` one-page regions with alternating protections (adjacent VMAs with different
    flags never merge), touch the writable ones, fault in `resident_mb` of anonymous memory (the
    kernel walks those page tables for smaps_rollup), then sleep until killed."""
    big = mmap.mmap(-1, max(1, resident_mb) * 1024 * 1024)
    for off in range(0, len(big), mmap.PAGESIZE):
        big[off] = 1
    maps = [big]
    for i in range(count):
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if i % 2 == 0 else 0)
        m = mmap.mmap(-1, mmap.PAGESIZE, prot=prot)
        if i % 2 == 0:
            m[0] = 1
        maps.append(m)
    signal.pause()


def _engine(children: int, mappings: int, resident_mb: int) -> None:
    """The root (API server) holds mappings and forks the EngineCore and the workers."""
    for _ in range(children):
        if os.fork() == 0:
            _hold_mappings(mappings, resident_mb)
            os._exit(0)
    _hold_mappings(mappings, resident_mb)


# --- one policy's sampler loop, in its own process ---------------------------------------------------


def _measure(policy_name: str, root_pid: int, seconds: float, warmup: float) -> None:
    import controller.service  # noqa: F401  — the controller's import set, for a faithful RSS
    from controller.metrics import ControllerMetrics
    from controller.watch.sample_policy import ALWAYS, SamplingPolicy
    from controller.watch.sampler import HostSample, HostSampler, Watermarks, run_sampler

    metrics = ControllerMetrics()
    policy = ALWAYS if policy_name == "old" else SamplingPolicy()
    sampler = HostSampler(policy=policy)
    marks = Watermarks("bench")
    counts = {"samples": 0, "process_reads": 0}
    root = psutil.Process(root_pid)

    def engine_roots() -> list[int]:
        # What ProcessRuntime.engine_pids does: the shim's descendants.
        return [p.pid for p in root.children(recursive=True)] + [root_pid]

    def on_sample(sample: HostSample) -> None:
        metrics.observe_host(sample)
        marks.update(sample, None)
        metrics.observe_watermarks("bench", marks)
        counts["samples"] += 1
        counts["process_reads"] += sample.full_reason is not None

    async def main() -> dict[str, float]:
        stop = asyncio.Event()
        task = asyncio.create_task(run_sampler(sampler, on_sample, engine_roots=engine_roots,
                                               launch=lambda: ("bench", False), stop=stop))
        await asyncio.sleep(warmup)
        me = psutil.Process()
        t0, c0 = time.monotonic(), me.cpu_times()
        reads0 = counts["process_reads"]
        await asyncio.sleep(seconds)
        t1, c1 = time.monotonic(), me.cpu_times()
        stop.set()
        await task
        cpu = (c1.user - c0.user) + (c1.system - c0.system)
        return {
            "cpu_percent_of_core": 100.0 * cpu / (t1 - t0),
            "rss_mb": me.memory_info().rss / 1e6,
            "process_reads": counts["process_reads"] - reads0,
            "engine_processes": len(engine_roots()),
        }

    print(json.dumps(asyncio.run(main())))


# --- the driver --------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=30.0, help="measured window per policy (side by side)")
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--engine-pid", type=int, help="watch this running engine instead of a stand-in")
    ap.add_argument("--workers", type=int, default=5, help="stand-in: processes under the root")
    ap.add_argument("--mappings", type=int, default=3000, help="stand-in: mappings per process")
    ap.add_argument("--resident-mb", type=int, default=256,
                    help="stand-in: resident anonymous MB per process")
    ap.add_argument("--_child", nargs=2, metavar=("POLICY", "ROOT"), help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args._child:
        _measure(args._child[0], int(args._child[1]), args.seconds, args.warmup)
        return

    stand_in: int | None = None
    root = args.engine_pid
    if root is None:
        pid = os.fork()
        if pid == 0:
            os.setsid()
            _engine(args.workers, args.mappings, args.resident_mb)
            os._exit(0)
        stand_in = root = pid
        time.sleep(5.0)  # let it map and fault in its regions
    try:
        env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        procs = {name: subprocess.Popen(
            [sys.executable, __file__, "--seconds", str(args.seconds), "--warmup", str(args.warmup),
             "--_child", name, str(root)], stdout=subprocess.PIPE, text=True, env=env)
            for name in ("old", "new")}
        results = {}
        for name, proc in procs.items():
            out, _ = proc.communicate(timeout=args.seconds + args.warmup + 120)
            results[name] = json.loads(out.strip().splitlines()[-1])
    finally:
        if stand_in is not None:
            os.killpg(stand_in, signal.SIGKILL)
            os.waitpid(stand_in, 0)

    old, new = results["old"], results["new"]
    print(f"controller host sampler, idle beside a ready engine of {old['engine_processes']} processes, "
          f"{args.seconds:.0f} s side by side (cpu_count={os.cpu_count()})")
    print(f"{'policy':<44} {'CPU % of a core':>16} {'RSS MB':>8} {'process reads':>14}")
    print(f"{'old: everything every second':<44} {old['cpu_percent_of_core']:>16.2f} {old['rss_mb']:>8.1f} "
          f"{old['process_reads']:>14}")
    print(f"{'new: cheap every second, processes on need':<44} {new['cpu_percent_of_core']:>16.2f} "
          f"{new['rss_mb']:>8.1f} {new['process_reads']:>14}")
    print(f"goal (whole idle controller): < 1% of a core, < 150 MB RSS; load average now "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
