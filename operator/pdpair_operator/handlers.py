"""Thin kopf glue: indices that summarise what the operator watches, and event handlers that kick
the reconciler. No decisions here (they live in ``planner``), no API writes (``apply``).

Why ``on.event`` + ``index`` and not ``on.create/update/resume``: the operator is level-triggered. Any
event of a PDPair or of a labelled child means "look again"; kopf's change-detection handlers would
add a diff-base annotation and progress annotations to every PDPair for nothing. kopf runs no handler
until every index has been listed (``operator_indexed``), so after a restart the first plan already
sees every existing child: no duplicates, no orphans. Owner references make deletion the garbage
collector's job, so no finalizer is added.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from . import naming
from .apply import Executor, Kube, load_api_client
from .metrics import OperatorMetrics
from .observe import ChildView, Owner, PodView, child_from_body, owner_from_body, pod_from_body
from .options import Options
from .reconciler import Key, Reconciler
from .spec import GROUP, PLURAL, VERSION, SpecError

log = logging.getLogger(__name__)
CHILD_LABELS: dict[str, Any] = {
    naming.MANAGED_BY: naming.MANAGER, naming.LABEL_NAME: kopf.PRESENT}


class NoDiffBase(kopf.DiffBaseStorage):
    """kopf builds a diff base (a deep copy of the body) on every event of every watched object, for
    change-detection handlers. This operator has none (``on.event`` and indices only), so there is
    nothing to build, store or fetch; at 500 PDPairs the copies were a third of the operator's CPU."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> Any:
        return None

    def fetch(self, *, body: kopf.Body) -> None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: Any) -> None:
        return None


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    options: Options = memo.get("options") or Options()
    settings.posting.level = logging.WARNING
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=naming.PREFIX)
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.persistence.finalizer = f"{naming.PREFIX}/operator"
    settings.batching.batch_window = options.batch_window
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 60
    metrics = OperatorMetrics()
    if options.metrics_port:
        metrics.serve(options.metrics_port, options.metrics_address)
    kube = Kube(load_api_client(pool_size=options.concurrency + 4))
    executor = Executor(kube, concurrency=options.concurrency)
    memo["reconciler"] = Reconciler(executor, metrics, debounce=options.debounce,
                                    scraper=options.metrics_scraper, agent_role=options.agent_cluster_role)


@kopf.index(GROUP, VERSION, PLURAL)
def pdpair_owners(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Key, Owner | None]:
    try:
        return {(namespace or "", name): owner_from_body(body)}
    except SpecError as exc:
        log.error("%s/%s: %s", namespace, name, exc)
        return {(namespace or "", name): None}


@kopf.index("v1", "pods", labels=CHILD_LABELS)
def pdpair_pods(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[Key, PodView]:
    return {(namespace or "", labels[naming.LABEL_NAME]): pod_from_body(body)}


@kopf.index("v1", "services", labels=CHILD_LABELS)
def pdpair_services(namespace: str | None, labels: kopf.Labels, body: kopf.Body,
                    **_: Any) -> dict[Key, ChildView]:
    return {(namespace or "", labels[naming.LABEL_NAME]): child_from_body("Service", body)}


@kopf.index("v1", "configmaps", labels=CHILD_LABELS)
def pdpair_configmaps(namespace: str | None, labels: kopf.Labels, body: kopf.Body,
                      **_: Any) -> dict[Key, ChildView]:
    return {(namespace or "", labels[naming.LABEL_NAME]): child_from_body("ConfigMap", body)}


@kopf.index("resource.k8s.io", "v1", "resourceclaimtemplates", labels=CHILD_LABELS)
def pdpair_claim_templates(namespace: str | None, labels: kopf.Labels, body: kopf.Body,
                           **_: Any) -> dict[Key, ChildView]:
    """DRA GPU claim templates. On an API server without resource.k8s.io/v1 kopf warns and leaves this
    index empty; only PDPairs asking for ``gpuAllocation: dra`` need it."""
    return {(namespace or "", labels[naming.LABEL_NAME]): child_from_body("ResourceClaimTemplate", body)}


@kopf.index("v1", "secrets", labels=CHILD_LABELS)
def pdpair_secrets(namespace: str | None, labels: kopf.Labels, body: kopf.Body,
                   **_: Any) -> dict[Key, ChildView]:
    """The pairing Secrets, by name only: the index never keeps a key."""
    return {(namespace or "", labels[naming.LABEL_NAME]): child_from_body("Secret", body)}


@kopf.index("networking.k8s.io", "v1", "networkpolicies", labels=CHILD_LABELS)
def pdpair_network_policies(namespace: str | None, labels: kopf.Labels, body: kopf.Body,
                            **_: Any) -> dict[Key, ChildView]:
    return {(namespace or "", labels[naming.LABEL_NAME]): child_from_body("NetworkPolicy", body)}


def _extra_index(kind: str) -> Any:
    def index(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[Key, ChildView]:
        return {(namespace or "", labels[naming.LABEL_NAME]): child_from_body(kind, body)}
    index.__name__ = f"pdpair_{kind.lower()}s"
    return index


# The agents' identity (pdpair_operator.identity) and a serving PDPair's router (serving).
EXTRA_INDICES = ("pdpair_serviceaccounts", "pdpair_roles", "pdpair_rolebindings", "pdpair_deployments",
                  "pdpair_poddisruptionbudgets")
kopf.index("v1", "serviceaccounts", labels=CHILD_LABELS, id="pdpair_serviceaccounts")(
    _extra_index("ServiceAccount"))
kopf.index("rbac.authorization.k8s.io", "v1", "roles", labels=CHILD_LABELS, id="pdpair_roles")(
    _extra_index("Role"))
kopf.index("rbac.authorization.k8s.io", "v1", "rolebindings", labels=CHILD_LABELS, id="pdpair_rolebindings")(
    _extra_index("RoleBinding"))
kopf.index("apps", "v1", "deployments", labels=CHILD_LABELS, id="pdpair_deployments")(
    _extra_index("Deployment"))
kopf.index("policy", "v1", "poddisruptionbudgets", labels=CHILD_LABELS, id="pdpair_poddisruptionbudgets")(
    _extra_index("PodDisruptionBudget"))


def _reconciler(memo: kopf.Memo, kwargs: dict[str, Any]) -> Reconciler:
    rec: Reconciler = memo["reconciler"]
    idx = rec.indices
    idx.owners, idx.pods = kwargs["pdpair_owners"], kwargs["pdpair_pods"]
    idx.services, idx.configmaps = kwargs["pdpair_services"], kwargs["pdpair_configmaps"]
    idx.claim_templates = kwargs["pdpair_claim_templates"]
    idx.secrets, idx.network_policies = kwargs["pdpair_secrets"], kwargs["pdpair_network_policies"]
    idx.extra = tuple(kwargs[name] for name in EXTRA_INDICES)
    return rec


@kopf.on.event(GROUP, VERSION, PLURAL)
async def pdpair_changed(namespace: str | None, name: str, memo: kopf.Memo, **kwargs: Any) -> None:
    _reconciler(memo, kwargs).kick((namespace or "", name))


@kopf.on.event("v1", "pods", labels=CHILD_LABELS)
@kopf.on.event("v1", "services", labels=CHILD_LABELS)
@kopf.on.event("v1", "configmaps", labels=CHILD_LABELS)
@kopf.on.event("resource.k8s.io", "v1", "resourceclaimtemplates", labels=CHILD_LABELS)
@kopf.on.event("v1", "secrets", labels=CHILD_LABELS)
@kopf.on.event("networking.k8s.io", "v1", "networkpolicies", labels=CHILD_LABELS)
@kopf.on.event("v1", "serviceaccounts", labels=CHILD_LABELS)
@kopf.on.event("rbac.authorization.k8s.io", "v1", "roles", labels=CHILD_LABELS)
@kopf.on.event("rbac.authorization.k8s.io", "v1", "rolebindings", labels=CHILD_LABELS)
@kopf.on.event("apps", "v1", "deployments", labels=CHILD_LABELS)
@kopf.on.event("policy", "v1", "poddisruptionbudgets", labels=CHILD_LABELS)
async def child_changed(namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, **kwargs: Any) -> None:
    _reconciler(memo, kwargs).kick((namespace or "", labels[naming.LABEL_NAME]))
