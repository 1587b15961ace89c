"""What the controller's service account may do in a namespace where it runs engines
(`appliance recipes render NAME --format k8s-rbac`). Pure.

The Kubernetes runtime (controller/runtime/kubernetes.py) names the verb and resource of every API
call it makes, and a 403 is reported with exactly that pair to grant. `RULES` is the same list as
data: a ServiceAccount, a Role of least privilege and its RoleBinding, so an operator applies one
file instead of assembling the Role from the README. tests/unit/test_k8s_rbac.py holds it to the
runtime both ways: every request the runtime's recorded-API tests make is allowed by a rule, and
every rule is used by one of them (no grant nothing needs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from appliance.recipe.launch_spec import LaunchSpec

SERVICE_ACCOUNT = "appliance-controller"
ROLE = "appliance-controller"
DEFAULT_NAMESPACE = "default"  # the runtime's last fallback (after $APPLIANCE_K8S_NAMESPACE, the pod's own)

# (API group, resource, verbs): what the runtime calls, and why.
RULES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    # The per-launch engine key Secret: created first, read for `engine_env_value`, listed and
    # deleted with the launch (and replaced when a stale one of the same name is found).
    ("", "secrets", ("create", "get", "list", "delete")),
    # The Service and the Deployment: read before applying (another launch's? being deleted?),
    # server-side applied (PATCH), listed at adoption and cleanup, deleted at stop.
    ("", "services", ("get", "list", "patch", "delete")),
    ("apps", "deployments", ("get", "list", "patch", "delete")),
    # The cache and model claims: created when absent, never deleted by a stop (warm restarts).
    ("", "persistentvolumeclaims", ("create",)),
    # The launch's pods: state (list + watch), deleted with the grace at stop; their logs.
    ("", "pods", ("list", "watch", "delete")),
    ("", "pods/log", ("get",)),
    # Optional: CPU use for the stall rule; without it cpu_seconds advances with wall time.
    ("metrics.k8s.io", "pods", ("get",)),
)

# Only for a runtime built with `keep_cache=False` (its stop deletes the recipe's claims too: every
# start cold). The controller never builds one so: these stay out of the Role, named in a comment.
DROP_CACHE_RULES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("", "persistentvolumeclaims", ("list", "delete")),
)


def namespace_of(spec: LaunchSpec) -> str | None:
    """The namespace the recipe names (a kubernetes section's `namespace`); None when it names none."""
    ns = getattr(spec.runtime, "namespace", None)
    return ns if isinstance(ns, str) and ns else None


def rbac_manifests(namespace: str, *, controller_namespace: str | None = None) -> list[dict[str, Any]]:
    """ServiceAccount (in `controller_namespace`, default: the same), Role and RoleBinding (in
    `namespace`, where the engines run)."""
    home = controller_namespace or namespace
    meta_labels = {"app.kubernetes.io/name": "appliance", "app.kubernetes.io/component": "controller"}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": SERVICE_ACCOUNT, "namespace": home, "labels": meta_labels}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": ROLE, "namespace": namespace, "labels": meta_labels},
         "rules": [{"apiGroups": [group], "resources": [resource], "verbs": list(verbs)}
                   for group, resource, verbs in RULES]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": ROLE, "namespace": namespace, "labels": meta_labels},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ROLE},
         "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": home}]},
    ]


def comment_lines(spec: LaunchSpec, namespace: str, *, named: bool) -> list[str]:
    lines = [
        f"# What the appliance controller's service account needs to run recipe '{spec.recipe}' in "
        f"namespace '{namespace}': `kubectl apply -f THIS_FILE`, then run the controller's pod with "
        f"serviceAccountName: {SERVICE_ACCOUNT}.",
        "# Least privilege: exactly the calls controller/runtime/kubernetes.py makes (a refusal names the "
        "verb and resource); no cluster-wide role.",
    ]
    if not named:
        lines.append(f"# The recipe names no namespace: the runtime uses $APPLIANCE_K8S_NAMESPACE, the "
                     f"controller pod's own namespace, then '{DEFAULT_NAMESPACE}'; change the namespaces "
                     f"below to the one it will use.")
    lines.append("# Not granted: list/delete on persistentvolumeclaims, which only a runtime built with "
                 "keep_cache=False uses (the controller keeps the cache claims for warm restarts).")
    lines.append("# A controller in another namespace: keep the Role and RoleBinding here and set the "
                 "ServiceAccount's namespace (and the binding's subject) to the controller's.")
    return lines
