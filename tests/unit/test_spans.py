"""The copy kernel's work list (``transports.spans``): replayed in numpy, it must move exactly the
writes' bytes, in units that divide every address, with no span longer than the cut."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataplane.transports.spans import MAX_CHUNK, MIN_CHUNK, chunk_for, plan_spans, unit_of


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
