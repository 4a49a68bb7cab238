"""Byte ranges of a ``WritePlan`` → rows of a chunked view of one arena. Pure numpy, no torch.

A staged transfer moves whole rows: each side views its memory (one arena holding every region, or
one buffer per region) as ``[rows, chunk]``, where ``chunk`` divides every offset, size and region
base involved, so each page is a run of whole rows and a gather / scatter is a single row-index
kernel. Writes become ``Runs`` (region, first row inside the region, row count): compact on the wire
(one entry per planned write, not per row) and independent of where the *peer* put its regions,
since each side adds its own region bases when it expands runs into arena rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import numpy.typing as npt

from ..errors import PlanError

__all__ = ["Runs", "expand", "pick_chunk", "region_rows", "runs_of", "split"]

Ints = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Runs:
    """Row runs: ``count[i]`` rows of region ``region[i]`` from its row ``start[i]``."""

    region: npt.NDArray[np.int32]
    start: Ints
    count: Ints

    def __len__(self) -> int:
        return int(self.count.shape[0])

    @property
    def rows(self) -> int:
        return int(self.count.sum())


def pick_chunk(*arrays: npt.ArrayLike, limit: int = 1 << 20) -> int:
    """The largest power of two (bytes) dividing every value given (offsets, sizes, region bases),
    capped at ``limit``: rows are powers of two so every index step is a shift, the peer's arena
    (bases aligned to 2 MiB) accepts them, and big items split into pieces. One OR-reduction, no gcd:
    this runs per request over every write."""
    acc = 0
    for a in arrays:
        v = np.asarray(a, dtype=np.int64)
        if v.size:
            acc |= int(np.bitwise_or.reduce(v, axis=None))
    if acc <= 0:
        raise PlanError("cannot pick a staging row size: no positive offsets or sizes")
    return min(acc & -acc, 1 << (max(limit, 1).bit_length() - 1))


def region_rows(bases: npt.ArrayLike, sizes: npt.ArrayLike, chunk: int) -> tuple[Ints, Ints]:
    """(first arena row, row count) of each region from byte ``bases`` and ``sizes``. A region whose
    base is not a whole number of rows gets no rows, so ``expand`` refuses any run into it."""
    b, n = np.asarray(bases, dtype=np.int64), np.asarray(sizes, dtype=np.int64)
    if chunk <= 0:
        raise PlanError(f"row size must be positive, got {chunk}")
    return b // chunk, np.where(b % chunk == 0, n // chunk, 0)


def runs_of(region: npt.ArrayLike, offset: npt.ArrayLike, size: npt.ArrayLike, chunk: int) -> Runs:
    """One run per write (region, offset, size in bytes); every offset and size must be whole rows."""
    reg = np.asarray(region, dtype=np.int32)
    off, n = np.asarray(offset, dtype=np.int64), np.asarray(size, dtype=np.int64)
    if chunk <= 0 or (len(n) and (int(n.min()) <= 0 or int(off.min()) < 0)):
        raise PlanError(f"writes must be non-empty with non-negative offsets (row size {chunk})")
    if chunk & (chunk - 1) == 0:
        shift = chunk.bit_length() - 1
        if np.any((off | n) & (chunk - 1)):
            raise PlanError(f"writes are not whole rows of {chunk} bytes")
        return Runs(reg, off >> shift, n >> shift)
    if np.any(off % chunk) or np.any(n % chunk):
        raise PlanError(f"writes are not whole rows of {chunk} bytes")
    return Runs(reg, off // chunk, n // chunk)


def expand(runs: Runs, base_rows: npt.ArrayLike, region_rows: npt.ArrayLike) -> Ints:
    """Arena row of every row the runs cover, in run order. ``base_rows[r]`` is region ``r``'s first
    row in the arena, ``region_rows[r]`` its row count; runs outside a region raise ``PlanError``
    (the runs may come from a peer)."""
    bases, sizes = np.asarray(base_rows, dtype=np.int64), np.asarray(region_rows, dtype=np.int64)
    if len(runs) == 0:
        return np.empty(0, dtype=np.int64)
    reg = runs.region
    if np.any((reg < 0) | (reg >= len(bases))):
        raise PlanError(f"staged run names a region outside 0..{len(bases) - 1}")
    if np.any(runs.start < 0) or np.any(runs.count <= 0) or np.any(runs.start + runs.count > sizes[reg]):
        raise PlanError("staged run lies outside its region (or the region is not row-aligned)")
    first = np.cumsum(runs.count) - runs.count
    return np.repeat(bases[reg] + runs.start - first, runs.count) + np.arange(runs.rows, dtype=np.int64)


def split(runs: Runs, piece_rows: int) -> list[Runs]:
    """Cut runs into consecutive pieces of at most ``piece_rows`` rows (one staging slot each),
    splitting a run that crosses a piece boundary. O(runs), no sorting: it runs per request."""
    if piece_rows <= 0:
        raise PlanError("a staging slot must hold at least one row")
    if len(runs) == 0:
        return []
    end = np.cumsum(runs.count)
    begin = end - runs.count
    first, last = begin // piece_rows, (end - 1) // piece_rows
    if int(last[-1]) == 0:
        return [runs]
    parts = last - first + 1
    owner = np.repeat(np.arange(len(runs)), parts)
    piece = first[owner] + np.arange(len(owner)) - np.repeat(np.cumsum(parts) - parts, parts)
    lo = np.maximum(begin[owner], piece * piece_rows)
    hi = np.minimum(end[owner], (piece + 1) * piece_rows)
    region, start, count = runs.region[owner], runs.start[owner] + lo - begin[owner], hi - lo
    bounds = np.searchsorted(piece, np.arange(int(piece[-1]) + 2))
    return [Runs(region[a:b], start[a:b], count[a:b]) for a, b in pairwise(bounds)]
