"""`render --format k8s-rbac`: the controller's ServiceAccount, Role and RoleBinding, validated offline
against the Kubernetes schemas, and held to the runtime both ways: every API request the Kubernetes
runtime's recorded-API tests make is one the Role allows, and every rule of the Role is used by one.

The requests come from running those tests themselves (tests/unit/test_runtime_kubernetes.py, each
test that takes only a `RecordedCluster`) and reading what reached the client's HTTP seam, so a new
API call in the runtime without its grant here fails this file, and so does a grant nothing uses.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from typing import Any

import kubernetes_validate
import pytest
import yaml

from appliance.recipe.render import render
from appliance.runtimes.k8s import kubernetes as k8s
from appliance.runtimes.k8s.rbac import DROP_CACHE_RULES, RULES, SERVICE_ACCOUNT, rbac_manifests
from tests.unit import test_runtime_kubernetes as runtime_tests
from tests.unit.k8s_recorded import RecordedCluster, Request
from tests.unit.recipe_helpers import fixed_facts, shipped

K8S_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
_CORE = re.compile(r"^/api/v1/namespaces/[^/]+/(?P<resource>[a-z]+)"
                   r"(?:/(?P<name>[^/]+))?(?:/(?P<sub>[a-z]+))?$")
_GROUP = re.compile(r"^/apis/(?P<group>[^/]+)/[^/]+/namespaces/[^/]+/(?P<resource>[a-z]+)"
                    r"(?:/(?P<name>[^/]+))?(?:/(?P<sub>[a-z]+))?$")


def authorization(req: Request) -> tuple[str, str, str]:
    """A request → (API group, resource[/subresource], verb), as the API server's authorizer sees it."""
    m = _CORE.match(req.path)
    group = ""
    if m is None:
        m = _GROUP.match(req.path)
        assert m is not None, f"not a namespaced API path: {req.path}"
        group = m["group"]
    named = m["name"] is not None
    verb = {
        "GET": ("get" if named else "watch" if req.query.get("watch") == ["true"] else "list"),
        "POST": "create", "PUT": "update", "PATCH": "patch",
        "DELETE": "delete" if named else "deletecollection",
    }[req.method]
    resource = m["resource"] + (f"/{m['sub']}" if m["sub"] else "")
    return group, resource, verb


def _recorded_tests() -> Iterator[Any]:
    for name, fn in inspect.getmembers(runtime_tests, inspect.isfunction):
        if name.startswith("test_") and list(inspect.signature(fn).parameters) == ["cluster"]:
            yield fn


def requests_the_runtime_makes() -> set[tuple[str, str, str]]:
    seen: set[tuple[str, str, str]] = set()
    for test in _recorded_tests():
        cluster = RecordedCluster()
        test(cluster)
        seen |= {authorization(r) for r in cluster.requests}
    return seen


def granted(rules: tuple[tuple[str, str, tuple[str, ...]], ...] = RULES) -> set[tuple[str, str, str]]:
    return {(g, r, v) for g, r, verbs in rules for v in verbs}


def test_the_role_allows_every_request_the_runtime_makes_and_nothing_else() -> None:
    used = requests_the_runtime_makes()
    assert len(list(_recorded_tests())) >= 25  # the runtime's recorded-API suite, not an empty set
    # keep_cache=False (a test of it is in the suite) is the only user of the rules left out.
    missing = used - granted() - granted(DROP_CACHE_RULES)
    assert missing == set(), "requests the Role does not allow (add the grant to k8s_rbac.RULES)"
    assert granted() - used == set(), "grants no recorded request uses (least privilege: drop them)"
    assert granted(DROP_CACHE_RULES) <= used and not granted(DROP_CACHE_RULES) & granted()


def test_the_mapping_reads_verbs_as_the_api_server_does() -> None:
    # The seam of the check above: a wrong mapping would make it pass or fail for the wrong reason.
    def req(method: str, path: str, **query: str) -> Request:
        return Request(method, path, {k: [v] for k, v in query.items()}, {}, None)

    assert authorization(req("GET", "/api/v1/namespaces/llm/pods", watch="true")) == ("", "pods", "watch")
    assert authorization(req("GET", "/api/v1/namespaces/llm/pods")) == ("", "pods", "list")
    assert authorization(req("GET", "/api/v1/namespaces/llm/pods/p-1/log")) == ("", "pods/log", "get")
    assert authorization(req("PATCH", "/apis/apps/v1/namespaces/llm/deployments/d")) == (
        "apps", "deployments", "patch")
    assert authorization(req("GET", "/apis/metrics.k8s.io/v1beta1/namespaces/llm/pods/p-1")) == (
        "metrics.k8s.io", "pods", "get")
    assert authorization(req("DELETE", "/api/v1/namespaces/llm/secrets")) == (
        "", "secrets", "deletecollection")


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


@pytest.mark.parametrize("recipe", ["gfx906-b-tp4-eager-k8s", "cpu-smollm2"])
def test_the_render_is_valid_kubernetes_in_the_recipes_namespace(recipe: str) -> None:
    spec = render(shipped()[recipe], fixed_facts())
    text = k8s.rbac_text(spec, shipped()[recipe])
    docs = _docs(text)
    assert [d["kind"] for d in docs] == ["ServiceAccount", "Role", "RoleBinding"]
    for doc in docs:
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)
    expected = "llm" if recipe.endswith("-k8s") else "default"  # the k8s recipe names `llm`
    assert {d["metadata"]["namespace"] for d in docs} == {expected}
    binding = docs[2]
    assert binding["roleRef"]["name"] == docs[1]["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": expected}]
    assert ("names no namespace" in text) is (expected == "default")
    assert "ClusterRole" not in text


def test_a_controller_in_another_namespace_is_bound_from_there() -> None:
    sa, role, binding = rbac_manifests("llm", controller_namespace="appliance-system")
    assert sa["metadata"]["namespace"] == binding["subjects"][0]["namespace"] == "appliance-system"
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "llm"


def test_the_format_is_offered_for_every_recipe() -> None:
    # Registered with the plug-in, so `appliance recipes render NAME --format k8s-rbac` finds it.
    assert "k8s-rbac" in k8s.KubernetesPlugin.formats
