"""The agent's Prometheus metrics: one prefix (``pdpair_agent_``), base units, bounded labels.

Labels are component, state_type, role, peer (the peer *agent's* name — never a room id) and reason /
outcome from small fixed vocabularies. Each agent owns its own ``CollectorRegistry`` so two agents in
one process (the demo, tests) never clash. The hot path is cheap: one update per request per component
(from ``WritePlan.bytes_by_component()``), never one per write.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.utils import floatToGoString

PREFIX = "pdpair_agent_"
LATENCY_BUCKETS = (
    50e-6,
    100e-6,
    250e-6,
    500e-6,
    1e-3,
    2.5e-3,
    5e-3,
    10e-3,
    25e-3,
    50e-3,
    100e-3,
    250e-3,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
SIZE_BUCKETS = tuple(float(4**k) for k in range(5, 16))
CONTENT_TYPE = CONTENT_TYPE_LATEST

_SIZES, _LATENCIES = len(SIZE_BUCKETS) + 1, len(LATENCY_BUCKETS) + 1
"""Bucket counts per series: one per bound and one above them all (+Inf)."""

OUTCOMES = ("success", "failed", "aborted")
_COMP = ("component", "state_type", "role", "peer")


def thread_cpu_seconds(native_id: int | None) -> float | None:
    """CPU time a live thread of this process has used, from ``/proc`` (None: no such thread, or no
    ``/proc``). By the kernel's thread id, so a thread that has ended reads as gone, never as another."""
    if native_id is None:
        return None
    try:
        with open(f"/proc/self/task/{native_id}/schedstat", "rb") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


class WorkerCpu:
    """``worker_cpu_seconds_total``: the role worker's CPU time, read at scrape time. One thread plans,
    posts and accounts every room, so its rate reaching 1 means the agent is CPU-bound on that thread."""

    def __init__(self, role: str):
        self.role = role
        self.native_id: int | None = None

    def seconds(self) -> float | None:
        return thread_cpu_seconds(self.native_id)

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            PREFIX + "worker_cpu_seconds",
            "CPU seconds used by the role-worker thread (rate 1 = that one thread is saturated).",
            labels=("role",),
        )
        secs = self.seconds()
        if secs is not None:
            family.add_metric((self.role,), secs)
        yield family


class ComponentTotals:
    """``transfer_bytes``, ``transfer_writes``, ``request_component_bytes`` and ``transfer_seconds``
    per (component, state type, peer), kept as plain numbers and turned into metric families at
    scrape time. prometheus_client's labelled series take a lock per update and walk the buckets in
    Python: four updates per component of every room, ~8% of a small room's time on the worker."""

    def __init__(self, role: str):
        self.role = role
        self._lock = threading.Lock()
        self._series: dict[tuple[str, str, str], list[Any]] = {}

    def record(self, key: tuple[str, str, str], nbytes: int, writes: int, seconds: float | None) -> None:
        with self._lock:
            s = self._series.get(key)
            if s is None:
                s = self._series[key] = [0, 0, [0] * _SIZES, 0, [0] * _LATENCIES, 0.0]
            s[0] += nbytes
            s[1] += writes
            s[2][bisect.bisect_left(SIZE_BUCKETS, nbytes)] += 1
            s[3] += nbytes
            if seconds is not None:
                s[4][bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
                s[5] += seconds

    def collect(self) -> Iterator[Any]:
        with self._lock:
            rows = [(k, v[0], v[1], list(v[2]), v[3], list(v[4]), v[5]) for k, v in self._series.items()]
        nbytes = CounterMetricFamily(PREFIX + "transfer_bytes", "Bytes moved, by component.", labels=_COMP)
        writes = CounterMetricFamily(
            PREFIX + "transfer_writes", "One-sided writes issued, by component.", labels=_COMP
        )
        seconds = HistogramMetricFamily(
            PREFIX + "transfer_seconds",
            "Write start to completion of one request's component (a small request's components go "
            "in one engine request and share its latency).",
            labels=_COMP,
        )
        sizes = HistogramMetricFamily(
            PREFIX + "request_component_bytes", "Bytes of one request's component.", labels=_COMP
        )
        for (comp, stype, peer), moved, count, size_hist, size_sum, lat_hist, lat_sum in rows:
            labels = (comp, stype, self.role, peer)
            nbytes.add_metric(labels, moved)
            writes.add_metric(labels, count)
            sizes.add_metric(labels, _cumulative(SIZE_BUCKETS, size_hist), size_sum)
            seconds.add_metric(labels, _cumulative(LATENCY_BUCKETS, lat_hist), lat_sum)
        yield from (nbytes, writes, seconds, sizes)


def _cumulative(bounds: tuple[float, ...], counts: list[int]) -> list[tuple[str, float]]:
    """Per-bucket counts (the last: above every bound) as Prometheus' cumulative ``le`` buckets."""
    out: list[tuple[str, float]] = []
    total = 0
    for bound, n in zip((*(floatToGoString(b) for b in bounds), "+Inf"), counts, strict=True):
        total += n
        out.append((bound, total))
    return out


class AgentMetrics:
    """Every metric of one agent, registered in its own registry."""

    def __init__(self, role: str, agent: str):
        self.role = role
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.components = ComponentTotals(role)
        r.register(self.components)
        self.staged_bytes = Counter(
            PREFIX + "staged_bytes",
            "Bytes moved on the staged path (gathered, one write per slot, scattered), by component; "
            "the rest of transfer_bytes went as direct writes.",
            _COMP,
            registry=r,
        )
        self.requests = Counter(
            PREFIX + "requests",
            "Finished requests by outcome and reason.",
            ("role", "peer", "outcome", "reason"),
            registry=r,
        )
        self.verified_bytes = Counter(
            PREFIX + "verified_bytes",
            "Received bytes checked against the synthetic content, by result.",
            ("component", "state_type", "role", "result"),
            registry=r,
        )
        self.refusals = Counter(
            PREFIX + "handshake_refusals",
            "Handshakes refused, by reason.",
            ("role", "peer", "reason"),
            registry=r,
        )
        self.peer_refusals = Counter(
            "pdpair_peer_refusals",
            "Messages and registrations refused for failing peer authentication, by reason "
            "(unauthenticated, bad_mac, replay, foreign_pdpair).",
            ("role", "reason"),
            registry=r,
        )
        self.handshakes = Counter(
            PREFIX + "handshakes", "Successful handshakes.", ("role", "peer"), registry=r
        )
        self.transfer_errors = Counter(
            PREFIX + "transfer_errors",
            "Errors on the transfer path (the transport, a peer gone, the agent itself), by kind.",
            ("role", "kind"),
            registry=r,
        )
        self.rejected = Counter(
            PREFIX + "rejected_messages",
            "Control messages dropped as unusable (malformed, unknown peer...), by kind.",
            ("role", "kind"),
            registry=r,
        )
        self.inflight = Gauge(PREFIX + "inflight_rooms", "Rooms not yet finished.", ("role",), registry=r)
        self.peer_up = Gauge(
            PREFIX + "peer_up", "1 while the peer is paired and alive.", ("role", "peer"), registry=r
        )
        self.info = Gauge(
            PREFIX + "info", "Constant 1; labels describe the agent.", ("role", "agent"), registry=r
        )
        self.info.labels(role, agent).set(1)
        self.worker_cpu = WorkerCpu(role)
        r.register(self.worker_cpu)
        self._outcomes: dict[tuple[str, str, str], Any] = {}
        self._inflight = self.inflight.labels(role)
        self._inflight.set(0)

    def record_component(
        self, component: str, state_type: str, peer: str, nbytes: int, writes: int, seconds: float | None
    ) -> None:
        """One request's component finished moving (``seconds`` None when only counted, e.g. on decode)."""
        self.components.record((component, state_type, peer), nbytes, writes, seconds)

    def record_staged(self, component: str, state_type: str, peer: str, nbytes: int) -> None:
        """The part of a request's component that went on the staged path (also in transfer_bytes)."""
        self.staged_bytes.labels(component, state_type, self.role, peer).inc(nbytes)

    def record_outcome(self, peer: str, outcome: str, reason: str = "") -> None:
        key = (peer, outcome, reason)
        series = self._outcomes.get(key)
        if series is None:
            series = self._outcomes[key] = self.requests.labels(self.role, peer, outcome, reason)
        series.inc()

    def record_verified(self, component: str, state_type: str, nbytes: int, ok: bool) -> None:
        self.verified_bytes.labels(component, state_type, self.role, "ok" if ok else "mismatch").inc(nbytes)

    def record_refusal(self, peer: str, reason: str) -> None:
        self.refusals.labels(self.role, peer, reason).inc()

    def record_peer_refusal(self, reason: str) -> None:
        self.peer_refusals.labels(self.role, reason).inc()

    def record_handshake(self, peer: str) -> None:
        """Also creates the peer's success series at 0, so ``rate()`` counts from the first request."""
        self.handshakes.labels(self.role, peer).inc()
        self.peer_up.labels(self.role, peer).set(1)
        key = (peer, "success", "")
        if key not in self._outcomes:
            self._outcomes[key] = self.requests.labels(self.role, peer, "success", "")

    def peer_down(self, peer: str) -> None:
        self.peer_up.labels(self.role, peer).set(0)

    def record_transfer_error(self, kind: str) -> None:
        self.transfer_errors.labels(self.role, kind).inc()

    def record_rejected(self, kind: str) -> None:
        self.rejected.labels(self.role, kind).inc()

    def set_inflight(self, n: int) -> None:
        self._inflight.set(n)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def reason_label(reason: str) -> str:
    """A bounded label from a free-text reason: its first clause, lower-case, at most 48 chars."""
    head = reason.split(":", 1)[0].strip().lower() or "unknown"
    return head[:48]
