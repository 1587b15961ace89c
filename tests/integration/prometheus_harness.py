"""A real Prometheus (Debian's 2.42, scripts/setup-system.sh) for the integration tests.

Started on a free loopback port with a temporary data directory and a config written here (1 s
scrapes and rule evaluation: the tests wait on it, with bounded deadlines), stopped by its own PID.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

PROMETHEUS = shutil.which("prometheus")
T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def get_json(url: str, timeout: float = 10) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:  # 400 with a JSON error body for a bad query
        return json.loads(exc.read())


def static_jobs(targets: Mapping[str, str]) -> str:
    """scrape_configs entries, one static job per `job: host:port`."""
    return "\n".join(
        f"  - job_name: {job}\n    metrics_path: /metrics\n    static_configs:\n"
        f"      - targets: [\"{target}\"]"
        for job, target in targets.items()
    )


def until(what: str, probe: Callable[[], T | None], timeout_s: float, every_s: float = 0.5) -> T:
    """Poll `probe` until it returns something (not None), within a liveness bound."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = probe()
        if got is not None:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(every_s)


class Prometheus:
    """A real Prometheus on a loopback port with a temp data dir, stopped by its PID."""

    def __init__(self, workdir: Path, scrape_configs: str, rules: Path | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        workdir.mkdir(parents=True, exist_ok=True)
        config = workdir / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            + (f"rule_files:\n  - {rules}\n" if rules is not None else "")
            + f"scrape_configs:\n{scrape_configs}\n"
        )
        self.logpath = workdir / "prometheus.log"
        self.log = self.logpath.open("wb")
        assert PROMETHEUS is not None
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.logpath.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError("prometheus not ready in 60 s")

    def query(self, expr: str) -> dict[str, Any]:
        q = urllib.parse.urlencode({"query": expr})
        result: dict[str, Any] = get_json(f"{self.url}/api/v1/query?{q}")
        return result

    def series(self, expr: str) -> list[dict[str, Any]]:
        res = self.query(expr)
        assert res.get("status") == "success", (expr, res.get("error"))
        result: list[dict[str, Any]] = res["data"]["result"]
        return result

    def active_targets(self, job: str) -> list[dict[str, Any]]:
        data = get_json(f"{self.url}/api/v1/targets?state=active")
        return [t for t in data["data"]["activeTargets"] if t["labels"].get("job") == job]

    def wait_targets_up(self, jobs: set[str], timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            res = self.query("up == 1")
            if jobs <= {r["metric"]["job"] for r in res["data"]["result"]}:
                return
            time.sleep(0.5)
        raise AssertionError(f"targets not up: {self.query('up')}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # by the Popen handle: the process this object started
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()
