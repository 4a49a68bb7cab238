"""Block arithmetic for engines that address memory by index into prepared descriptor lists (NIXL).

A batch of writes whose offsets and sizes are all multiples of ``g`` can be expressed as indices into
lists that cut every region into ``g``-byte blocks. Pure numpy, no engine: unit-testable on its own.
"""

from __future__ import annotations

import math

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
