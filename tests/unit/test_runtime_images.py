"""The torch-first `.pth` of images/gfx906 (DOMAIN §4/§5), run by a real interpreter against a
stand-in `torch` module: torch must be imported at interpreter start-up — before any user code —
exactly when APPLIANCE_TORCH_FIRST=1, in every fresh interpreter (as a spawned TP worker is)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

IMAGES = Path(__file__).resolve().parents[2] / "images"
PTH = IMAGES / "gfx906" / "appliance-torch-first.pth"

# Runs in the child: site.addsitedir processes .pth files the way site-packages does at start-up.
PROBE = """
import site, sys
site.addsitedir(sys.argv[1])
print("torch" in sys.modules)
"""


def run_probe(tmp_path: Path, switch: str | None) -> str:
    fake = tmp_path / "fake"
    fake.mkdir(exist_ok=True)
    (fake / "torch.py").write_text("LOADED = True\n")
    sitedir = tmp_path / "site"
    sitedir.mkdir(exist_ok=True)
    (sitedir / PTH.name).write_bytes(PTH.read_bytes())
    env = {k: v for k, v in os.environ.items() if k != "APPLIANCE_TORCH_FIRST"}
    env["PYTHONPATH"] = str(fake)
    if switch is not None:
        env["APPLIANCE_TORCH_FIRST"] = switch
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(sitedir)], env=env, capture_output=True, text=True, check=True
    )
    assert out.stderr == ""  # a broken .pth line prints "Error processing line …" and is skipped
    return out.stdout.strip()


@pytest.mark.parametrize(("switch", "imported"), [("1", "True"), ("0", "False"), (None, "False")])
def test_pth_imports_torch_first_only_when_switched_on(
    tmp_path: Path, switch: str | None, imported: str
) -> None:
    assert run_probe(tmp_path, switch) == imported


def test_pth_is_a_single_import_line() -> None:
    # site.py executes only lines that start with "import"; anything else would be read as a path.
    lines = [line for line in PTH.read_text().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("import ")


# Images built by scripts/build-images.sh take the repository root as their build context (they
# copy the sources); gfx906 is built from its own directory on the GPU hosts.
ROOT_CONTEXT = {"appliance", "cpu-vllm", "prometheus"}


def test_dockerfiles_reference_files_that_exist() -> None:
    for dockerfile in IMAGES.glob("*/Dockerfile"):
        context = IMAGES.parent if dockerfile.parent.name in ROOT_CONTEXT else dockerfile.parent
        for line in dockerfile.read_text().splitlines():
            if line.startswith("COPY ") and not line.split()[1].startswith("--from="):
                source = line.split()[1]
                assert (context / source).exists(), f"{dockerfile}: COPY {source} is missing"
            for bind in re.findall(r"--mount=type=bind,source=([^,\s]+)", line):
                assert (context / bind).is_dir(), f"{dockerfile}: bind mount source {bind} is missing"
        assert "ENTRYPOINT" in dockerfile.read_text()
