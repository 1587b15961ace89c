"""Gateway overhead benchmark: direct vs this gateway vs nginx vs LiteLLM, arms interleaved.

    .venv/bin/python bench/gateway_bench.py --quick          # smoke test, < 2 min
    .venv/bin/python bench/gateway_bench.py                  # full: conc 1, 8, 32, 64 × stream/plain
    .venv/bin/python bench/gateway_bench.py --engine         # against the real CPU vLLM engine
    .venv/bin/python bench/gateway_bench.py --baseline 1107e9d --arms direct,gateway,nginx \
        --conc 1,64                                          # this tree vs an older commit, one run

Upstream: the synthetic vLLM-shaped SSE server (``synthetic_upstream.py``, its own process) or the
real CPU engine. Arms, each its own process(es) started here and stopped by PID: ``direct`` (no
proxy), ``gateway`` (``appliance gateway``, key checked, model aliased as in production),
``gateway@REV`` (with ``--baseline REV``: the same from a git worktree of an older commit, to
measure a change in one interleaved run), ``nginx`` (Debian's, ``proxy_buffering
off``, a temporary config on loopback), ``litellm`` (its proxy from ``bench/.venv-litellm``, one
worker, no database). For every (mode, concurrency) cell the arms run one after another in a
rotating order, for ``--rounds`` rounds, so a background load burst hits every arm alike.

Reported per cell and arm: TTFT p50/p99 and the added TTFT vs direct, the added inter-chunk gap
p50/p99 (client-side gaps between body chunks), throughput ratio arm/direct, CPU seconds per
1,000 requests of the arm's processes (psutil), errors; then RSS before/after a bounded soak.
Nothing here asserts a timing: it prints figures (and writes JSON to bench/results/).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from time import perf_counter
from typing import Any

import aiohttp
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from controller.gateway.keystore import KeyStore  # noqa: E402
from controller.settings import paths  # noqa: E402

LITELLM_VENV = ROOT / "bench" / ".venv-litellm"
LITELLM_MASTER = "sk-bench-litellm-master"
ENGINE_MODEL_DIR = paths().models / "smollm2-135m-instruct"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


# ---------------------------------------------------------------- processes


class Proc:
    """A process we started (in its own session), stopped by its PID / process group id."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        log: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.log_path = log
        self._log = log.open("wb")
        self.popen = subprocess.Popen(
            argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            # No DATABASE_URL: LiteLLM would try to use it; every arm runs without a database.
            env={k: v for k, v in {**os.environ, **(env or {})}.items() if k != "DATABASE_URL"},
            start_new_session=True,
        )
        self.ps = psutil.Process(self.popen.pid)

    def tree(self) -> list[psutil.Process]:
        try:
            return [self.ps, *self.ps.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def cpu_s(self) -> float:
        total = 0.0
        for p in self.tree():
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                pass
        return total

    def rss(self) -> int:
        total = 0
        for p in self.tree():
            with contextlib.suppress(psutil.NoSuchProcess):
                total += p.memory_info().rss
        return total

    def stop(self) -> None:
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGTERM)
                self.popen.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)
            except ProcessLookupError:
                pass
        self._log.close()

    def tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-2000:]


async def wait_http(
    url: str, proc: Proc | None, budget_s: float, headers: dict[str, str] | None = None
) -> None:
    deadline = time.monotonic() + budget_s
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            if proc is not None and proc.popen.poll() is not None:
                raise RuntimeError(f"{proc.name} exited ({proc.popen.returncode}):\n{proc.tail()}")
            try:
                async with s.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=2)) as r:
                    if r.status < 500:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.25)
    raise RuntimeError(f"{url} not ready within {budget_s} s" + (f":\n{proc.tail()}" if proc else ""))


@dataclass
class Arm:
    name: str
    base: str  # base URL clients use
    headers: dict[str, str]
    proc: Proc | None  # None for direct

    def cpu_s(self) -> float:
        return self.proc.cpu_s() if self.proc else float("nan")


NGINX_CONF = """
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    upstream engine {{ server {upstream}; keepalive 256; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://engine;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 600s;
        }}
    }}
}}
"""

LITELLM_CONF = """
model_list:
  - model_name: {model}
    litellm_params:
      model: openai/{model}
      api_base: {upstream}/v1
      api_key: none
general_settings:
  master_key: {master}
litellm_settings:
  telemetry: false
  drop_params: true
"""


async def start_arms(names: list[str], upstream_url: str, model: str, work: Path) -> list[Arm]:
    arms: list[Arm] = []
    hostport = upstream_url.split("://", 1)[1]
    for name in names:
        if name == "direct":
            arms.append(Arm("direct", upstream_url, {}, None))
        elif name == "gateway" or name.startswith("gateway@"):
            tree = ROOT
            slug = "".join(c if c.isalnum() or c in "._-" else "-" for c in name)  # a file name
            if name.startswith("gateway@") and Path(name[8:]).is_dir():
                # A tree exported beforehand (``git archive``): where there is no git history, as on
                # the device machine, which gets a copy of the working tree only.
                tree = Path(name[8:]).resolve()
            elif name.startswith("gateway@"):
                tree = work / name.replace("@", "-")
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree), name[8:]],
                    check=True,
                )
            store = KeyStore(work / f"keys-{slug}.db")
            # Token quotas far above what a run spends: the quota check and charge run on every
            # request (the usage path on, as in production), and never refuse.
            _, key = store.create("bench", tpm_limit=10**9, tpd_limit=10**10)
            port = free_port()
            proc = Proc(
                name,
                [
                    sys.executable,
                    "-m",
                    "controller.cli.main",
                    "gateway",
                    "--upstream",
                    upstream_url,
                    # As in production (the controller always sets it): JSON bodies are inspected
                    # for the model name; the benchmark's clients send the served name.
                    "--served-model",
                    model,
                    "--listen",
                    f"127.0.0.1:{port}",
                    "--keys",
                    str(store.path),
                    # This tree's gateway would take port + 1 for its control listener, which may be
                    # taken on a busy host; the bench needs none. Older trees know no such flag.
                    *(["--control-listen", "off"] if tree == ROOT else []),
                ],
                work / f"{slug}.log",
                # This tree's (or the baseline's) code first, then whatever the caller had.
                env={"PYTHONPATH": os.pathsep.join(filter(None, (str(tree), os.environ.get("PYTHONPATH"))))},
                cwd=tree,
            )
            await wait_http(f"http://127.0.0.1:{port}/healthz", proc, 30)
            arms.append(Arm(name, f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {key}"}, proc))
        elif name == "nginx":
            nginx = shutil.which("nginx") or "/usr/sbin/nginx"
            if not Path(nginx).exists():
                print("nginx arm skipped: nginx not installed (apt-get install nginx)", flush=True)
                continue
            d = work / "nginx"
            d.mkdir()
            port = free_port()
            (d / "nginx.conf").write_text(NGINX_CONF.format(dir=d, upstream=hostport, port=port))
            proc = Proc(
                "nginx",
                [
                    nginx,
                    "-p",
                    str(d),
                    "-e",
                    str(d / "error.log"),
                    "-c",
                    str(d / "nginx.conf"),
                    "-g",
                    "daemon off;",
                ],
                work / "nginx.log",
            )
            await wait_http(f"http://127.0.0.1:{port}/v1/models", proc, 15)
            arms.append(Arm("nginx", f"http://127.0.0.1:{port}", {}, proc))
        elif name == "litellm":
            exe = LITELLM_VENV / "bin" / "litellm"
            if not exe.exists():
                print(
                    f"litellm arm skipped: {exe} missing. Install with: python3.11 -m venv {LITELLM_VENV} "
                    f"&& {LITELLM_VENV}/bin/pip install 'litellm[proxy]==1.106.12'",
                    flush=True,
                )
                continue
            port = free_port()
            cfg = work / "litellm.yaml"
            cfg.write_text(LITELLM_CONF.format(model=model, upstream=upstream_url, master=LITELLM_MASTER))
            env = {
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                "LITELLM_LOG": "ERROR",
                "LITELLM_TELEMETRY": "False",
                "DISABLE_SCHEMA_UPDATE": "True",
                "NO_DOCS": "True",
            }
            proc = Proc(
                "litellm",
                [
                    str(exe),
                    "--config",
                    str(cfg),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--num_workers",
                    "1",
                ],
                work / "litellm.log",
                env=env,
            )
            headers = {"Authorization": f"Bearer {LITELLM_MASTER}"}
            await wait_http(f"http://127.0.0.1:{port}/health/liveliness", proc, 180, headers)
            arms.append(Arm("litellm", f"http://127.0.0.1:{port}", headers, proc))
        else:
            raise SystemExit(f"unknown arm {name!r}")
    return arms


# ---------------------------------------------------------------- load


@dataclass
class Sample:
    ttft: float
    e2e: float
    gaps: list[float]
    chunks: int


@dataclass
class Batch:
    samples: list[Sample] = field(default_factory=list)
    errors: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0


async def one_request(
    s: aiohttp.ClientSession, url: str, headers: dict[str, str], body: bytes
) -> Sample | None:
    t0 = perf_counter()
    first = last = 0.0
    gaps: list[float] = []
    chunks = 0
    try:
        async with s.post(url, data=body, headers=headers) as r:
            async for _ in r.content.iter_any():
                now = perf_counter()
                if chunks == 0:
                    first = now
                else:
                    gaps.append(now - last)
                last = now
                chunks += 1
            if r.status != 200 or chunks == 0:
                return None
    except (aiohttp.ClientError, TimeoutError):
        return None
    return Sample(ttft=first - t0, e2e=perf_counter() - t0, gaps=gaps, chunks=chunks)


async def run_batch(arm: Arm, body: bytes, n: int, conc: int, warmup: int = 0) -> Batch:
    url = arm.base + "/v1/chat/completions"
    headers = {**arm.headers, "Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=300)
    out = Batch()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as s:
        if warmup:
            await asyncio.gather(*(one_request(s, url, headers, body) for _ in range(warmup)))
        left = n

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                sample = await one_request(s, url, headers, body)
                if sample is None:
                    out.errors += 1
                else:
                    out.samples.append(sample)

        cpu0 = arm.cpu_s()
        t0 = perf_counter()
        await asyncio.gather(*(worker() for _ in range(conc)))
        out.wall_s = perf_counter() - t0
        out.cpu_s = arm.cpu_s() - cpu0
    return out


@dataclass
class Cell:
    mode: str
    conc: int
    arm: str
    n: int
    errors: int
    ttft_p50_ms: float
    ttft_p99_ms: float
    gap_p50_ms: float
    gap_p99_ms: float
    rps: float
    cpu_s_per_1k: float
    added_ttft_p50_ms: float = float("nan")
    added_ttft_p99_ms: float = float("nan")
    added_gap_p50_ms: float = float("nan")
    added_gap_p99_ms: float = float("nan")
    thr_ratio: float = float("nan")


def summarize(mode: str, conc: int, arm: str, batches: list[Batch]) -> Cell:
    samples = [x for b in batches for x in b.samples]
    ttfts = [x.ttft * 1000 for x in samples]
    gaps = [g * 1000 for x in samples for g in x.gaps]
    n = len(samples)
    wall = sum(b.wall_s for b in batches)
    cpu = sum(b.cpu_s for b in batches)
    return Cell(
        mode=mode,
        conc=conc,
        arm=arm,
        n=n,
        errors=sum(b.errors for b in batches),
        ttft_p50_ms=pct(ttfts, 50),
        ttft_p99_ms=pct(ttfts, 99),
        gap_p50_ms=pct(gaps, 50),
        gap_p99_ms=pct(gaps, 99),
        rps=n / wall if wall else float("nan"),
        cpu_s_per_1k=cpu / n * 1000 if n else float("nan"),
    )


def request_body(model: str, stream: bool, engine: bool, max_tokens: int) -> bytes:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": "Tell me about Paris."}],
        "stream": stream,
    }
    if engine:
        body.update(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return json.dumps(body).encode()


# ---------------------------------------------------------------- report


def fmt(x: float, nd: int = 2) -> str:
    return "—" if x != x else f"{x:.{nd}f}"  # NaN → dash


def table(cells: list[Cell]) -> str:
    head = (
        "| mode | conc | arm | n | err | TTFT p50 ms | +TTFT p50 | +TTFT p99 | +gap p50 | +gap p99 "
        "| req/s | ratio | CPU s/1k req |"
    )
    lines = [head, "|" + "---|" * 13]
    for c in cells:
        lines.append(
            f"| {c.mode} | {c.conc} | {c.arm} | {c.n} | {c.errors} | {fmt(c.ttft_p50_ms)} "
            f"| {fmt(c.added_ttft_p50_ms)} | {fmt(c.added_ttft_p99_ms)} | {fmt(c.added_gap_p50_ms)} "
            f"| {fmt(c.added_gap_p99_ms)} | {fmt(c.rps, 1)} | {fmt(c.thr_ratio, 3)} "
            f"| {fmt(c.cpu_s_per_1k, 2)} |"
        )
    return "\n".join(lines)


def goals(cells: list[Cell]) -> list[str]:
    out = []
    by = {(c.mode, c.conc, c.arm): c for c in cells}
    gateways = sorted({c.arm for c in cells if c.arm == "gateway" or c.arm.startswith("gateway@")})
    for mode in ("stream", "plain"):
        for arm in gateways:
            g1 = by.get((mode, 1, arm))
            if g1:
                out.append(
                    f"{mode} conc 1: {arm} added TTFT p50 {fmt(g1.added_ttft_p50_ms)} ms (goal ≤ 1), "
                    f"p99 {fmt(g1.added_ttft_p99_ms)} ms (goal ≤ 3); CPU {fmt(g1.cpu_s_per_1k)} s/1k req"
                )
            g64 = by.get((mode, 64, arm))
            if g64:
                out.append(
                    f"{mode} conc 64: {arm} throughput {fmt(g64.thr_ratio, 3)}× direct (goal ≥ 0.95); "
                    f"CPU {fmt(g64.cpu_s_per_1k)} s/1k req"
                )
    worse = []
    for c in cells:
        lite = by.get((c.mode, c.conc, "litellm"))
        if (
            c.arm == "gateway"
            and lite
            and not (
                c.added_ttft_p50_ms < lite.added_ttft_p50_ms
                and c.thr_ratio >= lite.thr_ratio
                and c.cpu_s_per_1k < lite.cpu_s_per_1k
            )
        ):
            worse.append(f"{c.mode}/{c.conc}")
    if any(c.arm == "litellm" for c in cells):
        out.append(
            "below LiteLLM's overhead (TTFT p50, throughput, CPU) at every point: "
            + ("yes" if not worse else f"NO at {', '.join(worse)}")
        )
    return out


# ---------------------------------------------------------------- main


async def main_async(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    procs: list[Proc] = []
    arms: list[Arm] = []
    try:
        if args.engine:
            model = "smollm2"
            port = free_port()
            py = paths().engine_python
            if not py.exists():
                raise SystemExit(f"--engine: engine env absent ({py}); run `appliance engine setup`")
            up = Proc(
                "engine",
                [
                    str(py),
                    "-m",
                    "vllm.entrypoints.openai.api_server",
                    "--model",
                    str(ENGINE_MODEL_DIR),
                    "--served-model-name",
                    model,
                    "--max-model-len",
                    "2048",
                    "--dtype",
                    "bfloat16",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                ],
                work / "engine.log",
                env={"VLLM_CPU_KVCACHE_SPACE": "1"},
            )
            procs.append(up)
            upstream_url = f"http://127.0.0.1:{port}"
            print(f"starting the CPU engine on {upstream_url} (cold start ~90 s)…", flush=True)
            await wait_http(upstream_url + "/health", up, 900)
        elif args.upstream_url:
            upstream_url, model = args.upstream_url.rstrip("/"), args.model
        else:
            model = "synthetic"
            port = free_port()
            up = Proc(
                "upstream",
                [
                    sys.executable,
                    str(ROOT / "bench" / "synthetic_upstream.py"),
                    "--port",
                    str(port),
                    "--ttft-ms",
                    str(args.ttft_ms),
                    "--chunks",
                    str(args.chunks),
                    "--interval-ms",
                    str(args.interval_ms),
                    "--served-model",
                    model,
                ],
                work / "upstream.log",
            )
            procs.append(up)
            upstream_url = f"http://127.0.0.1:{port}"
            await wait_http(upstream_url + "/v1/models", up, 15)
        arms = await start_arms(args.arms, upstream_url, model, work)
        procs.extend(a.proc for a in arms if a.proc)
        names = [a.name for a in arms]
        print(f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
        print(
            f"upstream {upstream_url}; arms {names}; shape ttft {args.ttft_ms} ms, {args.chunks} chunks "
            f"every {args.interval_ms} ms; rounds {args.rounds}",
            flush=True,
        )

        cells: list[Cell] = []
        rng = random.Random(0)
        for mode in args.modes:
            body = request_body(
                model, mode == "stream", bool(args.engine or args.upstream_url), args.max_tokens
            )
            for conc in args.conc:
                n = max(args.min_requests, conc * args.waves)
                per_arm: dict[str, list[Batch]] = {a.name: [] for a in arms}
                order = arms[:]
                for rnd in range(args.rounds):
                    # ABBA: a fresh shuffle, then its reverse, so that no arm always follows the same
                    # one (a proxy's tail work, e.g. closing its pooled upstream connections, lands
                    # in the next batch; a fixed successor would carry it every round).
                    if rnd % 2 == 0:
                        rng.shuffle(order)
                    else:
                        order.reverse()
                    for arm in order:
                        # Steady state by default: the warm-up opens every connection the batch uses
                        # (client → arm, and the arm's own pooled upstream connections). With
                        # --cold-connections most of them are opened inside the measured batch.
                        warmup = min(conc, 8) if args.cold_connections else conc
                        per_arm[arm.name].append(await run_batch(arm, body, n, conc, warmup=warmup))
                        await asyncio.sleep(args.settle_s)
                row = [summarize(mode, conc, a.name, per_arm[a.name]) for a in arms]
                direct = next((c for c in row if c.arm == "direct"), None)
                for c in row:
                    if direct is not None:
                        c.added_ttft_p50_ms = c.ttft_p50_ms - direct.ttft_p50_ms
                        c.added_ttft_p99_ms = c.ttft_p99_ms - direct.ttft_p99_ms
                        c.added_gap_p50_ms = c.gap_p50_ms - direct.gap_p50_ms
                        c.added_gap_p99_ms = c.gap_p99_ms - direct.gap_p99_ms
                        c.thr_ratio = c.rps / direct.rps
                cells.extend(row)
                print(table(row).split("\n", 2)[2], flush=True)

        soak: dict[str, dict[str, float]] = {}
        body = request_body(model, True, bool(args.engine or args.upstream_url), args.max_tokens)
        for arm in arms:
            if arm.proc is None:
                continue
            before = arm.proc.rss()
            await run_batch(arm, body, args.soak, 32)
            after = arm.proc.rss()
            soak[arm.name] = {"rss_before_mib": before / 2**20, "rss_after_mib": after / 2**20}

        print("\n## Results\n")
        print(table(cells))
        print(
            "\nRSS of the arm's processes before/after a soak of "
            f"{args.soak} streaming requests at concurrency 32:\n"
        )
        print("| arm | RSS before MiB | RSS after MiB |\n|---|---|---|")
        for name, r in soak.items():
            print(f"| {name} | {r['rss_before_mib']:.1f} | {r['rss_after_mib']:.1f} |")
        print("\nGoals (reported, not asserted):")
        for line in goals(cells):
            print(" - " + line)
        results = ROOT / "bench" / "results"
        results.mkdir(exist_ok=True)
        out = results / f"gateway-{time.strftime('%Y%m%d-%H%M%S')}.json"
        out.write_text(
            json.dumps(
                {
                    "args": vars(args),
                    "upstream": upstream_url,
                    "cells": [asdict(c) for c in cells],
                    "soak": soak,
                    "cpu_count": os.cpu_count(),
                },
                indent=1,
            )
        )
        print(f"\nJSON: {out}")
        print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        return 0
    finally:
        for p in reversed(procs):
            p.stop()
        for tree in work.glob("gateway-*"):
            if tree.is_dir():
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False
                )
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: conc 1 and 8, few requests, < 2 min")
    p.add_argument("--arms", default="direct,gateway,nginx,litellm")
    p.add_argument(
        "--baseline",
        metavar="REV",
        help="add an arm gateway@REV: the gateway of an older commit (a git worktree; or REV is a "
        "directory holding an exported tree), interleaved",
    )
    p.add_argument("--conc", default="1,8,32,64")
    p.add_argument("--modes", default="stream,plain")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds per cell")
    p.add_argument(
        "--waves", type=int, default=8, help="requests per batch = max(min-requests, conc × waves)"
    )
    p.add_argument("--min-requests", type=int, default=60)
    p.add_argument("--settle-s", type=float, default=0.5, help="pause after each batch")
    p.add_argument(
        "--cold-connections",
        action="store_true",
        help="warm up with 8 requests only: the batch's first wave opens the other connections "
        "(client → arm and arm → upstream) while it is measured",
    )
    p.add_argument("--soak", type=int, default=2000, help="streaming requests in the RSS soak")
    p.add_argument("--ttft-ms", type=float, default=20.0)
    p.add_argument("--chunks", type=int, default=32)
    p.add_argument("--interval-ms", type=float, default=5.0)
    p.add_argument("--engine", action="store_true", help="start the real CPU engine as the upstream")
    p.add_argument("--upstream-url", help="use an already running OpenAI-compatible upstream")
    p.add_argument("--model", default="smollm2", help="model name with --upstream-url")
    p.add_argument("--max-tokens", type=int, default=32, help="engine requests: tokens to generate")
    args = p.parse_args()
    if args.quick:
        args.conc, args.rounds, args.min_requests, args.waves, args.soak = "1,8", 1, 30, 4, 300
        if args.arms == p.get_default("arms"):
            args.arms = "direct,gateway,nginx"
    args.arms = [a for a in args.arms.split(",") if a]
    if args.baseline:
        args.arms.append(f"gateway@{args.baseline}")
    args.conc = [int(c) for c in args.conc.split(",")]
    args.modes = [m for m in args.modes.split(",") if m]
    try:
        import uvloop

        rc = uvloop.run(main_async(args))
    except ImportError:
        rc = asyncio.run(main_async(args))
    raise SystemExit(rc)


if __name__ == "__main__":
    main()
