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


# ---- lists cut by grain (small batches of mixed sizes) -----------------------------------------------

UNITS = [64, 256, 1024, 4096, 16384]


@st.composite
def mixed_batches(draw):
    """A room-like batch: per region a unit (its item size), writes of whole units at unit offsets on
    both sides; local and remote regions of one write share a unit up to a factor (TP slices)."""
    regions = draw(st.integers(1, 5))
    unit = draw(st.lists(st.sampled_from(UNITS), min_size=regions, max_size=regions))
    sizes = [u * draw(st.integers(4, 64)) for u in unit]
    n = draw(st.integers(1, blocks.SMALL))
    rows = []
    for _ in range(n):
        a, b = draw(st.integers(0, regions - 1)), draw(st.integers(0, regions - 1))
        u = min(unit[a], unit[b])
        count = draw(st.integers(1, 3))
        o = draw(st.integers(0, sizes[a] // u - count)) * u
        p = draw(st.integers(0, sizes[b] // u - count)) * u
        rows.append((a, o, b, p, count * u))
    local = draw(st.lists(st.sampled_from([0, *UNITS]), min_size=regions, max_size=regions))
    remote = draw(st.lists(st.sampled_from([0, *UNITS]), min_size=regions, max_size=regions))
    return tuple(list(c) for c in zip(*rows, strict=True)), sizes, local, remote


def _apply(grains, changes):
    return [changes.get(r, g) for r, g in enumerate(grains)]


def _blocks_of(sizes, grains):
    """Every region cut by its grain: (region, byte offset, length) per list entry, and the bases."""
    entries, bases = [], []
    for r, (size, g) in enumerate(zip(sizes, grains, strict=True)):
        bases.append(len(entries) if g else -1)
        entries += [(r, k * g, g) for k in range(size // g)] if g else []
    return entries, bases


@settings(max_examples=300, deadline=None)
@given(mixed_batches())
def test_settled_grains_cut_every_write_alike_on_both_sides(batch):
    lists, sizes, local, remote = batch
    settled = blocks.settle_grains(lists, local, remote)
    assert settled is not None
    lg, rg = _apply(local, settled[0]), _apply(remote, settled[1])
    for before, changes in ((local, settled[0]), (remote, settled[1])):
        for r, g in changes.items():
            assert g > 0 and (before[r] == 0 or before[r] % g == 0), "a grain only ever shrinks to a divisor"
    assert blocks.settle_grains(lists, lg, rg) == ({}, {}), "settled grains fit the batch as they are"
    lentries, lbases = _blocks_of(sizes, lg)
    rentries, rbases = _blocks_of(sizes, rg)
    li, ri = blocks.grain_indices(lists, lg, lbases, rbases)
    assert len(li) == len(ri)
    assert li == sorted(li), "blocks in local order, so neighbours meet"
    pairs = [(lentries[i], rentries[j]) for i, j in zip(li, ri, strict=True)]
    assert all(x[2] == y[2] for x, y in pairs), "paired entries differ in length"
    got = sorted((la, lo, rb, ro, n) for (la, lo, n), (rb, ro, _) in pairs)
    want = sorted(
        (a, o + k, b, p + k, lg[a]) for a, o, b, p, s in zip(*lists, strict=True) for k in range(0, s, lg[a])
    )
    assert got == want, "the pairs move exactly the writes' bytes, each block to its place"


def test_a_room_keeps_one_index_per_item_and_a_finer_write_refines_only_its_regions():
    # two 4 KiB KV pages and a 64-byte aux slot, as a 4 KiB room writes them
    room = ([0, 1, 2], [8192, 8192, 128], [0, 1, 2], [4096, 4096, 64], [4096, 4096, 64])
    lg_changes, rg_changes = blocks.settle_grains(room, [0, 0, 0], [0, 0, 0])
    assert lg_changes == rg_changes == {0: 4096, 1: 4096, 2: 64}
    rows, bases = blocks.cut_rows(
        np.array([[1 << 20, 65536, 0], [2 << 20, 65536, 0], [3 << 20, 1024, 0]], np.uint64),
        [4096, 4096, 64], np.array([True, True, True]),
    )
    assert rows[:, 4].tolist() == [16, 16, 16] and bases == [0, 16, 32]
    assert blocks.grain_indices(room, [4096, 4096, 64], bases, bases) == ([2, 18, 34], [1, 17, 33])
    half = ([0], [2048], [0], [0], [2048])
    assert blocks.settle_grains(half, [4096, 4096, 64], [4096, 4096, 64]) == ({0: 2048}, {0: 2048})
    assert blocks.cut_entries([65536, 65536, 1024], [2048, 4096, 64], [True, False, True]) == 32 + 16


def test_a_compact_batch_gives_the_indices_and_block_of_its_expanded_writes() -> None:
    from dataplane.transports import Writes

    rng = np.random.default_rng(5)
    sizes = np.array([1 << 20, 1 << 20], np.int64)
    count = rng.integers(1, 40, 12)
    size = rng.choice([256, 512, 1024], 12).astype(np.int64)
    rep = np.stack([count, size * 2, size * rng.integers(1, 3, 12)]).astype(np.int64)
    w = Writes(rng.integers(0, 2, 12).astype(np.int32), rng.integers(0, 64, 12) * 256,
               rng.integers(0, 2, 12).astype(np.int32), rng.integers(0, 64, 12) * 256, size, rep)
    e = w.expanded()
    g = blocks.strided_block_size(w, sizes, sizes, 1 << 20)
    assert g == blocks.block_size(e, sizes, sizes, 1 << 20) == 256
    bases = blocks.layout(sizes, np.array([True, True]), g)
    got = blocks.strided_block_indices(w.local_region, w.local_offset, rep[0], rep[1], w.size, bases, g)
    assert got.tolist() == blocks.block_indices(e.local_region, e.local_offset, e.size, bases, g).tolist()
    got = blocks.strided_block_indices(w.remote_region, w.remote_offset, rep[0], rep[2], w.size, bases, g)
    assert got.tolist() == blocks.block_indices(e.remote_region, e.remote_offset, e.size, bases, g).tolist()
