"""Where an engine came from, for its launch record: the image id and digest (docker), or the
interpreter and the versions of the packages that decide its behaviour (process).

DOMAIN §7: deployment is verified file by file; a launch record that says which build ran is the
minimum for comparing two launches ("same artifact md5, 403/512 positions differ", S14e).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from appliance.launch_spec import LaunchSpec
from controller.engine_setup import package_versions
from controller.runtime.base import Runtime
from controller.runtime.process import engine_env
from controller.store import Provenance
from controller.supervisor.driver import ProvenanceFn


def provenance_for(runtimes: dict[str, Runtime]) -> ProvenanceFn:
    def provenance(spec: LaunchSpec) -> Provenance:
        if spec.runtime == "process" and spec.python:
            # The engine's own interpreter with the engine's own environment (PYTHONPATH included):
            # where its packages really live (a vLLM under PYTHONPATH is what runs, not the venv's).
            env = engine_env(spec.env)
            found = shutil.which(spec.python, path=env.get("PATH"))
            versions = package_versions(Path(found), env) if found else {}
            return Provenance(interpreter=found or spec.python, packages=versions)
        if spec.runtime == "docker" and spec.image:
            return _image_provenance(runtimes.get("docker"), spec.image)
        return Provenance()

    return provenance


def _image_provenance(runtime: Runtime | None, image: str) -> Provenance:
    client = getattr(runtime, "client", None)
    if client is None:
        return Provenance(image=image)
    # Imported here: a runtime with a client means the SDK is installed; the process runtime must run
    # on hosts without it (issue 12: `--no-docker` still needed the docker package).
    import docker.errors

    try:
        found = client.images.get(image)
    except docker.errors.DockerException as exc:
        # Recorded as unknown; the start itself reports a missing image with its own message.
        raise ValueError(f"image {image}: {exc}") from exc
    digests = found.attrs.get("RepoDigests") or []
    return Provenance(image=image, image_id=found.id, image_digest=digests[0] if digests else None)
