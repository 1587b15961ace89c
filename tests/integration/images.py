"""Tiny Docker images built locally for tests: no registry is reachable on these machines
(MEASURED.md), so images are made with `docker import` from a root filesystem we assemble."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import docker

BUSYBOX_TAG = "appliance-test/busybox:latest"
_APPLETS = ("sh", "sleep", "cat", "echo", "tail", "head", "dd", "yes", "ls", "env", "kill", "true", "false")


def busybox_image(client: docker.DockerClient, busybox: Path = Path("/bin/busybox")) -> str:
    """Import a busybox-only image (Debian's busybox-static) once and return its tag."""
    try:
        client.images.get(BUSYBOX_TAG)
        return BUSYBOX_TAG
    except docker.errors.ImageNotFound:
        pass
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = busybox.read_bytes()
        info = tarfile.TarInfo("bin/busybox")
        info.size = len(data)
        info.mode = 0o755
        tar.addfile(info, io.BytesIO(data))
        for applet in _APPLETS:
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type = tarfile.SYMTYPE
            link.linkname = "busybox"
            tar.addfile(link)
        for d in ("tmp", "proc", "sys", "dev", "etc"):
            dinfo = tarfile.TarInfo(d)
            dinfo.type = tarfile.DIRTYPE
            dinfo.mode = 0o1777 if d == "tmp" else 0o755
            tar.addfile(dinfo)
    client.api.import_image_from_data(buf.getvalue(), repository="appliance-test/busybox", tag="latest")
    return BUSYBOX_TAG


# -- the appliance's own images (scripts/build-images.sh) ------------------------------------------

REPO = Path(__file__).resolve().parents[2]
APPLIANCE_IMAGE = "appliance/appliance:0.1.0"
CPU_VLLM_IMAGE = "appliance/cpu-vllm:0.32.0"
PROMETHEUS_IMAGE = "appliance/prometheus:2.42"
BUILD_TIMEOUT_S = 3600  # a first build on a busy 2-core machine; a no-op rebuild takes about a second


def build_appliance_images() -> tuple[float, str]:
    """Run the one build command (idempotent: images whose inputs did not change are skipped).
    Returns (seconds, its output). Raises with the output when it fails."""
    import subprocess
    import sys
    import time

    env = {**__import__("os").environ, "PYTHON": sys.executable}
    t0 = time.monotonic()
    proc = subprocess.run(["bash", str(REPO / "scripts" / "build-images.sh")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
    took = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise AssertionError(f"scripts/build-images.sh failed ({proc.returncode}):\n{out}")
    return took, out
