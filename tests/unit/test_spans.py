"""The copy kernel's work list (``transports.spans``): replayed in numpy, it must move exactly the
writes' bytes, in units that divide every address, with no span longer than the cut; the compiled
passes (``batch_kernels``, numba) must give exactly what their numpy twins give."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

try:
    import numba  # noqa: F401

    NUMBA = True
except ImportError:
    NUMBA = False

from dataplane.errors import PlanError
from dataplane.transports.base import Writes, check_bounds
from dataplane.transports.batch_kernels import FIRST_BAD, SPAN_SCAN
from dataplane.transports.spans import MAX_CHUNK, MIN_CHUNK, chunk_for, plan_spans, plan_writes, unit_of


def replay(table: np.ndarray, unit: int, src: np.ndarray, dst: np.ndarray) -> None:
    for s, d, n in table.T.tolist():
        dst[d * unit:(d + n) * unit] = src[s * unit:(s + n) * unit]


@st.composite
def batches(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    align = draw(st.sampled_from([1, 2, 4, 8, 16, 4096]))
    count = draw(st.integers(1, 40))
    sizes = [draw(st.integers(1, 3 << 18)) // align * align or align for _ in range(count)]
    src, dst, s_at, d_at = [], [], 0, 0
    order = draw(st.permutations(range(count)))
    for size in sizes:
        src.append(s_at + draw(st.integers(0, 3)) * align)
        s_at = src[-1] + size
    for i in order:
        dst.append((i, d_at))
        d_at += sizes[i] + draw(st.integers(0, 2)) * align
    dst_of = dict(dst)
    return (np.array(src), np.array([dst_of[i] for i in range(count)]), np.array(sizes), align)


@settings(max_examples=60, deadline=None)
@given(batches())
def test_replayed_spans_move_exactly_the_writes(batch: tuple[np.ndarray, ...]) -> None:
    src, dst, size, align = batch
    spans = plan_spans(src, dst, size)
    assert spans.unit == min(16, align) or spans.unit % min(16, align) == 0
    assert (spans.table[2] > 0).all() and (spans.table[2] * spans.unit <= chunk_for(int(size.sum()))).all()
    rng = np.random.default_rng(0)
    source = rng.integers(0, 256, int((src + size).max()), dtype=np.uint8)
    got = np.zeros(int((dst + size).max()) + 16, dtype=np.uint8)
    want = got.copy()
    replay(spans.table, spans.unit, source, got)
    for s, d, n in zip(src.tolist(), dst.tolist(), size.tolist(), strict=True):
        want[d:d + n] = source[s:s + n]
    assert np.array_equal(got, want)


def test_aligned_pages_move_in_16_byte_units_and_one_span_per_page() -> None:
    pages = np.arange(64) * 4096
    spans = plan_spans(pages, pages[::-1].copy(), np.full(64, 4096))
    assert spans.unit == 16 and len(spans) == 64 and spans.mean_units == 256


def test_a_base_address_counts_towards_the_unit() -> None:
    assert plan_spans(np.array([0]), np.array([0]), np.array([64]), bases=(0x1000, 0x1008)).unit == 8
    assert unit_of(np.array([3])) == 1 and unit_of(np.array([6, 12])) == 2 and unit_of(np.array([])) == 16


def test_huge_writes_are_cut_so_the_launch_fills_the_gpu() -> None:
    at = np.arange(16) * (64 << 20)
    spans = plan_spans(at, at, np.full(16, 64 << 20))
    assert len(spans) == 1024 and set((spans.table[2] * 16).tolist()) == {MAX_CHUNK}
    one = plan_spans(np.array([0]), np.array([0]), np.array([64 << 20]))
    assert len(one) == 1024 and (one.table[2] * 16 == MIN_CHUNK).all()


def test_bad_batches_are_refused() -> None:
    with pytest.raises(ValueError, match="positive sizes"):
        plan_spans(np.array([0]), np.array([0]), np.array([0]))
    with pytest.raises(ValueError, match="one length"):
        plan_spans(np.array([0, 1]), np.array([0]), np.array([1]))


@settings(max_examples=40, deadline=None)
@given(batches(), st.integers(1, 4))
def test_compiled_passes_match_the_numpy_twins(batch: tuple[np.ndarray, ...], regions: int) -> None:
    """``plan_writes`` (numba when installed) builds exactly ``plan_spans``' table from region ids."""
    assert SPAN_SCAN is not None or not NUMBA
    src, dst, size, _ = batch
    span = 1 << 22
    lr, rr = (a // span % regions for a in (src, dst))
    laddr = (1 << 40) + np.arange(regions, dtype=np.int64) * (span * 8)
    raddr = (1 << 41) + np.arange(regions, dtype=np.int64) * (span * 8)
    lo, ro = src - lr * span, dst - rr * span
    bases = (1 << 40, (1 << 41) - 4096)
    got = plan_writes(lr.astype(np.int32), lo, rr.astype(np.int32), ro, size, (laddr, raddr), bases)
    want = plan_spans(laddr[lr] - bases[0] + lo, raddr[rr] - bases[1] + ro, size, bases)
    assert (got.unit, got.mean_units) == (want.unit, want.mean_units)
    assert np.array_equal(got.table, want.table)


def test_compiled_bounds_check_finds_what_the_numpy_path_reports() -> None:
    n = 100
    at = np.arange(n) * 64
    ok = Writes(np.zeros(n, np.int32), at, np.ones(n, np.int32), at, np.full(n, 64))
    sizes = np.array([n * 64, n * 64], dtype=np.int64)
    check_bounds(ok, sizes, sizes)
    bad = Writes(ok.local_region, ok.local_offset, ok.remote_region, ok.remote_offset.copy(), ok.size)
    bad.remote_offset[37] = n * 64 - 32
    with pytest.raises(PlanError, match="write 37: remote region 1"):
        check_bounds(bad, sizes, sizes)
    if FIRST_BAD is not None:
        assert FIRST_BAD(*(getattr(bad, f) for f in ("local_region", "local_offset", "remote_region",
                                                       "remote_offset", "size")), sizes, sizes) == 37


def test_without_numba_plan_writes_takes_the_numpy_path(monkeypatch: pytest.MonkeyPatch) -> None:
    from dataplane.transports import spans as mod

    monkeypatch.setattr(mod, "SPAN_SCAN", None)
    pages = np.arange(8, dtype=np.int64) * 4096
    addrs = (np.array([1 << 40, (1 << 40) + (1 << 30)]), np.array([1 << 41]))
    got = plan_writes(np.array([0, 1] * 4, np.int32), pages, np.zeros(8, np.int32), pages[::-1].copy(),
                      np.full(8, 4096), addrs, (1 << 40, 1 << 41))
    want = [(p + (i % 2 << 30)) // 16 for i, p in enumerate(pages.tolist())]
    assert got.unit == 16 and got.table[0].tolist() == want
