"""Where an engine came from, for its launch record: each runtime says it for its kind
(`ProvenanceSource.provenance`: the image id and digest for docker, the interpreter and the versions
of the packages that decide its behaviour for process).

DOMAIN §7: deployment is verified file by file; a launch record that says which build ran is the
minimum for comparing two launches ("same artifact md5, 403/512 positions differ", S14e).
"""

from __future__ import annotations

from appliance.recipe.launch_spec import LaunchSpec
from controller.runtime.base import Provenance, ProvenanceSource, Runtime
from controller.supervisor.host_seams import ProvenanceFn


def provenance_for(runtimes: dict[str, Runtime]) -> ProvenanceFn:
    def provenance(spec: LaunchSpec) -> Provenance:
        runtime = runtimes.get(spec.kind)
        if isinstance(runtime, ProvenanceSource):
            return runtime.provenance(spec)
        # No runtime that can tell (e.g. its daemon is down): what the spec itself names.
        return Provenance(image=spec.runtime.engine_image(), interpreter=spec.runtime.engine_python())

    return provenance
