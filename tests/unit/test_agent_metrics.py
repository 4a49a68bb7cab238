"""The per-component series kept as plain numbers expose exactly what prometheus_client's own
Counter and Histogram would for the same updates."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dataplane.agent.metrics import _COMP, LATENCY_BUCKETS, PREFIX, SIZE_BUCKETS, AgentMetrics


def samples(text: bytes, names: set[str]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            if s.name in names:
                out[s.name, tuple(sorted(s.labels.items()))] = s.value
    return out


updates = st.lists(
    st.tuples(
        st.sampled_from([("kv", "mha", "d0"), ("mamba", "mamba", "d0"), ("kv", "mha", "d1")]),
        st.sampled_from([1, 1024, 1025, 4**15, 4**15 + 1, 7_000_000]) | st.integers(1, 1 << 32),
        st.integers(1, 500),
        st.none() | st.sampled_from([50e-6, 50.1e-6, 30.0, 31.0]) | st.floats(1e-7, 60.0),
    ),
    max_size=30,
)


@settings(max_examples=60, deadline=None)
@given(updates)
def test_component_series_match_prometheus_client(ups):
    ours = AgentMetrics("prefill", "a")
    reg = CollectorRegistry()
    nbytes = Counter(PREFIX + "transfer_bytes", "", _COMP, registry=reg)
    writes = Counter(PREFIX + "transfer_writes", "", _COMP, registry=reg)
    lat = Histogram(PREFIX + "transfer_seconds", "", _COMP, buckets=LATENCY_BUCKETS, registry=reg)
    size = Histogram(PREFIX + "request_component_bytes", "", _COMP, buckets=SIZE_BUCKETS, registry=reg)
    for (comp, stype, peer), n, w, secs in ups:
        ours.record_component(comp, stype, peer, n, w, secs)
        labels = (comp, stype, "prefill", peer)
        nbytes.labels(*labels).inc(n)
        writes.labels(*labels).inc(w)
        size.labels(*labels).observe(n)
        series = lat.labels(*labels)
        if secs is not None:
            series.observe(secs)
    names = {
        PREFIX + "transfer_bytes_total", PREFIX + "transfer_writes_total",
        *(PREFIX + f"{h}_{part}" for h in ("transfer_seconds", "request_component_bytes")
          for part in ("bucket", "count", "sum")),
    }
    want, got = samples(generate_latest(reg), names), samples(ours.exposition(), names)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert abs(got[key] - value) <= 1e-9 * max(1.0, abs(value)), key
