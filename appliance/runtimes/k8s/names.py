"""Names and labels of the Kubernetes objects of a launch. Pure.

Label values must be ≤ 63 characters of [A-Za-z0-9._-] with alphanumeric ends, object names RFC 1035
labels; recipe names and launch ids may be longer or contain other characters, so they are sanitised
(shortened with a hash, so two long names cannot collide) and the exact values are kept in annotations.
"""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING

# Re-exported: the kubernetes plug-in and its callers take them from here.
from appliance.engine_names import ENGINE_KEY_ENV as ENGINE_KEY_ENV
from appliance.engine_names import LABEL_LAUNCH_ID as LABEL_LAUNCH_ID
from appliance.engine_names import LABEL_MANAGED as LABEL_MANAGED
from appliance.engine_names import LABEL_RECIPE as LABEL_RECIPE
from appliance.engine_names import LABEL_SPEC_HASH as LABEL_SPEC_HASH

if TYPE_CHECKING:
    from appliance.recipe.launch_spec import LaunchSpec

_LABEL_BAD = re.compile(r"[^A-Za-z0-9._-]+")

def dns_label(text: str, max_len: int = 63) -> str:
    """`text` as an RFC 1035 label (lowercase alnum and '-', starts with a letter, ≤ max_len); a
    shortened name keeps a hash of the original so two long names cannot collide."""
    base = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-") or "x"
    if not base[0].isalpha():
        base = "x-" + base
    if len(base) <= max_len:
        return base
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return base[: max_len - 9].rstrip("-") + "-" + digest


def label_value(text: str) -> str:
    """`text` in label-value syntax (≤ 63 of [A-Za-z0-9._-], alnum at both ends); shortened with a hash."""
    value = _LABEL_BAD.sub("-", text).strip("-_.")
    if len(value) > 63:
        value = value[:54].rstrip("-_.") + "-" + hashlib.sha256(text.encode()).hexdigest()[:8]
    return value


def workload_name(spec: LaunchSpec) -> str:
    """Deployment and Service name: one per recipe (a new launch replaces the previous one)."""
    return dns_label(f"appliance-{spec.recipe}")


def key_secret_name(spec: LaunchSpec) -> str:
    return dns_label(f"{workload_name(spec)}-engine-key", 253)


def labels(spec: LaunchSpec, launch_id: str | None) -> dict[str, str]:
    raw = raw_labels(spec, launch_id)
    return {k: label_value(v) for k, v in raw.items()}


def raw_labels(spec: LaunchSpec, launch_id: str | None) -> dict[str, str]:
    raw = {LABEL_MANAGED: "true", LABEL_RECIPE: spec.recipe, LABEL_SPEC_HASH: spec.spec_hash}
    if launch_id is not None:
        raw[LABEL_LAUNCH_ID] = launch_id
    return raw


def selector(spec: LaunchSpec) -> dict[str, str]:
    """The Deployment's (immutable) selector and the Service's: recipe-level labels only."""
    return {LABEL_MANAGED: "true", LABEL_RECIPE: label_value(spec.recipe)}
