"""Names and labels of a PDPair's children: one place, so render, planner and handlers agree.

Names are deterministic (owner, generation, role, index): creating a child twice answers 409 instead of
making a duplicate, which is what lets a restarted operator converge without bookkeeping.
"""

from __future__ import annotations

from .spec import Role

PREFIX = "pdpair.io"
LABEL_NAME = f"{PREFIX}/name"
LABEL_ROLE = f"{PREFIX}/role"
LABEL_INDEX = f"{PREFIX}/index"
LABEL_GENERATION = f"{PREFIX}/generation"
LABEL_KIND = f"{PREFIX}/child"
"""What the child is: pod, bootstrap, headless, metrics, config, gpus, pairing, isolation, router."""
LABEL_ROUTER = f"{PREFIX}/router"
"""On the router's pods (which are not children the operator indexes): the PDPair they route for."""
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "pdpair-operator"
ANNOTATION_RENDER_HASH = f"{PREFIX}/render-hash"
ANNOTATION_RESTARTS = f"{PREFIX}/restart-count"
ANNOTATION_LAST_FAILURE = f"{PREFIX}/last-failure"
TRANSFER_READY = f"{PREFIX}/TransferReady"
"""Pod condition type the agent reports and the readiness gate waits on."""
PEER_REFUSALS = f"{PREFIX}/PeerRefusals"
"""Pod condition type the agent reports once it refused a peer (counts by reason in its message)."""
GPU_CLAIM = "gpus"
"""The pod's ResourceClaim entry (``spec.resourceClaims[].name``) its containers reference."""
CONFIG_DIR = "/etc/pdpair/config"
CONFIG_FILE = "agent.yaml"
PAIRING_DIR = "/etc/pdpair/pairing"
"""The pairing Secret's mount, beside (not inside) the read-only config mount: a mount point inside a
read-only volume cannot be created."""
PAIRING_KEY = "key"
"""The Secret's data key, and the file name under ``PAIRING_DIR``."""
ROLE_SHORT = {"prefill": "p", "decode": "d"}


def pod_name(owner: str, generation: str, role: Role, index: int) -> str:
    return f"{owner}-{generation}-{role}-{index}"


def bootstrap_service(owner: str, generation: str) -> str:
    return f"{owner}-bootstrap-{generation}"


def headless_service(owner: str) -> str:
    return f"{owner}-pods"


def metrics_service(owner: str) -> str:
    return f"{owner}-metrics"


def config_map(owner: str, generation: str) -> str:
    return f"{owner}-agent-{generation}"


def pairing_secret(owner: str) -> str:
    """One per PDPair, for every generation: agents of two generations never pair anyway."""
    return f"{owner}-pairing"


def agent_service_account(owner: str) -> str:
    """The agents' ServiceAccount and its RoleBinding (``identity.py``)."""
    return f"{owner}-agent"


def network_policy(owner: str) -> str:
    return f"{owner}-isolation"


def router(owner: str) -> str:
    """The router's Deployment, Service, ServiceAccount, Role and RoleBinding."""
    return f"{owner}-router"


def router_network_policy(owner: str) -> str:
    return f"{owner}-router-ingress"


def gpu_claim_template(owner: str, generation: str, role: Role) -> str:
    """Per generation and role: a template's spec is immutable, and the generation hash covers it."""
    return f"{owner}-gpus-{generation}-{role}"


def service_dns(service: str, namespace: str) -> str:
    return f"{service}.{namespace}.svc"


def owner_labels(owner: str) -> dict[str, str]:
    """Labels every child carries; the operator's watches select on them."""
    return {
        "app.kubernetes.io/name": "pdpair",
        "app.kubernetes.io/instance": owner,
        MANAGED_BY: MANAGER,
        LABEL_NAME: owner,
    }


def pod_labels(owner: str, generation: str, role: Role, index: int) -> dict[str, str]:
    return {
        **owner_labels(owner),
        "app.kubernetes.io/component": role,
        LABEL_KIND: "pod",
        LABEL_ROLE: role,
        LABEL_INDEX: str(index),
        LABEL_GENERATION: generation,
    }


def pod_selector(owner: str, role: Role | None = None, generation: str | None = None) -> dict[str, str]:
    selector = {LABEL_NAME: owner, LABEL_KIND: "pod"}
    if role is not None:
        selector[LABEL_ROLE] = role
    if generation is not None:
        selector[LABEL_GENERATION] = generation
    return selector
