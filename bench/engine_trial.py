"""A measuring harness for the CPU engine: start it, time it to ready, probe it, stop it by PID.

Used to produce the facts in docs/engine-cpu.md (cold vs warm start on one cache root) and the
fixture logs under tests/fixtures/engine_logs/. It is deliberately standalone (stdlib HTTP, no
supervisor) so that the measurement does not depend on the code being measured — but what it starts
is the default recipe rendered (`bench.engine_cpu.launch_spec`: argv and env exactly as the
supervisor would launch them, only the cache root and the port replaced), so the measurement is of
the shipped launch, not of a copy of it.

    python -m bench.engine_trial --cache /tmp/trial-x --log /tmp/trial-x/cold.log \
        [--env VLLM_USE_AOT_COMPILE=0 ...] [--metrics out.txt] [--port 18431]

Stopping follows DOMAIN.md §7: TERM the process, wait, then KILL whatever is left, always by PID
(the engine core runs as a child process, so its PID is collected before the parent goes).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from bench import engine_cpu


def _get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")


def _post_json(url: str, body: dict[str, object], timeout: float = 60.0) -> tuple[int, str]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")


def _children(pid: int) -> list[int]:
    """Direct and indirect children of `pid`, read from /proc (no psutil needed for a probe)."""
    kids: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        kids.setdefault(int(fields[1]), []).append(int(entry.name))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in kids.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def stop_by_pid(proc: subprocess.Popen[bytes], grace: float = 30.0) -> None:
    """TERM the engine, wait up to `grace` seconds, then KILL it and any child left behind."""
    family = _children(proc.pid)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 10
    for child in family:
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(child):
            os.kill(child, signal.SIGKILL)


def run_trial(
    cache: Path, log: Path, port: int, extra_env: dict[str, str], metrics_out: Path | None, budget: float
) -> dict[str, object]:
    spec = engine_cpu.launch_spec(cache, port=port)
    engine_cpu.prepare_cache_dirs(spec)
    env = {**os.environ, **spec.env, **extra_env}
    argv = list(spec.command())
    log.parent.mkdir(parents=True, exist_ok=True)
    pidfile = log.with_suffix(".pid")
    result: dict[str, object] = {"cache": str(cache), "log": str(log), "env": extra_env, "argv": argv}
    base = spec.base_url
    with log.open("wb") as fh:
        started = time.monotonic()
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL)
        pidfile.write_text(f"{proc.pid}\n")
        try:
            health_first_503: float | None = None
            ready: float | None = None
            while time.monotonic() - started < budget:
                if proc.poll() is not None:
                    result["exit_code"] = proc.returncode
                    break
                try:
                    code, _ = _get(f"{base}/health", timeout=2)
                except (urllib.error.URLError, OSError):
                    code = 0
                if code and code != 200 and health_first_503 is None:
                    health_first_503 = time.monotonic() - started
                    result["health_before_ready"] = code
                if code == 200:
                    ready = time.monotonic() - started
                    break
                time.sleep(0.5)
            result["ready_seconds"] = round(ready, 1) if ready is not None else None
            if ready is not None:
                code, body = _get(f"{base}/v1/models")
                result["models_status"] = code
                result["models_body"] = json.loads(body) if code == 200 else body
                t0 = time.monotonic()
                code, body = _post_json(
                    f"{base}/v1/chat/completions",
                    {
                        "model": spec.served_model_name,
                        "messages": [{"role": "user", "content": "What is the capital of France?"}],
                        "temperature": 0,
                        "max_tokens": 20,
                    },
                )
                result["chat_seconds"] = round(time.monotonic() - t0, 2)
                result["chat_status"] = code
                if code == 200:
                    result["chat_text"] = json.loads(body)["choices"][0]["message"]["content"]
                if metrics_out is not None:
                    code, body = _get(f"{base}/metrics")
                    metrics_out.write_text(body)
                    result["metrics_status"] = code
                result["pids"] = [proc.pid, *_children(proc.pid)]
        finally:
            stop_by_pid(proc)
            pidfile.unlink(missing_ok=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Start the CPU engine once, time it, probe it, stop it.")
    parser.add_argument("--cache", type=Path, required=True, help="per-trial cache root")
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--port", type=int, default=18431)
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE added to the engine env")
    parser.add_argument("--metrics", type=Path, help="save /metrics text here once ready")
    parser.add_argument("--budget", type=float, default=600.0, help="seconds to wait for /health")
    args = parser.parse_args(argv)
    extra = dict(item.split("=", 1) for item in args.env)
    result = run_trial(args.cache, args.log, args.port, extra, args.metrics, args.budget)
    print(json.dumps(result, indent=2))
    return 0 if result.get("ready_seconds") is not None else 1


if __name__ == "__main__":
    sys.exit(main())
