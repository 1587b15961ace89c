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
