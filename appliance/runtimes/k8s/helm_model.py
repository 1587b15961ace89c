"""The values `render --format helm-values` writes, as a model: exactly the subset of vLLM
production-stack's chart values that helm.helm_values emits. Pure pydantic.

Key names and types follow the chart's documented values: helm/values.schema.json of
github.com/vllm-project/production-stack at commit 01eaf92cb895ececa44ee86083f11522adafbbc9 (and
helm/values.yaml at 00c38d1a15cc61b9691da2b66898690dc8745f25, whose comments document the same keys);
the keys are camelCase because they are the chart's:
`servingEngineSpec.{containerPort, strategy, vllmApiKey, startupProbe, readinessProbe, livenessProbe,
modelSpec[]}` and, per `modelSpec` entry, `name, repository, tag, modelURL, replicaCount, requestCPU,
requestMemory, requestGPU, requestGPUType, pvcStorage, pvcAccessMode, storageClass, shmSize,
nodeSelectorTerms, tolerations, runtimeClassName, imagePullSecret, vllmConfig{…}, env`. Where the chart
allows several types (requestGPU: integer, number or string) the model keeps the one the render writes.
The chart's own schema is not shipped here (nothing fetched from a public repository is committed):
this model is what tests/unit/test_k8s_helm.py validates every shipped recipe's render against.

Stricter than the chart on purpose: an unknown key is an error (`extra="forbid"`: the chart would
silently ignore it, so a misspelt key would be a setting that never applies), types are strict (no
"4" for 4), and a key written as null is an error (the chart's schema types these keys; omit a key
rather than null it).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, StrictBool, StrictFloat, StrictInt, StrictStr, model_validator


class _Values(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _no_nulls(cls, data: Any) -> Any:
        if isinstance(data, dict):
            nulls = sorted(str(k) for k, v in data.items() if v is None)
            if nulls:
                raise ValueError(f"{', '.join(nulls)}: null — the chart types these keys; omit them instead")
        return data


class HttpGet(_Values):
    path: StrictStr
    port: StrictInt


class Probe(_Values):
    """`servingEngineSpec.{startup,readiness,liveness}Probe`."""

    httpGet: HttpGet
    initialDelaySeconds: StrictInt
    periodSeconds: StrictInt
    failureThreshold: StrictInt


class Strategy(_Values):
    """`servingEngineSpec.strategy`: the Deployment strategy, passed through by the chart."""

    type: Literal["Recreate", "RollingUpdate"]


class VllmApiKey(_Values):
    """`servingEngineSpec.vllmApiKey` as a reference to an existing Secret (the chart also takes a
    plain string, which would put the key in the values file: never written here)."""

    secretName: StrictStr
    secretKey: StrictStr


class VllmConfig(_Values):
    """`modelSpec[].vllmConfig`: the engine flags the chart has a key for, and `extraArgs` for the rest."""

    tensorParallelSize: StrictInt
    enablePrefixCaching: StrictBool
    dtype: StrictStr | None = None
    maxModelLen: StrictInt | None = None
    gpuMemoryUtilization: StrictFloat | None = None
    maxNumSeqs: StrictInt | None = None
    extraArgs: list[StrictStr] | None = None


class EnvVar(_Values):
    name: StrictStr
    value: StrictStr


class MatchExpression(_Values):
    key: StrictStr
    operator: Literal["In"]
    values: list[StrictStr]


class NodeSelectorTerm(_Values):
    """`modelSpec[].nodeSelectorTerms[]`: a Kubernetes NodeSelectorTerm, as the chart passes it on."""

    matchExpressions: list[MatchExpression]


class Toleration(_Values):
    key: StrictStr | None = None
    operator: Literal["Exists", "Equal"]
    value: StrictStr | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None


class ModelSpec(_Values):
    """One `servingEngineSpec.modelSpec[]` entry: one Deployment of the chart."""

    name: StrictStr
    repository: StrictStr
    tag: StrictStr
    modelURL: StrictStr
    replicaCount: StrictInt
    requestCPU: StrictInt
    requestMemory: StrictStr
    requestGPU: StrictInt
    pvcStorage: StrictStr
    pvcAccessMode: list[Literal["ReadWriteOnce", "ReadWriteOncePod", "ReadWriteMany", "ReadOnlyMany"]]
    vllmConfig: VllmConfig
    env: list[EnvVar]
    requestGPUType: StrictStr | None = None
    storageClass: StrictStr | None = None
    shmSize: StrictStr | None = None
    nodeSelectorTerms: list[NodeSelectorTerm] | None = None
    tolerations: list[Toleration] | None = None
    runtimeClassName: StrictStr | None = None
    imagePullSecret: StrictStr | None = None


class ServingEngineSpec(_Values):
    containerPort: StrictInt
    strategy: Strategy
    vllmApiKey: VllmApiKey
    startupProbe: Probe
    readinessProbe: Probe
    livenessProbe: Probe
    modelSpec: list[ModelSpec]


class HelmValues(_Values):
    """The whole values file `render --format helm-values` writes."""

    servingEngineSpec: ServingEngineSpec
