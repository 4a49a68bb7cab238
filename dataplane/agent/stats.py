"""Per-component running statistics for ``/status`` (and so for the demo's table): requests, bytes,
writes, verification results and a bounded latency sample for percentiles. Prometheus keeps the
histograms; this keeps exact recent percentiles a human can read without a Prometheus server.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

SAMPLES = 20_000


@dataclass
class ComponentStats:
    state_type: str
    requests: int = 0
    bytes: int = 0
    writes: int = 0
    verified_bytes: int = 0
    mismatched_bytes: int = 0
    latencies: deque[float] = field(default_factory=lambda: deque(maxlen=SAMPLES))
    posts: deque[float] = field(default_factory=lambda: deque(maxlen=SAMPLES))
    """Of each latency, the time until the engine's ``write`` returned (prefill only)."""


class StatsBook:
    """Thread-safe: the worker records, the HTTP thread reads ``snapshot``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by: dict[str, ComponentStats] = {}
        self.first: float | None = None
        self.last: float | None = None

    def _get(self, component: str, state_type: str) -> ComponentStats:
        s = self._by.get(component)
        if s is None:
            s = self._by[component] = ComponentStats(state_type)
        return s

    def window(self, start: float, end: float) -> None:
        """Widen the transfer window (first start, last completion) used for throughput."""
        with self._lock:
            self.first = start if self.first is None else min(self.first, start)
            self.last = end if self.last is None else max(self.last, end)

    def record(
        self, component: str, state_type: str, nbytes: int, writes: int, seconds: float | None,
        post: float | None = None,
    ) -> None:
        with self._lock:
            s = self._get(component, state_type)
            s.requests += 1
            s.bytes += nbytes
            s.writes += writes
            if seconds is not None:
                s.latencies.append(seconds)
            if post is not None:
                s.posts.append(post)

    def verified(self, component: str, state_type: str, nbytes: int, ok: bool) -> None:
        with self._lock:
            s = self._get(component, state_type)
            if ok:
                s.verified_bytes += nbytes
            else:
                s.mismatched_bytes += nbytes

    def snapshot(self) -> dict[str, Any]:
        """Copies the counters under the lock and computes the percentiles after releasing it: the
        worker records every room, and a reader polling ``/status`` must not hold it up for the
        milliseconds that percentiles over ``SAMPLES`` latencies take. ``transfer_window_bounds``: the
        window's first start and last completion (monotonic seconds), so the windows of a pod's ranks
        can be joined."""
        with self._lock:
            bounds = [self.first, self.last] if self.first is not None and self.last is not None else None
            span = bounds[1] - bounds[0] if bounds is not None else 0.0
            copies = {
                name: (dataclasses.replace(s, latencies=deque(), posts=deque()),
                       list(s.latencies), list(s.posts))
                for name, s in self._by.items()
            }
        comps = {name: _summary(s, lat, posts, span) for name, (s, lat, posts) in copies.items()}
        return {"components": comps, "transfer_window_seconds": span, "transfer_window_bounds": bounds}


def _summary(s: ComponentStats, latencies: list[float], posts: list[float], span: float) -> dict[str, Any]:
    lat = np.array(latencies, dtype=np.float64) if latencies else None
    return {
        "state_type": s.state_type,
        "requests": s.requests,
        "bytes": s.bytes,
        "writes": s.writes,
        "verified_bytes": s.verified_bytes,
        "mismatched_bytes": s.mismatched_bytes,
        "gbps": (s.bytes / span / 1e9) if span > 0 else 0.0,
        "p50_ms": float(np.percentile(lat, 50) * 1e3) if lat is not None else None,
        "p99_ms": float(np.percentile(lat, 99) * 1e3) if lat is not None else None,
        "post_p50_ms": float(np.percentile(posts, 50) * 1e3) if posts else None,
        "samples": 0 if lat is None else len(lat),
        "in_flight_seconds": float(lat.sum()) if lat is not None else 0.0,
    }
