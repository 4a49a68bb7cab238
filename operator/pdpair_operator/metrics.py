"""The operator's own Prometheus metrics (prefix ``pdpair_operator_``, base units, bounded labels).

``pdpair_operator_pdpairs`` is computed at scrape time from the last status each PDPair was given, so
it never drifts from what ``kubectl get pdpairs`` shows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .status import CONDITION_TYPES


class ConditionTracker(Collector):
    """PDPairs by condition type and status, from the latest status per PDPair."""

    def __init__(self) -> None:
        self._latest: dict[tuple[str, str], dict[str, str]] = {}

    def update(self, key: tuple[str, str], conditions: list[dict[str, Any]]) -> None:
        self._latest[key] = {c["type"]: c["status"] for c in conditions if "type" in c and "status" in c}

    def forget(self, key: tuple[str, str]) -> None:
        self._latest.pop(key, None)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("pdpair_operator_pdpairs", "PDPairs by condition and status",
                                   labels=["condition", "status"])
        for kind in CONDITION_TYPES:
            for value in ("True", "False", "Unknown"):
                count = sum(1 for conds in self._latest.values() if conds.get(kind) == value)
                family.add_metric([kind, value], count)
        yield family


class OperatorMetrics:
    """One registry per operator instance (tests run several without clashing)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.reconciles = Counter("pdpair_operator_reconcile_total", "Reconcile passes", ["result"],
                                  registry=self.registry)
        self.errors = Counter("pdpair_operator_reconcile_errors_total", "Failed API steps during reconcile",
                              ["step"], registry=self.registry)
        self.duration = Histogram("pdpair_operator_reconcile_duration_seconds", "Reconcile pass duration",
                                  buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
                                  registry=self.registry)
        self.api_requests = Counter("pdpair_operator_api_requests_total", "API writes issued by plans",
                                    ["action"], registry=self.registry)
        self.conditions = ConditionTracker()
        self.registry.register(self.conditions)

    def serve(self, port: int, address: str) -> None:
        start_http_server(port, addr=address, registry=self.registry)
