"""Block arithmetic of the prepared-list engines: the plain-Python path for small batches gives exactly
the vectorised path's indices."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dataplane.transports import blocks


def vectorised(region, offset, size, bases, block):
    """``block_indices`` forced down its numpy path (a batch too large for the Python one)."""
    pad = blocks.SMALL + 1 - len(size)
    if pad <= 0:
        return blocks.block_indices(region, offset, size, bases, block)
    out = blocks.block_indices(
        np.concatenate([region, np.zeros(pad, region.dtype)]),
        np.concatenate([offset, np.zeros(pad, offset.dtype)]),
        np.concatenate([size, np.full(pad, block, size.dtype)]),
        bases,
        block,
    )
    return out[: len(out) - pad]


@st.composite
def batches(draw):
    block = draw(st.sampled_from([64, 4096, 1 << 20]))
    regions = draw(st.integers(1, 6))
    bases = np.cumsum(draw(st.lists(st.integers(0, 5000), min_size=regions, max_size=regions)))
    n = draw(st.integers(0, blocks.SMALL))
    region = np.array(draw(st.lists(st.integers(0, regions - 1), min_size=n, max_size=n)), np.int32)
    offset = np.array(draw(st.lists(st.integers(0, 300), min_size=n, max_size=n)), np.int64) * block
    size = np.array(draw(st.lists(st.integers(1, 20), min_size=n, max_size=n)), np.int64) * block
    return region, offset, size, bases.astype(np.int64), block


@settings(max_examples=300, deadline=None)
@given(batches())
def test_small_batches_index_exactly_like_the_vectorised_path(batch):
    got = blocks.block_indices(*batch)
    want = vectorised(*batch)
    assert got.dtype == np.int32
    assert got.tolist() == want.tolist()


def test_one_block_write_is_its_base_plus_offset():
    idx = blocks.block_indices(
        np.array([1], np.int32), np.array([5 * 4096], np.int64), np.array([4096], np.int64),
        np.array([0, 100], np.int64), 4096,
    )
    assert idx.tolist() == [105]
