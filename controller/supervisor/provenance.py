"""Where an engine came from, for its launch record: the image id and digest (docker), or the
interpreter and the versions of the packages that decide its behaviour (process).

DOMAIN §7: deployment is verified file by file; a launch record that says which build ran is the
minimum for comparing two launches ("same artifact md5, 403/512 positions differ", S14e).
"""

from __future__ import annotations

from pathlib import Path

import docker.errors

from appliance.launch_spec import LaunchSpec
from controller.engine_setup import package_versions
from controller.runtime.base import Runtime
from controller.store import Provenance
from controller.supervisor.driver import ProvenanceFn


def provenance_for(runtimes: dict[str, Runtime]) -> ProvenanceFn:
    def provenance(spec: LaunchSpec) -> Provenance:
        if spec.runtime == "process" and spec.python:
            python = Path(spec.python)
            versions = package_versions(python) if python.exists() else {}
            return Provenance(interpreter=spec.python, packages=versions)
        if spec.runtime == "docker" and spec.image:
            return _image_provenance(runtimes.get("docker"), spec.image)
        return Provenance()

    return provenance


def _image_provenance(runtime: Runtime | None, image: str) -> Provenance:
    client = getattr(runtime, "client", None)
    if client is None:
        return Provenance(image=image)
    try:
        found = client.images.get(image)
    except docker.errors.DockerException as exc:
        # Recorded as unknown; the start itself reports a missing image with its own message.
        raise ValueError(f"image {image}: {exc}") from exc
    digests = found.attrs.get("RepoDigests") or []
    return Provenance(image=image, image_id=found.id, image_digest=digests[0] if digests else None)
