"""The per-component figures ``/status`` reports (``agent.stats.StatsBook``)."""

from __future__ import annotations

import pytest

from dataplane.agent.stats import StatsBook


def test_latency_and_the_engine_write_share_of_it() -> None:
    book = StatsBook()
    book.record("kv", "kv", 4096, 1, 0.004, post=0.001)
    book.record("kv", "kv", 4096, 1, 0.006, post=0.003)
    book.record("aux", "aux", 64, 1, 0.002)
    comps = book.snapshot()["components"]
    assert comps["kv"]["p50_ms"] == pytest.approx(5.0) and comps["kv"]["post_p50_ms"] == pytest.approx(2.0)
    assert (comps["kv"]["requests"], comps["kv"]["bytes"]) == (2, 8192)
    assert comps["aux"]["post_p50_ms"] is None  # decode, and anything without an engine write
