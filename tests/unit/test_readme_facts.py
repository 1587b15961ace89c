"""Facts the README states about the tree and these machines: the number of Grafana dashboards, and
the compose command that exists here (`docker-compose` 1.29; no `docker compose` plugin)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
DASHBOARDS = sorted((REPO / "monitoring" / "grafana" / "dashboards").glob("*.json"))
WORDS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}


def test_the_readme_counts_the_dashboards_there_are() -> None:
    said = re.findall(r"provisions (\w+) dashboards", README)
    assert said == [WORDS[len(DASHBOARDS)]], (said, [p.name for p in DASHBOARDS])
    listed = (REPO / "monitoring" / "README.md").read_text()
    row = next(line for line in listed.splitlines() if line.startswith("| `grafana/dashboards/`"))
    assert "evaluation" in row and "host memory" in row and "gateway" in row


def _section(title: str) -> str:
    start = README.index(f"## {title}")
    end = README.find("\n## ", start + 1)
    return README[start:end if end > 0 else None]


def test_the_container_commands_work_with_the_compose_these_machines_have() -> None:
    section = _section("Run it as containers")
    block = section[section.index("```bash"):section.index("```", section.index("```bash") + 3)]
    before = section[:section.index("```bash")]
    commands = [line for line in block.splitlines() if "compose " in line.split("#")[0]]
    assert commands, block
    for line in commands:  # the commands as typed run with docker-compose 1.29
        assert "docker-compose " in line and "docker compose " not in line.split("#")[0], line
    # ...and the other spelling is named before the commands, for hosts with the Compose v2 plugin.
    assert "`docker-compose`" in before and "`docker compose`" in before
