"""Process runtime vs Docker runtime for the same CPU recipe, in one run.

    .venv/bin/python bench/runtime_compare.py [--tokens 64] [--reps 5] [--runtimes process,docker]

For each runtime: the shipped recipe rendered exactly as the supervisor launches it
(`cpu-smollm2` with the process runtime, `cpu-smollm2-docker` in the `cpu-vllm` image — same model,
flags and environment), on a fresh compile-cache root (cold) and then again on the same root (warm),
started through the real runtime (`ProcessRuntime` / `DockerRuntime`, the controller's seam):

- ready seconds: from `runtime.start()` to the engine answering `GET /v1/models`;
- decode ms/token: (time of an N-token completion − time of a 1-token completion) / (N − 1), with
  `ignore_eos` so every request generates exactly its tokens (the small model stops at once
  otherwise), median over --reps, sequential requests (no batching), greedy;
- the warm-start proof from the engine's own log (`fx graph cache hit` lines).

Goal: the container costs ≤ 5 % on decode and ≤ 10 s on a warm start. Results go to
stdout as a table and to bench/results/runtime_compare-<time>.json. The model is
`${APPLIANCE_HOME}/models/smollm2-135m-instruct` (`appliance engine setup`), the image
appliance/cpu-vllm:0.32.0 (`bash scripts/build-images.sh`). Each engine is stopped by its PID /
container id; containers are removed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from appliance.recipe.recipe_loader import load_recipes  # noqa: E402
from bench import engine_cpu  # noqa: E402
from controller.runtime.base import EngineHandle, Runtime  # noqa: E402
from controller.runtime.registry import make_runtime  # noqa: E402
from controller.settings import paths, recipes_dir  # noqa: E402

RECIPES = {"process": "cpu-smollm2", "docker": "cpu-smollm2-docker"}
READY_LIVENESS_S = 1500.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(url: str, body: dict[str, Any], timeout: float = 300) -> dict[str, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        result: dict[str, Any] = json.loads(resp.read())
        return result


def _ready(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/v1/models", timeout=3) as resp:
            return bool(resp.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def _timed_completion(base: str, tokens: int) -> float:
    body = {"model": "smollm2", "prompt": "The history of the city of Paris", "max_tokens": tokens,
            "temperature": 0, "ignore_eos": True}
    t0 = time.perf_counter()
    out = _post(f"{base}/v1/completions", body)
    took = time.perf_counter() - t0
    got = out["usage"]["completion_tokens"]
    if got != tokens:
        raise RuntimeError(f"asked for {tokens} tokens, got {got}")
    return took


def decode_ms_per_token(base: str, tokens: int, reps: int) -> float:
    _timed_completion(base, tokens)  # warm the path once
    samples = []
    for _ in range(reps):
        one = _timed_completion(base, 1)
        many = _timed_completion(base, tokens)
        samples.append((many - one) / (tokens - 1) * 1000)
    return statistics.median(samples)


def run_one(kind: str, cache: Path, phase: str, tokens: int, reps: int, runs: Path) -> dict[str, Any]:
    recipe = load_recipes(recipes_dir())[RECIPES[kind]]
    port = _free_port()
    spec = engine_cpu.launch_spec(cache, port=port, recipe=recipe)
    rt: Runtime = make_runtime(spec.kind, runs)
    launch_id = f"bench-{kind}-{phase}-{uuid.uuid4().hex[:6]}"
    base = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    handle: EngineHandle = rt.start(spec, launch_id)
    try:
        while not _ready(base):
            info = rt.inspect(handle)
            if not info.running:
                text, _ = rt.read_logs(handle, 0)
                raise RuntimeError(f"{kind} engine exited ({info}) before ready:\n{text[-3000:]}")
            if time.monotonic() - t0 > READY_LIVENESS_S:
                raise RuntimeError(f"{kind} engine not ready after {READY_LIVENESS_S} s")
            time.sleep(0.5)
        ready_s = time.monotonic() - t0
        decode = decode_ms_per_token(base, tokens, reps)
        text, _ = rt.read_logs(handle, 0)
    finally:
        rt.stop(handle, 30)
        client = getattr(rt, "client", None)  # a container runtime: remove what it left
        if client is not None:
            client.containers.get(handle.ref).remove(force=True)
    hits = text.count("fx graph cache hit")
    misses = text.count("fx graph cache miss")
    row = {"runtime": kind, "phase": phase, "ready_s": round(ready_s, 1), "decode_ms_per_token":
           round(decode, 2), "fx_cache_hits": hits, "fx_cache_misses": misses}
    print(f"  {kind:8s} {phase:5s} ready {ready_s:7.1f} s   decode {decode:7.2f} ms/token   "
          f"fx graph cache hit/miss {hits}/{misses}", flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--runtimes", default="process,docker")
    ap.add_argument("--keep", action="store_true", help="Keep the compile caches (deleted by default).")
    ap.add_argument("--phases", default="cold,warm", help="cold,warm (default) or warm alone (with --seed).")
    ap.add_argument("--seed", type=Path, default=None,
                    help="Copy this compile-cache root into each runtime's root first (a warm-only run on a "
                    "busy machine); the log's fx graph cache hit/miss counts say whether it was warm.")
    args = ap.parse_args(argv)
    kinds = [k for k in args.runtimes.split(",") if k]
    # Under APPLIANCE_HOME: the docker runtime binds these paths into the engine container.
    work = Path(tempfile.mkdtemp(prefix="runtime-compare-", dir=paths().home))
    rows: list[dict[str, Any]] = []
    print(f"runtime_compare: {', '.join(RECIPES[k] for k in kinds)}; caches under {work}")
    for kind in kinds:
        cache = work / kind
        if args.seed is not None:
            shutil.copytree(args.seed, cache)
        for phase in args.phases.split(","):
            rows.append(run_one(kind, cache, phase, args.tokens, args.reps, work / "runs"))
    by = {(r["runtime"], r["phase"]): r for r in rows}
    summary: dict[str, Any] = {}
    if ("process", "warm") in by and ("docker", "warm") in by:
        p, d = by["process", "warm"], by["docker", "warm"]
        summary = {
            "decode_ratio_docker_over_process": round(d["decode_ms_per_token"] / p["decode_ms_per_token"], 3),
            "warm_ready_extra_s": round(d["ready_s"] - p["ready_s"], 1),
            "goal": "decode ratio ≤ 1.05, warm ready extra ≤ 10 s",
        }
        if ("process", "cold") in by and ("docker", "cold") in by:
            cold_d, cold_p = by["docker", "cold"]["ready_s"], by["process", "cold"]["ready_s"]
            summary["cold_ready_ratio"] = round(cold_d / cold_p, 3)
        print(f"docker/process decode {summary['decode_ratio_docker_over_process']:.3f}×, warm start "
              f"{summary['warm_ready_extra_s']:+.1f} s, cold start {summary.get('cold_ready_ratio', '-')}×")
    out = REPO / "bench" / "results" / f"runtime_compare-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "summary": summary, "tokens": args.tokens,
                               "reps": args.reps}, indent=2) + "\n")
    print(f"results: {out}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
