"""The agent's side of readiness reporting: one pod condition, ``pdpair.io/TransferReady``.

The operator reads this condition to compute the PDPair's ``TransferReady`` (a schema mismatch shows
with the agent's own reason and message), and each pod's readiness gate waits on it, so a pod whose
peer handshake failed is never Ready. The agent owns the truth; this module only writes it down:
it patches the pod's ``status.conditions`` through the pods/status subresource (strategic merge, keyed
by condition type, so kubelet's own conditions are untouched), only when the report changed, and
``lastTransitionTime`` moves only when the status flips. Errors are logged, never raised: losing the
API server must not take the data plane down.

No numpy here; the ``kubernetes`` client is imported lazily so the agent starts without it when no
reporter is configured.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

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
    api = client.CoreV1Api()

    def patch(namespace: str, name: str, body: dict[str, Any]) -> None:
        api.patch_namespaced_pod_status(name, namespace, body)

    return patch


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


__all__ = ["CONDITION_TYPE", "PEER_REFUSALS", "PatchFn", "PodStatusReporter"]
