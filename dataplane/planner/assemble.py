"""One request's validated parts → one ``WritePlan``, written into a single allocation.

Each part is a group (by its position in ``Tables``) with paired, already checked indices. Parts with
one index on each side (aux slot, mamba slot, a one-page request) are *single*: consecutive single
groups fill their rows with one table lookup. Others broadcast ``items x indices`` over all of the
group's blocks at once: whole-item groups over contiguous runs (sizes ``item x run length``), strided
groups over contiguous runs too (one compact row per block and run: ``count x run length`` writes, see
``WritePlan.repeat``), other sliced groups over every index. All six columns are row views of three
arrays (int64 offsets and sizes, int32 regions, int16 components; a compact plan's ``repeat`` a
fourth) sized up front, so nothing is concatenated afterwards.

``Builder`` validates nothing itself: ``rules.checked`` (or ``rules.checked_runs``) has, before a
part is added.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from .plan import WritePlan
from .runs import paired_runs
from .tables import GroupTable, Tables

__all__ = ["Builder", "Part", "assemble"]

Indices = npt.NDArray[np.integer]
Part = tuple[int, Indices, Indices]
"""(group position in ``Tables``, prefill indices, decode indices), equal lengths, checked."""
I64 = npt.NDArray[np.int64]
_Single = tuple[int, int, int, int]
_Bulk = tuple[int, npt.NDArray[np.integer], npt.NDArray[np.integer] | None, int]
"""(group, ``(2, count)`` prefill/decode indices or run starts, run lengths or None, first row)."""
_Columns = tuple[npt.NDArray[Any], ...]


class Builder:
    """Collects one request's parts (rows counted as they come), then writes every row at once."""

    __slots__ = ("bulk", "n", "singles", "strided", "tables")

    def __init__(self, tables: Tables) -> None:
        self.tables = tables
        self.singles: list[_Single] = []
        self.bulk: list[_Bulk] = []
        self.n = 0
        self.strided = False

    def single(self, gi: int, src: int, dst: int) -> None:
        self.singles.append((gi, src, dst, self.n))
        self.n += self.tables.blocks[gi]

    def runs(self, gi: int, starts: npt.NDArray[np.integer], lengths: npt.NDArray[np.integer]) -> None:
        """A whole-item or strided group's contiguous runs: ``starts`` is ``(2, runs)`` (prefill,
        decode)."""
        self.bulk.append((gi, starts, lengths, self.n))
        self.n += self.tables.blocks[gi] * starts.shape[1]
        self.strided = self.strided or self.tables.groups[gi].strided

    def add(self, gi: int, src: Indices, dst: Indices) -> None:
        """Any checked part: single, runs of a whole-item or strided group, or every index of another
        sliced group."""
        group = self.tables.groups[gi]
        if src.size == 1 and not group.strided:
            self.single(gi, int(src[0]), int(dst[0]))
        elif src.size:
            if group.whole or group.strided:
                self.runs(gi, *paired_runs(src, dst))
            else:
                pair = np.concatenate((src, dst), dtype=np.int64).reshape(2, -1)
                self.bulk.append((gi, pair, None, self.n))
                self.n += self.tables.groups[gi].blocks * pair.shape[1]

    def plan(self) -> WritePlan:
        """Every write, in part order, each part block-major then index-major."""
        n = self.n
        if n == 0:
            return WritePlan.empty()
        i64 = np.empty((3, n), dtype=np.int64)
        i32 = np.empty((2, n), dtype=np.int32)
        i16 = np.empty(n, dtype=np.int16)
        repeat = None
        if self.strided:
            repeat = np.zeros((3, n), dtype=np.int64)
            repeat[0] = 1
        for gi, pair, lengths, at in self.bulk:
            group = self.tables.groups[gi]
            if repeat is not None and group.strided and lengths is not None:
                _fill_strided(i64, repeat, group, pair, lengths, at)
            else:
                _fill_bulk(i64, group, pair, lengths, at)
            end = at + group.blocks * pair.shape[1]
            i32[:, at:end].reshape(2, group.blocks, pair.shape[1])[...] = group.regions[:, :, None]
            i16[at:end] = group.component
        singles, first = self.singles, 0
        for k in range(1, len(singles) + 1):
            if k == len(singles) or singles[k][0] != singles[k - 1][0] + 1:
                _fill_singles(i64, i32, i16, self.tables, singles[first:k])
                first = k
        return WritePlan.trusted(i32[0], i64[0], i32[1], i64[1], i64[2], i16, repeat)


def assemble(tables: Tables, parts: Sequence[Part]) -> WritePlan:
    """Every write of ``parts``, in part order, each part block-major then index-major."""
    builder = Builder(tables)
    for gi, src, dst in parts:
        builder.add(gi, src, dst)
    return builder.plan()


def _fill_bulk(
    i64: I64,
    g: GroupTable,
    pair: npt.NDArray[np.integer],
    lengths: npt.NDArray[np.integer] | None,
    at: int,
) -> None:
    """``offset = item x index (+ base)`` for every block and every index (or run) of one group.

    The row slices of the C-ordered outputs only split their last, unit-stride axis, so each
    ``reshape`` is a view of the plan's storage (numpy never needs a copy for that)."""
    blocks, count = g.blocks, pair.shape[1]
    end = at + blocks * count
    if g.family is not None:
        _fill_family(i64[:, at:end].reshape(3, blocks, count), g, g.family, pair, lengths)
    else:
        offsets = i64[0:2, at:end].reshape(2, blocks, count)
        np.multiply(g.items[:, :, None], pair[:, None, :], out=offsets)
        if g.based:
            np.add(offsets, g.bases[:, :, None], out=offsets)
        sizes = i64[2, at:end].reshape(blocks, count)
        if lengths is None:
            sizes[...] = g.size[:, None]
        else:
            np.multiply(g.size[:, None], lengths, out=sizes)


def _fill_strided(
    i64: I64,
    repeat: I64,
    g: GroupTable,
    starts: npt.NDArray[np.integer],
    lengths: npt.NDArray[np.integer],
    at: int,
) -> None:
    """A strided group's compact rows, one per block and run: the run's first item's block, the
    block's size, ``count x run length`` writes at the block's strides."""
    blocks, count = g.blocks, starts.shape[1]
    end = at + blocks * count
    offsets = i64[0:2, at:end].reshape(2, blocks, count)
    np.multiply(g.items[:, :, None], starts[:, None, :], out=offsets)
    if g.based:
        np.add(offsets, g.bases[:, :, None], out=offsets)
    i64[2, at:end].reshape(blocks, count)[...] = g.size[:, None]
    np.multiply(g.count[:, None], lengths, out=repeat[0, at:end].reshape(blocks, count))
    repeat[1:3, at:end].reshape(2, blocks, count)[...] = g.strides[:, :, None]


def _fill_family(
    out: I64,
    g: GroupTable,
    family: I64,
    pair: npt.NDArray[np.integer],
    lengths: npt.NDArray[np.integer] | None,
) -> None:
    """Blocks sharing item lengths and size: ``[offsets; size]`` once per index, then one broadcast
    over the blocks (adding each block's base when there are any)."""
    one = np.empty((3, pair.shape[1]), dtype=np.int64)
    np.multiply(family[0:2], pair, out=one[0:2])
    if lengths is None:
        one[2] = family[2, 0]
    else:
        np.multiply(family[2], lengths, out=one[2])
    if g.based:
        np.add(one[0:2, None, :], g.bases[:, :, None], out=out[0:2])
        out[2] = one[2]
    else:
        out[...] = one[:, None, :]


def _fill_singles(
    i64: I64, i32: npt.NDArray[np.int32], i16: npt.NDArray[np.int16], tables: Tables, run: Sequence[_Single]
) -> None:
    """Consecutive groups with one index each: their table rows are contiguous, so one lookup of the
    per-row ``[src; dst; 1]`` index and one multiply give all their offsets and sizes."""
    first, last = run[0][0], run[-1][0]
    lo, hi = tables.start[first], tables.start[last] + tables.groups[last].blocks
    at = run[0][3]
    end = at + hi - lo
    if len(run) == 1:
        index: npt.NDArray[np.int64] = np.array([[run[0][1]], [run[0][2]], [1]], dtype=np.int64)
    else:
        per_group = tables.index.copy()
        for gi, s, d, _ in run:
            per_group[0, gi], per_group[1, gi] = s, d
        index = per_group.take(tables.row_group[lo:hi], axis=1)
    np.multiply(tables.scale[:, lo:hi], index, out=i64[:, at:end])
    if tables.based:
        np.add(i64[0:2, at:end], tables.bases[:, lo:hi], out=i64[0:2, at:end])
    i32[:, at:end] = tables.regions[:, lo:hi]
    i16[at:end] = tables.component[lo:hi]
