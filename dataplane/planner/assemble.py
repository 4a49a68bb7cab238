"""One request's validated parts → one ``WritePlan``, written into a single allocation.

Each part is a group (by its position in ``Tables``) with paired, already checked indices. Parts with
one index on each side (aux slot, mamba slot, a one-page request) are *single*: consecutive single
groups fill their rows with one table lookup. Others broadcast ``items x indices`` over all of the
group's blocks at once: whole-item groups over contiguous runs (sizes ``item x run length``), sliced
groups over every index. All six columns are row views of three arrays (int64 offsets and sizes, int32
regions, int16 components) sized up front, so nothing is concatenated afterwards.

``assemble`` validates nothing itself: ``rules.checked`` has, before it is called.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from .plan import WritePlan
from .runs import paired_runs
from .tables import GroupTable, Tables

__all__ = ["Part", "assemble"]

Indices = npt.NDArray[np.integer]
Part = tuple[int, Indices, Indices]
"""(group position in ``Tables``, prefill indices, decode indices), equal lengths, checked."""
I64 = npt.NDArray[np.int64]
_Single = tuple[int, int, int, int]
_Bulk = tuple[int, I64, I64 | None, int]
_Columns = tuple[npt.NDArray[Any], ...]


class _Out:
    """The plan's storage: offsets and sizes, regions, components; columns are row views."""

    __slots__ = ("i16", "i32", "i64")

    def __init__(self, n: int) -> None:
        self.i64 = np.empty((3, n), dtype=np.int64)
        self.i32 = np.empty((2, n), dtype=np.int32)
        self.i16 = np.empty(n, dtype=np.int16)

    def columns(self) -> _Columns:
        i64, i32 = self.i64, self.i32
        return i32[0], i64[0], i32[1], i64[1], i64[2], self.i16


def assemble(tables: Tables, parts: Sequence[Part]) -> WritePlan:
    """Every write of ``parts``, in part order, each part block-major then index-major."""
    singles: list[_Single] = []
    bulk: list[_Bulk] = []
    n = 0
    for gi, src, dst in parts:
        g = tables.groups[gi]
        if src.size == 1:
            singles.append((gi, int(src[0]), int(dst[0]), n))
            n += g.blocks
        elif src.size:
            if g.whole:
                pair, lengths = paired_runs(src, dst)
            else:
                pair, lengths = np.concatenate((src, dst), dtype=np.int64).reshape(2, -1), None
            bulk.append((gi, pair, lengths, n))
            n += g.blocks * pair.shape[1]
    if n == 0:
        return WritePlan.empty()
    return WritePlan.trusted(*_materialise(tables, singles, bulk, n))


def _materialise(tables: Tables, singles: list[_Single], bulk: list[_Bulk], n: int) -> _Columns:
    out = _Out(n)
    for gi, pair, lengths, at in bulk:
        _fill_bulk(out, tables.groups[gi], pair, lengths, at)
    first = 0
    for k in range(1, len(singles) + 1):
        if k == len(singles) or singles[k][0] != singles[k - 1][0] + 1:
            _fill_singles(out, tables, singles[first:k])
            first = k
    return out.columns()


def _fill_bulk(out: _Out, g: GroupTable, pair: I64, lengths: I64 | None, at: int) -> None:
    """``offset = item x index (+ base)`` for every block and every index (or run) of one group."""
    blocks, count = g.blocks, pair.shape[1]
    end = at + blocks * count
    offsets = np.reshape(out.i64[0:2, at:end], (2, blocks, count), copy=False)
    np.multiply(g.items[:, :, None], pair[:, None, :], out=offsets)
    if g.based:
        np.add(offsets, g.bases[:, :, None], out=offsets)
    sizes = np.reshape(out.i64[2, at:end], (blocks, count), copy=False)
    if lengths is None:
        sizes[...] = g.size[:, None]
    else:
        np.multiply(g.size[:, None], lengths, out=sizes)
    np.reshape(out.i32[:, at:end], (2, blocks, count), copy=False)[...] = g.regions[:, :, None]
    out.i16[at:end] = g.component


def _fill_singles(out: _Out, tables: Tables, run: Sequence[_Single]) -> None:
    """Consecutive groups with one index each: their table rows are contiguous, so one lookup of the
    per-row index and one multiply cover all of them."""
    first, last = run[0][0], run[-1][0]
    lo, hi = tables.start[first], tables.start[last] + tables.groups[last].blocks
    at = run[0][3]
    end = at + hi - lo
    if len(run) == 1:
        index: npt.NDArray[np.int64] = np.array([[run[0][1]], [run[0][2]]], dtype=np.int64)
    else:
        per_group = np.zeros((2, len(tables.groups)), dtype=np.int64)
        for gi, s, d, _ in run:
            per_group[0, gi], per_group[1, gi] = s, d
        index = per_group[:, tables.row_group[lo:hi]]
    offsets = out.i64[0:2, at:end]
    np.multiply(tables.items[:, lo:hi], index, out=offsets)
    if tables.based:
        np.add(offsets, tables.bases[:, lo:hi], out=offsets)
    out.i64[2, at:end] = tables.size[lo:hi]
    out.i32[:, at:end] = tables.regions[:, lo:hi]
    out.i16[at:end] = tables.component[lo:hi]
