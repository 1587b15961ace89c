"""constraints.txt: the versions the appliance is built and tested with, and where they are used.

An unbounded dependency (starlette, fastapi, pydantic, aiohttp, uvloop, ...) would move under the
gateway on the next install; with every package pinned, an upgrade is a commit that changes a pin and
runs these tests (and test_gateway_protocol_pins.py for the uvicorn internals the gateway touches).
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = canonicalize_name(PYPROJECT["project"]["name"])


def pins() -> dict[str, str]:
    """constraints.txt as {canonical name: version}; every line a comment or `name==version`."""
    out: dict[str, str] = {}
    for number, raw in enumerate((ROOT / "constraints.txt").read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        req = Requirement(line)
        specs = list(req.specifier)
        assert len(specs) == 1 and specs[0].operator == "==" and not req.extras and req.marker is None, (
            f"constraints.txt:{number}: {line!r} is not a plain `name==version` pin")
        name = canonicalize_name(req.name)
        assert name not in out, f"constraints.txt:{number}: {req.name} pinned twice"
        assert name != PROJECT, "the project itself is not a constraint (pip freeze --exclude-editable)"
        out[name] = specs[0].version
    return out


def named_in_pyproject() -> list[Requirement]:
    """The runtime dependencies and the dev extra (what scripts/setup.sh installs)."""
    project = PYPROJECT["project"]
    return [Requirement(r) for r in [*project["dependencies"], *project["optional-dependencies"]["dev"]]]


def test_every_dependency_named_in_pyproject_is_pinned_inside_its_range() -> None:
    pinned = pins()
    for req in named_in_pyproject():
        name = canonicalize_name(req.name)
        assert name in pinned, f"{req.name} (pyproject.toml) has no pin in constraints.txt"
        assert req.specifier.contains(Version(pinned[name]), prereleases=True), (
            f"constraints.txt pins {req.name}=={pinned[name]}, outside pyproject.toml's {req.specifier}")


def test_the_gateways_dependencies_are_pinned() -> None:
    """The packages issue 32 item 7 names: what the gateway runs on or reaches into."""
    pinned = pins()
    for name in ("uvicorn", "httptools", "starlette", "fastapi", "pydantic", "pydantic-core", "aiohttp",
                 "uvloop"):
        assert name in pinned, name


def test_the_installed_venv_is_what_constraints_txt_pins() -> None:
    """Tests pass against the pinned versions, not against whatever is installed: a venv that drifted
    (or a pin changed without re-running setup.sh, whose install stamp hashes constraints.txt) fails here."""
    drift = {}
    for name, version in pins().items():
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            installed = "not installed"
        if installed != version:
            drift[name] = f"pinned {version}, installed {installed}"
    assert not drift, drift


def test_setup_and_the_image_build_install_with_the_constraints() -> None:
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert re.search(r"pip install -q -c constraints\.txt -e '\.\[dev\]'", setup)
    stamp = next(line for line in setup.splitlines() if line.startswith("stamp="))
    assert "constraints.txt" in stamp and "pyproject.toml" in stamp  # a new pin re-installs

    build = (ROOT / "scripts" / "build-images.sh").read_text()
    assert re.search(r"pipq wheel -c constraints\.txt -w", build)
    inputs = re.search(r'declare -A INPUTS=\(\n  \[appliance\]="([^"]*)"', build)
    assert inputs and "constraints.txt" in inputs.group(1).split()  # a new pin rebuilds the image

    dockerfile = (ROOT / "images" / "appliance" / "Dockerfile").read_text()
    assert re.search(r"^COPY .*\bconstraints\.txt\b.* /src/$", dockerfile, re.M)
    installs = re.findall(r"pip install [^;]*", dockerfile)
    assert installs and all("-c /src/constraints.txt" in cmd for cmd in installs)
    assert "!constraints.txt" in (ROOT / ".dockerignore").read_text().splitlines()  # in the build context
