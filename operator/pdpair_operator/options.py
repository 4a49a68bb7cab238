"""Run-time options of the operator process, parsed once by the CLI and handed to kopf as ``memo``."""

from __future__ import annotations

from typing import Any

import msgspec

from .identity import DEFAULT_AGENT_CLUSTER_ROLE


class Options(msgspec.Struct, frozen=True):
    metrics_port: int = 0
    """0 disables the metrics endpoint."""
    metrics_address: str = "127.0.0.1"
    concurrency: int = 24
    """API requests in flight across all PDPairs."""
    debounce: float = 0.05
    """Seconds a kicked PDPair waits so a burst of child events costs one reconcile pass."""
    batch_window: float = 0.05
    """kopf's per-object event batching window."""
    agent_cluster_role: str = DEFAULT_AGENT_CLUSTER_ROLE
    """The ClusterRole each PDPair's agent ServiceAccount is bound to (``identity.py``)."""
    metrics_scraper: dict[str, Any] | None = None
    """The NetworkPolicyPeer each PDPair's NetworkPolicy admits to the agents' metrics port; None: pods
    labelled ``app.kubernetes.io/name: prometheus`` in any namespace."""
