"""The agents' API identity: each PDPair's own ServiceAccount, its RoleBinding, and what a pod gets of it.

The agent needs exactly one right on the API: patch its own pod's ``pdpair.io/TransferReady`` condition
(plus get on pods). The chart ships that as one ClusterRole (``<release>-agent``); for every PDPair
the operator makes a ServiceAccount ``<name>-agent`` and a RoleBinding in the PDPair's namespace that
binds it to that ClusterRole, both owned by the PDPair (the garbage collector removes them with it).
That works in any namespace the operator watches, and creating the RoleBinding needs only ``bind`` on
that one ClusterRole (RBAC's escalation check), not the agent's rights themselves.

In the pod, the token reaches the agent container only: ``automountServiceAccountToken: false`` and
a projected volume (a bound, expiring token, the cluster's CA, the namespace) mounted into the agent
container, whose ``--service-account-dir`` names it. A sidecar engine gets no token and, unless the
spec gives its own, a restricted securityContext. ``spec.serviceAccountName`` overrides the account;
then the operator makes neither object and the named account's RBAC is the user's. Pure functions.
"""

from __future__ import annotations

from typing import Any

from . import naming
from .observe import Owner

DEFAULT_AGENT_CLUSTER_ROLE = "pdpair-agent"
"""The ClusterRole the chart installs for agents when its release is named ``pdpair``."""
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_VOLUME = "api-token"
TOKEN_EXPIRATION_SECONDS = 3607
"""What the kubelet's own service-account volume asks for; the kubelet refreshes it at 80 %."""


def operator_managed(owner: Owner) -> bool:
    """True when the operator provides the agents' account (no ``spec.serviceAccountName``)."""
    return not owner.spec.service_account_name


def service_account_name(owner: Owner) -> str:
    return owner.spec.service_account_name or naming.agent_service_account(owner.name)


def _meta(owner: Owner, child: str) -> dict[str, Any]:
    return {"name": naming.agent_service_account(owner.name),
            "labels": {**naming.owner_labels(owner.name), naming.LABEL_KIND: child}}


def build_service_account(owner: Owner) -> dict[str, Any]:
    """The agents' ServiceAccount; pods get its token only through the agent's projected volume."""
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(owner, "agent-identity"),
            "automountServiceAccountToken": False}


def build_role_binding(owner: Owner, cluster_role: str) -> dict[str, Any]:
    """Binds the agents' ServiceAccount to the agent ClusterRole, in the PDPair's namespace only."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": _meta(owner, "agent-rights"),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
        "subjects": [{"kind": "ServiceAccount", "name": naming.agent_service_account(owner.name),
                      "namespace": owner.namespace}],
    }


def token_volume() -> dict[str, Any]:
    """A bound ServiceAccount token (bound to the pod: void once the pod is gone), the cluster CA and
    the namespace, as the kubelet's own ``kube-api-access`` volume holds them."""
    return {"name": TOKEN_VOLUME, "projected": {"defaultMode": 0o400, "sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": TOKEN_EXPIRATION_SECONDS}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace",
                                    "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
    ]}}


ENGINE_SECURITY_CONTEXT: dict[str, Any] = {
    "runAsNonRoot": True, "allowPrivilegeEscalation": False, "privileged": False,
    "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
}
"""A named engine image's default: Kubernetes' restricted profile (its user comes from the pod)."""


def engine_security_context(engine_spec: dict[str, Any] | None) -> dict[str, Any]:
    return dict(engine_spec) if engine_spec is not None else dict(ENGINE_SECURITY_CONTEXT)


def with_identity(owner: Owner, pod_spec: dict[str, Any]) -> dict[str, Any]:
    """The pod's account, no automounted token, the token volume in the agent container only, and the
    engine container's securityContext."""
    pod_spec["serviceAccountName"] = service_account_name(owner)
    pod_spec["automountServiceAccountToken"] = False
    pod_spec["volumes"].append(token_volume())
    for container in pod_spec["containers"]:
        if container["name"] == "agent":
            container["volumeMounts"].append({"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True})
            container["command"] = [*container["command"], "--service-account-dir", TOKEN_DIR]
        elif container["name"] == "engine" and "securityContext" not in container:
            context = engine_security_context(owner.spec.engine.security_context)
            if owner.spec.engine.sglang is not None and owner.spec.engine.security_context is None:
                context["readOnlyRootFilesystem"] = True  # its caches and /tmp are volumes (serving.py)
            container["securityContext"] = context
    return pod_spec


__all__ = [
    "DEFAULT_AGENT_CLUSTER_ROLE", "TOKEN_DIR", "build_role_binding", "build_service_account",
    "engine_security_context", "operator_managed", "service_account_name", "token_volume",
    "with_identity",
]
