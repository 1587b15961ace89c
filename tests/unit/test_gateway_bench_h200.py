"""The gateway in front of the real vLLM engine on the lent H200 host
(``scripts/gpu_h200/gateway_bench.sh``, fixtures in ``tests/fixtures/gateway_bench/h200-2026-12-01``):
what the engine's own access log says of the requests the gateway's upstream client sent it, and the
figures ``bench/README.md`` quotes from that run."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "tests/fixtures/gateway_bench/h200-2026-12-01"
ACCESS = re.compile(rb'"(?P<method>[A-Z]+) (?P<path>\S+) HTTP/1\.1" (?P<status>\d{3})')


def _report(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RUN / name).read_text())
    return data


def _sent(report: dict[str, Any]) -> int:
    """Requests the benchmark sent through all arms: measured, warm-ups (every connection, or 8 with
    --cold-connections, per batch) and the soak."""
    args = report["args"]
    total = 0
    for cell in report["cells"]:
        warmup = min(cell["conc"], 8) if args["cold_connections"] else cell["conc"]
        total += cell["n"] + cell["errors"] + warmup * args["rounds"]
    return total + (args["soak"] if report["soak"] else 0)


def test_every_request_the_gateway_forwarded_reached_the_engine_once_and_got_200() -> None:
    steady, cold = _report("steady.json"), _report("cold.json")
    assert {c["arm"] for c in steady["cells"]} == {"direct", "gateway"}
    assert all(c["errors"] == 0 for c in steady["cells"] + cold["cells"])
    statuses: dict[bytes, int] = {}
    with gzip.open(RUN / "engine.log.gz") as log:
        for line in log:
            m = ACCESS.search(line)
            if m and m["path"] == b"/v1/chat/completions":
                statuses[m["status"]] = statuses.get(m["status"], 0) + 1
    # Each arm's requests, the gateway's included (written by its own upstream client), were parsed
    # and answered by vLLM's server: none refused, none lost, none sent twice.
    assert statuses == {b"200": _sent(steady) + _sent(cold)}


def _readme_rows() -> dict[tuple[str, int, str], list[str]]:
    text = (ROOT / "bench/README.md").read_text()
    start = text.index("### Figures in front of the real vLLM engine on the H200 host")
    section = text[start:text.index("\n### ", start + 10)]
    rows: dict[tuple[str, int, str], list[str]] = {}
    for line in section.splitlines():
        cols = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cols) == 13 and cols[1].isdigit():
            rows[(cols[0], int(cols[1]), cols[2])] = cols
    return rows


@pytest.mark.parametrize("name", ["steady.json", "cold.json"])
def test_the_readme_quotes_the_h200_run_as_measured(name: str) -> None:
    rows = _readme_rows()
    cold = name == "cold.json"
    for cell in _report(name)["cells"]:
        arm = cell["arm"] + (" (cold)" if cold else "")
        cols = rows[(cell["mode"], cell["conc"], arm)]
        assert cols[3] == str(cell["n"]) and cols[4] == str(cell["errors"])
        assert cols[6] == f"{cell['added_ttft_p50_ms']:.2f}"
        assert cols[11] == f"{cell['thr_ratio']:.3f}"
        if cell["arm"] != "direct":
            assert cols[12] == f"{cell['cpu_s_per_1k']:.2f}"
