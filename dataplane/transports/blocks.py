"""Block arithmetic for engines that address memory by index into prepared descriptor lists (NIXL).

A batch of writes whose offsets and sizes are all multiples of ``g`` can be expressed as indices into
lists that cut every region into ``g``-byte blocks. A small batch of mixed sizes (a room: KV pages,
a mamba slot, a 64-byte aux slot) shares no useful ``g``; it is expressed instead in lists that cut each
region in blocks of its own size, its *grain* (``settle_grains``). Pure numpy, no engine: unit-testable
on its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .base import SMALL, Writes


def block_size(writes: Writes, local_sizes: np.ndarray, remote_sizes: np.ndarray, limit: int) -> int | None:
    """The largest block size that expresses every write, or None when the lists (or the index arrays)
    would exceed ``limit`` entries — then exact descriptors are the cheaper route."""
    if len(writes) <= SMALL:
        _, local_offset, _, remote_offset, sizes = writes.lists
        g = math.gcd(*local_offset, *remote_offset, *sizes)
        nbytes = sum(sizes)
    else:
        g = int(np.gcd.reduce(np.concatenate([writes.local_offset, writes.remote_offset, writes.size])))
        nbytes = writes.nbytes
    worst = max(int(local_sizes.sum()), int(remote_sizes.sum()), nbytes) // g
    return g if worst <= limit else None


def strided_block_size(
    writes: Writes, local_sizes: np.ndarray, remote_sizes: np.ndarray, limit: int
) -> int | None:
    """``block_size`` of a compact batch (``Writes.repeat``), its strides included, without expanding
    it."""
    rep = writes.repeat
    assert rep is not None
    many = rep[0] > 1
    parts = [writes.local_offset, writes.remote_offset, writes.size, rep[1][many], rep[2][many]]
    g = int(np.gcd.reduce(np.abs(np.concatenate(parts))))
    if g <= 0:
        return None
    worst = max(int(local_sizes.sum()), int(remote_sizes.sum()), writes.nbytes) // g
    return g if worst <= limit else None


def strided_block_indices(
    region: np.ndarray, offset: np.ndarray, count: np.ndarray, stride: np.ndarray, size: np.ndarray,
    bases: np.ndarray, block: int,
) -> np.ndarray:
    """``block_indices`` of a compact batch's writes (entry ``i`` stands for ``count[i]`` writes
    ``stride[i]`` bytes apart), writes in order, without expanding the batch into its five columns."""
    entry = np.repeat(np.arange(len(count)), count)
    step = np.arange(len(entry), dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
    starts = bases[region][entry] + (offset[entry] + step * stride[entry]) // block
    n = (size // block)[entry]
    if int(n.max(initial=1)) == 1:
        return starts.astype(np.int32)
    first = np.cumsum(n) - n
    return (np.repeat(starts - first, n) + np.arange(int(n.sum()))).astype(np.int32)


def layout(sizes: np.ndarray, mask: np.ndarray, block: int) -> np.ndarray:
    """First block index of each region in the list of the ``mask`` regions (others hold no blocks)."""
    counts = np.where(mask, sizes.astype(np.int64) // block, 0)
    return np.cumsum(counts) - counts


def strided_rows(descs: np.ndarray, mask: np.ndarray, block: int) -> np.ndarray:
    """NIXL's compressed list form, one row per region: (addr, block, dev, stride=block, count)."""
    counts = descs[:, 1].astype(np.int64) // block
    keep = mask & (counts > 0)
    rows = np.empty((int(keep.sum()), 5), dtype=np.uint64)
    rows[:, 0] = descs[keep, 0]
    rows[:, 1] = block
    rows[:, 2] = descs[keep, 2]
    rows[:, 3] = block
    rows[:, 4] = counts[keep]
    return rows


SMALL_BLOCKS = 256
"""Up to this many blocks (from at most ``SMALL`` writes) the indices are built in plain Python: a
room's component is usually a few writes of one block each, where numpy's six calls cost ~3x more."""


def block_indices(
    region: np.ndarray, offset: np.ndarray, size: np.ndarray, bases: np.ndarray, block: int
) -> np.ndarray:
    """int32 indices of every block each write covers, writes in order, blocks ascending."""
    if len(size) <= SMALL:
        counts = [s // block for s in size.tolist()]
        if sum(counts) <= SMALL_BLOCKS:
            out: list[int] = []
            for r, off, count in zip(region.tolist(), offset.tolist(), counts, strict=True):
                start = int(bases[r]) + off // block
                out.extend(range(start, start + count))
            return np.array(out, dtype=np.int32)
    n = size // block
    starts = bases[region] + offset // block
    first = np.cumsum(n) - n
    return (np.repeat(starts - first, n) + np.arange(int(n.sum()))).astype(np.int32)


GRAIN_PASSES = 64
"""Bound on ``settle_grains``' passes: each pass that changes anything lowers a grain to a proper
divisor of itself, so real batches settle in two or three."""


def settle_grains(
    lists: tuple[list[int], list[int], list[int], list[int], list[int]],
    local: Sequence[int], remote: Sequence[int],
) -> tuple[dict[int, int], dict[int, int]] | None:
    """Per-region block sizes ("grains") under which every write of a small batch is whole blocks of
    one size on both sides — NIXL pairs a prepared list's entries one to one, so a write's local and
    remote regions must be cut alike. ``local``/``remote``: the current grain of each region (0: not
    cut yet). Returns the regions whose grain must change (each to a divisor of its current one), ``({},
    {})`` when the current grains already fit, None when no grain above 0 fits (cannot happen for
    positive sizes; the bound on passes makes it a fallback rather than a loop)."""
    lr, lo, rr, ro, sizes = lists
    rows = list(zip(lr, lo, rr, ro, sizes, strict=True))
    if all((g := local[a]) and g == remote[b] and not (o % g or p % g or s % g) for a, o, b, p, s in rows):
        return {}, {}
    new_l: dict[int, int] = {}
    new_r: dict[int, int] = {}
    for _ in range(GRAIN_PASSES):
        changed = False
        for a, o, b, p, s in rows:
            u = math.gcd(o, p, s, new_l.get(a, local[a]), new_r.get(b, remote[b]))
            if new_l.get(a, local[a]) != u:
                new_l[a], changed = u, True
            if new_r.get(b, remote[b]) != u:
                new_r[b], changed = u, True
        if not changed:
            return new_l, new_r
    return None


def cut_rows(descs: np.ndarray, grains: Sequence[int], mask: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """The ``mask`` regions with a grain, each cut in blocks of its own grain, as NIXL's compressed
    list rows (addr, grain, dev, stride=grain, count); and each region's first index in that list
    (-1: not in it)."""
    rows, bases, at = [], [], 0
    for r, (addr, size, dev) in enumerate(descs.tolist()):
        g = int(grains[r])
        if not (mask[r] and g and size // g):
            bases.append(-1)
            continue
        rows.append((addr, g, dev, g, size // g))
        bases.append(at)
        at += size // g
    return np.array(rows, dtype=np.uint64).reshape(-1, 5), bases


def cut_entries(sizes: Sequence[int], grains: Sequence[int], mask: Sequence[bool]) -> int:
    """How many entries ``cut_rows`` would make."""
    return sum(int(s) // g for s, g, m in zip(sizes, grains, mask, strict=True) if m and g)


def grain_indices(
    lists: tuple[list[int], list[int], list[int], list[int], list[int]],
    grains: Sequence[int], local_bases: Sequence[int], remote_bases: Sequence[int],
) -> tuple[list[int], list[int]]:
    """Local and remote indices of every block of every write, for a batch that ``settle_grains``
    found to fit (``grains``: the local ones, which equal the remote ones). In local order, not the
    writes' order: the blocks of rooms sent together that meet end to end on both sides then follow
    each other, and NIXL merges such neighbours into one transfer (dev VM: four 4 KiB rooms, 12
    blocks, posted and finished in 15-18 µs in that order against 31-37 µs room by room)."""
    lr, lo, rr, ro, sizes = lists
    li: list[int] = []
    ri: list[int] = []
    for a, o, b, p, s in zip(lr, lo, rr, ro, sizes, strict=True):
        g = grains[a]
        i, j, n = local_bases[a] + o // g, remote_bases[b] + p // g, s // g
        if n == 1:
            li.append(i)
            ri.append(j)
        else:
            li.extend(range(i, i + n))
            ri.extend(range(j, j + n))
    if len(li) > 1:
        pairs = sorted(zip(li, ri, strict=True))
        li, ri = [i for i, _ in pairs], [j for _, j in pairs]
    return li, ri
