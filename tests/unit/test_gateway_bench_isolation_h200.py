"""The gateway's own upstream client against aiohttp's, isolated on the H200 host's 16 quiet cores
(``scripts/gpu_h200/client_isolation.sh``, 2026-12-02, fixtures in
``tests/fixtures/gateway_bench/h200-isolation-2026-12-02``): ``bench/README.md`` quotes the run as
measured, and the decision it states (the own client's CPU per request lower in every cell) is what
the JSON says. A README edit that drifts from the fixture fails here."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "tests/fixtures/gateway_bench/h200-isolation-2026-12-02"
HEADING = "### The own upstream client against aiohttp, isolated on the H200 host"
# The JSON names the aiohttp arm by where its exported tree lay on the device host.
AIOHTTP = "gateway@/work/main/.benchbase"
NAMES = {"direct": "direct", "gateway": "gateway (own client)", "nginx": "nginx",
         AIOHTTP: "gateway (aiohttp)"}
CELLS = [("plain", 1), ("plain", 64), ("stream", 1), ("stream", 64)]


def _report() -> dict[str, Any]:
    (path,) = RUN.glob("gateway-*.json")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _cells() -> dict[tuple[str, int, str], dict[str, Any]]:
    return {(c["mode"], c["conc"], c["arm"]): c for c in _report()["cells"]}


def _section() -> str:
    text = (ROOT / "bench/README.md").read_text()
    start = text.index(HEADING)
    return text[start:text.index("\n### ", start + 10)]


def _rows(width: int) -> list[list[str]]:
    rows = []
    for line in _section().splitlines():
        cols = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cols) == width and cols[1].isdigit():
            rows.append(cols)
    return rows


def _f(x: float, digits: int = 2) -> str:
    return "—" if math.isnan(x) else f"{x:.{digits}f}"


def test_the_run_is_the_one_described() -> None:
    report = _report()
    args = report["args"]
    assert args["arms"] == ["direct", "gateway", "nginx", AIOHTTP] and args["rounds"] == 2
    assert (args["conc"], args["modes"], args["soak"]) == ([1, 64], ["plain", "stream"], 300)
    assert not args["engine"] and report["cpu_count"] == 16  # synthetic upstream, the 16 cores
    assert all(c["errors"] == 0 for c in report["cells"])
    host = (RUN / "host.txt").read_text()
    assert "nginx/1.22.1" in host and "aiohttp 3.14.3 httptools 0.9.0" in host and "bench rc 0" in host


def test_the_readme_table_quotes_every_cell_as_measured() -> None:
    rows = {(r[0], int(r[1]), r[2]): r for r in _rows(13)}
    cells = _cells()
    assert set(rows) == {(m, n, NAMES[a]) for (m, n, a) in cells}
    for (mode, conc, arm), cell in cells.items():
        cols = rows[(mode, conc, NAMES[arm])]
        assert cols[3] == str(cell["n"]) and cols[4] == str(cell["errors"])
        assert cols[5] == _f(cell["ttft_p50_ms"])
        assert cols[6] == _f(cell["added_ttft_p50_ms"]) and cols[7] == _f(cell["added_ttft_p99_ms"])
        assert cols[8] == _f(cell["added_gap_p50_ms"]) and cols[9] == _f(cell["added_gap_p99_ms"])
        assert cols[10] == f"{cell['rps']:.1f}" and cols[11] == f"{cell['thr_ratio']:.3f}"
        assert cols[12] == ("—" if arm == "direct" else _f(cell["cpu_s_per_1k"]))


def test_the_gain_table_quotes_own_client_aiohttp_and_nginx_as_measured() -> None:
    rows = {(r[0], int(r[1])): r for r in _rows(11)}
    assert sorted(rows) == sorted(CELLS)
    cells = _cells()
    for mode, conc in CELLS:
        own, aio, ngx = (cells[(mode, conc, arm)] for arm in ("gateway", AIOHTTP, "nginx"))
        assert rows[(mode, conc)][2:] == [
            _f(own["cpu_s_per_1k"]), _f(aio["cpu_s_per_1k"]), _f(ngx["cpu_s_per_1k"]),
            _f(own["added_ttft_p50_ms"]), _f(aio["added_ttft_p50_ms"]),
            _f(own["added_ttft_p99_ms"]), _f(aio["added_ttft_p99_ms"]),
            _f(own["thr_ratio"], 3), _f(aio["thr_ratio"], 3)]


def _prose() -> str:
    """The section's text with line wrapping undone, for the phrases quoted in its sentences."""
    return " ".join(_section().split())


@pytest.mark.parametrize(("mode", "conc", "where"), [
    ("plain", 64, "plain at 64 clients"), ("stream", 64, "streaming at 64"),
    ("plain", 1, "plain at 1"), ("stream", 1, "streaming at 1"),
])
def test_the_decision_quotes_each_cells_cpu_and_it_is_lower_for_the_own_client(
        mode: str, conc: int, where: str) -> None:
    cells = _cells()
    own, aio = cells[(mode, conc, "gateway")]["cpu_s_per_1k"], cells[(mode, conc, AIOHTTP)]["cpu_s_per_1k"]
    assert own < aio  # the direction the decision rests on, in every cell
    assert f"{_f(own)} vs {_f(aio)} ms {where}" in _prose()


def test_the_decisions_other_claims_are_what_the_json_says() -> None:
    cells, section = _cells(), _prose()
    own, aio = cells[("stream", 64, "gateway")], cells[("stream", 64, AIOHTTP)]
    assert (f"streaming throughput at 64 is {own['thr_ratio']:.3f}× direct against aiohttp's "
            f"{aio['thr_ratio']:.3f}×") in section
    lower = sum(cells[(m, n, "gateway")]["cpu_s_per_1k"] < cells[(m, n, AIOHTTP)]["cpu_s_per_1k"]
                for m, n in CELLS)
    assert lower == 4 and "consistent in 4/4 CPU cells" in section
    assert "one run of 2 rounds" in section and _report()["args"]["rounds"] == 2
    # The added-TTFT sentence: "lower in three cells of four" for the p50 and for the p99.
    for key in ("added_ttft_p50_ms", "added_ttft_p99_ms"):
        assert sum(cells[(m, n, "gateway")][key] < cells[(m, n, AIOHTTP)][key] for m, n in CELLS) == 3
    assert "p50 is lower in three cells of four" in section and "its p99 lower in three" in section
