"""The agent's side of readiness reporting: one pod condition, ``pdpair.io/TransferReady``.

The operator reads this condition to compute the PDPair's ``TransferReady`` (a schema mismatch shows
with the agent's own reason and message), and each pod's readiness gate waits on it, so a pod whose
peer handshake failed is never Ready. The agent owns the truth; this module only writes it down:
it patches the pod's ``status.conditions`` through the pods/status subresource (strategic merge, keyed
by condition type, so kubelet's own conditions are untouched), only when the report changed, and
``lastTransitionTime`` moves only when the status flips. Errors are logged, never raised: losing the
API server must not take the data plane down.

In a pod the agent authenticates with its own ServiceAccount token (``service_account_client``: the
projected volume the operator mounts into the agent container only) and checks at start that it may
patch its pod's status (``access_problem``), so a missing right fails the agent at once, by name.

No numpy here; the ``kubernetes`` client is imported lazily so the agent starts without it when no
reporter is configured.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from .errors import BadInput

CONDITION_TYPE = "pdpair.io/TransferReady"
PEER_REFUSALS = "pdpair.io/PeerRefusals"
"""The second condition an agent reports: "True" once it refused a peer's message (``peerauth``)."""
log = logging.getLogger(__name__)

PatchFn = Callable[[str, str, dict[str, Any]], None]
"""(namespace, pod name, strategic-merge patch body) -> None; raises on failure."""


def _default_patcher() -> PatchFn:
    """A patcher from in-cluster config, or KUBECONFIG / ~/.kube/config outside a cluster."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return api_patcher(client.ApiClient())


def api_patcher(api_client: Any) -> PatchFn:
    """A patcher through ``api_client`` (a ``kubernetes.client.ApiClient``)."""
    from kubernetes import client

    api = client.CoreV1Api(api_client)

    def patch(namespace: str, name: str, body: dict[str, Any]) -> None:
        api.patch_namespaced_pod_status(name, namespace, body, _request_timeout=API_TIMEOUT_SECONDS)

    return patch


API_TIMEOUT_SECONDS = 10.0


def service_account_client(directory: str) -> Any:
    """An ApiClient that authenticates with the ServiceAccount token in ``directory`` (``token`` and
    ``ca.crt``: the pod's projected token volume) at the API server ``KUBERNETES_SERVICE_HOST``/``PORT``
    name, as in any pod. The client re-reads the token, which the kubelet refreshes. Never falls back
    to a kubeconfig: an agent without its own token must not report as someone else."""
    from kubernetes import client
    from kubernetes.config.config_exception import ConfigException
    from kubernetes.config.incluster_config import InClusterConfigLoader

    configuration = client.Configuration()
    loader = InClusterConfigLoader(token_filename=f"{directory}/token", cert_filename=f"{directory}/ca.crt")
    try:
        loader.load_and_set(configuration)
    except ConfigException as exc:
        raise BadInput(f"--service-account-dir {directory}: {exc}; the pod's projected token volume "
                       "(token, ca.crt) belongs there, and KUBERNETES_SERVICE_HOST/PORT in the "
                       "environment") from None
    return client.ApiClient(configuration)


def access_problem(api_client: Any, namespace: str, pod_name: str) -> str | None:
    """Why this identity cannot report the pod's conditions, or None. Asks the API server who the
    token is (logged) and whether it may patch the pod's status. An unreachable API server is no
    problem here: the data plane runs without it, and the reports retry."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    review = client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(
        resource_attributes=client.V1ResourceAttributes(
            namespace=namespace, verb="patch", resource="pods", subresource="status", name=pod_name)))
    try:
        whoami = client.AuthenticationV1Api(api_client).create_self_subject_review(
            client.V1SelfSubjectReview(), _request_timeout=API_TIMEOUT_SECONDS)
        user_info = whoami.status.user_info if whoami.status else None
        user = (user_info.username if user_info else None) or "this identity"
        log.info("API identity: %s", user)
        answer = client.AuthorizationV1Api(api_client).create_self_subject_access_review(
            review, _request_timeout=API_TIMEOUT_SECONDS)
    except ApiException as exc:
        if exc.status in (401, 403):
            return f"the API server refused its token ({exc.status} {exc.reason})"
        log.warning("cannot check API access: %s %s", exc.status, exc.reason)
        return None
    except Exception as exc:  # connection errors of every kind: not this function's to judge
        log.warning("cannot check API access: %s", exc)
        return None
    if answer.status is not None and answer.status.allowed:
        return None
    why = (answer.status.reason if answer.status is not None else "") or "no RBAC rule allows it"
    return f"{user} may not patch pods/status of {namespace}/{pod_name} ({why})"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class PodStatusReporter:
    """Reports transfer readiness on one pod. Thread-safe; cheap to call on every health tick."""

    def __init__(self, namespace: str, pod_name: str, patcher: PatchFn | None = None,
                 clock: Callable[[], str] = _now, condition_type: str = CONDITION_TYPE) -> None:
        self.namespace = namespace
        self.condition_type = condition_type
        self.pod_name = pod_name
        self._patcher = patcher
        self._clock = clock
        self._lock = threading.Lock()
        self._last: tuple[bool, str, str] | None = None
        self._last_status: bool | None = None
        self._transition = ""

    def report(self, ready: bool, reason: str, message: str = "") -> bool:
        """Patch the condition if (ready, reason, message) changed. Returns True if a patch was sent."""
        state = (ready, reason, message)
        with self._lock:
            if state == self._last:
                return False
            if self._last_status != ready or not self._transition:
                transition = self._clock()
            else:
                transition = self._transition
            body = {"status": {"conditions": [{
                "type": self.condition_type,
                "status": "True" if ready else "False",
                "reason": reason,
                "message": message[:32768],
                "lastTransitionTime": transition,
            }]}}
            try:
                if self._patcher is None:
                    self._patcher = _default_patcher()
                self._patcher(self.namespace, self.pod_name, body)
            except Exception as exc:
                log.warning("cannot report %s=%s on pod %s/%s: %s",
                            self.condition_type, ready, self.namespace, self.pod_name, exc)
                return False
            self._last, self._last_status, self._transition = state, ready, transition
            return True


    def sibling(self, condition_type: str) -> PodStatusReporter:
        """A reporter of another condition on the same pod, through the same client."""
        return PodStatusReporter(self.namespace, self.pod_name, self._patcher, self._clock, condition_type)


__all__ = ["CONDITION_TYPE", "PEER_REFUSALS", "PatchFn", "PodStatusReporter", "access_problem", "api_patcher",
           "service_account_client"]
