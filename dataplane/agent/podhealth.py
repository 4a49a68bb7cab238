"""What a pod of several ranks reports as one: its pod condition and its metrics.

``PodConditions`` folds the ranks' readiness reports into one pod condition (``pdpair.io/TransferReady``),
ready only when every rank is; ``RankedFamilies`` merges the ranks' metric registries into one
exposition, each sample labelled ``tp_rank`` (one family per metric name, so Prometheus sees one
``# TYPE`` line and a series per rank).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence

from prometheus_client.metrics_core import Metric

from .health import ConditionReporter
from .metrics import AgentMetrics

log = logging.getLogger(__name__)
RANK_LABEL = "tp_rank"


class PodConditions:
    """The ranks' readiness reports → one pod condition, ready only when every rank is."""

    def __init__(self, reporter: ConditionReporter, ranks: Sequence[int]):
        self.reporter = reporter
        self._lock = threading.Lock()
        self._state = {r: (False, "NoEngine", f"rank {r}: not started") for r in ranks}
        self._ready: bool | None = None

    def for_rank(self, rank: int) -> RankReporter:
        return RankReporter(self, rank)

    def set(self, rank: int, ready: bool, reason: str, message: str) -> None:
        with self._lock:
            self._state[rank] = (ready, reason, f"rank {rank}: {message}")
            waiting = [s for s in self._state.values() if not s[0]]
            now = not waiting
            changed, self._ready = now != self._ready, now
        if not (changed or reason == "HandshakeRefused"):
            return
        why, text = ("Paired", f"every rank paired ({len(self._state)})") if now else waiting[0][1:]
        try:
            self.reporter.report(now, why, text)
        except Exception:
            log.exception("reporting the pod condition failed")


class RankReporter:
    """What one rank's ``AgentStatus`` reports to (``ConditionReporter``)."""

    def __init__(self, pod: PodConditions, rank: int):
        self.pod, self.rank = pod, rank
        sibling = getattr(pod.reporter, "sibling", None)
        if sibling is not None:  # the pod's other condition (peer refusals), shared by the ranks
            self.sibling = sibling

    def report(self, ready: bool, reason: str, message: str) -> None:
        self.pod.set(self.rank, ready, reason, message)


class RankedFamilies:
    """Every rank's metric families as one collector, each sample labelled with its rank."""

    def __init__(self, metrics: dict[int, AgentMetrics]):
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        out: dict[str, Metric] = {}
        for rank, m in sorted(self.metrics.items()):
            for fam in m.registry.collect():
                merged = out.get(fam.name)
                if merged is None:
                    merged = out[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
                label = str(rank)
                merged.samples += [s._replace(labels={**s.labels, RANK_LABEL: label}) for s in fam.samples]
        return out.values()


__all__ = ["RANK_LABEL", "PodConditions", "RankReporter", "RankedFamilies"]
