"""The Kubernetes runtime's data: its recipe section and its LaunchSpec sub-model. Pure pydantic.

A recipe declares that it runs on a cluster with `runtime: {kind: kubernetes, image: …}`. The section
says what only a cluster needs — namespace, storage for the compile caches and the model, node
selection, tolerations, requests — and nothing a container needs that the rest of the recipe already
says (env, argv, TP, memlock, the memory-limit policy: they come from the common recipe fields).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from appliance.runtimes.base import LaunchRuntime, RuntimeSection

# Kubernetes resource quantities as they appear in YAML (the subset a size is written with).
QUANTITY_RE = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$"
# RFC 1123 label: namespaces and claim names.
DNS_LABEL_RE = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
# Label keys: optional DNS-subdomain prefix + "/" + a name of ≤ 63 [A-Za-z0-9._-], alnum at both ends.
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LABEL_KEY_RE = re.compile(rf"^([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_LABEL_NAME}$")
LABEL_VALUE_RE = re.compile(rf"^({_LABEL_NAME})?$")

AccessMode = Literal["ReadWriteOnce", "ReadWriteOncePod", "ReadWriteMany", "ReadOnlyMany"]


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Storage(_Strict):
    """A volume that outlives the pod: an existing claim, or a new claim of `size`.

    The compile caches must survive pod restarts, or every start is a cold compile and a new
    "vintage" (DOMAIN §4: 352 s cold vs 230 s warm for recipe C; S8 §5.4: an unset cache root writes
    2.1 GB into the container layer and makes the token stream a lottery).
    """

    claim: str | None = Field(default=None, pattern=DNS_LABEL_RE, description="An existing PVC to mount.")
    size: str | None = Field(default=None, pattern=QUANTITY_RE, description="Size of a new PVC, e.g. 50Gi.")
    storage_class: str | None = Field(default=None,
                                      description="storageClassName (None: the cluster default).")
    access_mode: AccessMode = "ReadWriteOnce"
    sub_path: str | None = Field(default=None, description="Directory inside the claim (model only).")

    @model_validator(mode="after")
    def _claim_or_size(self) -> Storage:
        if (self.claim is None) == (self.size is None):
            raise ValueError("storage: give exactly one of `claim` (an existing PVC) or `size` (a new PVC)")
        if self.claim is not None and self.storage_class is not None:
            raise ValueError("storage: `storage_class` applies to a new claim (`size`), "
                             "not to an existing `claim`")
        return self


class Toleration(_Strict):
    key: str | None = None
    operator: Literal["Exists", "Equal"] = "Exists"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None


# Defaults for a recipe (or a docker recipe rendered for a cluster) that says nothing about storage.
DEFAULT_CACHE = Storage(size="50Gi")
DEFAULT_MODEL = Storage(size="100Gi", access_mode="ReadWriteOnce")


class _ClusterFields(_Strict):
    """What the section and the launch sub-model share (the section's values, resolved)."""

    image: str = Field(min_length=1)
    digest: str | None = Field(default=None, pattern=r"^sha256:[0-9a-f]{64}$")
    namespace: str | None = Field(default=None, pattern=DNS_LABEL_RE)
    cache: Storage = DEFAULT_CACHE
    model: Storage = DEFAULT_MODEL
    node_selector: dict[str, str] | None = Field(
        default=None, description="None: the platform's default (GPU vendor labels); {} : none at all.")
    tolerations: tuple[Toleration, ...] = ()
    shm_size: str | None = Field(default=None, pattern=QUANTITY_RE,
                                 description="/dev/shm as a memory-backed emptyDir of this size.")
    host_ipc: bool = Field(default=False, description="hostIPC: RCCL/NCCL all-reduce through host SHM (S12).")
    seccomp_unconfined: bool = False
    runtime_class: str | None = None
    service_type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = "ClusterIP"
    cpu_request: str | None = Field(default=None, pattern=r"^[0-9]+(\.[0-9]+)?m?$")
    memory_request: str | None = Field(default=None, pattern=QUANTITY_RE,
                                       description="None: from the recipe's memory model (admission's peak).")
    image_pull_secret: str | None = Field(default=None, pattern=DNS_LABEL_RE)

    @field_validator("node_selector")
    @classmethod
    def _labels(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for k, v in (value or {}).items():
            if not LABEL_KEY_RE.fullmatch(k) or not LABEL_VALUE_RE.fullmatch(v):
                raise ValueError(f"node_selector {k}={v!r} is not a Kubernetes label")
        return value


class KubernetesSection(_ClusterFields, RuntimeSection):
    """The recipe's `runtime:` section for `kind: kubernetes`."""

    kind: Literal["kubernetes"] = "kubernetes"


class KubernetesLaunch(_ClusterFields, LaunchRuntime):
    """The LaunchSpec's `runtime:` sub-model for `kind: kubernetes`: the section, resolved (image
    with its digest, memory request from the memory model). Everything `manifests()` needs beyond
    the common launch fields (argv, env, port, probes, budgets, ulimits, labels)."""

    kind: Literal["kubernetes"] = "kubernetes"

    @property
    def image_ref(self) -> str:
        return f"{self.image}@{self.digest}" if self.digest else self.image

    def engine_image(self) -> str | None:
        return self.image_ref
