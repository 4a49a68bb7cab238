"""Per-peer write tables: each group's blocks laid out so a request's writes are one broadcast away.

A group's writes are always ``offset = item * index + base`` per block, on both sides at once, so the
tables stack the two sides: ``regions`` and ``items``/``bases`` are ``(2, blocks)`` (row 0 prefill,
row 1 decode). ``Tables`` also concatenates every group's blocks in canonical group order (KV, aux,
components), so the single-index groups of a request (aux slot, mamba slot) fill their rows with one
lookup instead of one small plan each. Built once per ``Pairing``.

A TP-sliced block that recurs at a fixed stride within the item (a head slice of each token of a KV
page) is one *strided* block: ``count`` copies per item, ``strides`` apart on each side (the item over
the count, so a run of consecutive items continues the same stride and is one compact row).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["GroupTable", "Tables"]

I64 = npt.NDArray[np.int64]


def _frozen(arr: npt.NDArray[Any]) -> npt.NDArray[Any]:
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True, eq=False)
class GroupTable:
    """One group's blocks. ``whole`` groups have one block per tensor covering the item (equal on both
    sides), so contiguous runs of items coalesce; ``based`` says whether any base is non-zero.

    ``family`` is ``[[prefill item], [decode item], [size]]`` (a ``(3, 1)`` column) when every block
    shares them (e.g. all KV buffers of one item length): a request's offsets and sizes are then
    computed once per index or run and broadcast over the blocks.

    ``count`` and ``strides`` (``(2, blocks)``) describe strided blocks (see the module docstring);
    ``strided`` says whether any block recurs (count above 1): such a group is planned as compact
    rows, one per block and run of items."""

    regions: npt.NDArray[np.int32]
    items: I64
    bases: I64
    size: I64
    component: int
    whole: bool
    based: bool
    count: I64
    strides: I64
    strided: bool
    family: I64 | None = None

    @classmethod
    def build(
        cls,
        regions: tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]],
        items: tuple[I64, I64],
        bases: tuple[I64, I64],
        size: I64,
        component: int,
        whole: bool,
        count: I64 | None = None,
    ) -> GroupTable:
        base = np.array(bases, dtype=np.int64).reshape(2, -1)
        item = np.array(items, dtype=np.int64).reshape(2, -1)
        sizes = np.array(size, dtype=np.int64).reshape(-1)
        counts = np.ones(len(sizes), dtype=np.int64) if count is None else np.array(count, dtype=np.int64)
        stacked = np.concatenate((item, sizes[None, :]))
        uniform = stacked.shape[1] > 0 and bool((stacked == stacked[:, :1]).all())
        return cls(
            _frozen(np.array(regions, dtype=np.int32).reshape(2, -1)),
            _frozen(item),
            _frozen(base),
            _frozen(sizes),
            component,
            whole,
            bool(base.any()),
            _frozen(counts),
            _frozen(item // counts),
            bool((counts > 1).any()),
            _frozen(stacked[:, :1].copy()) if uniform else None,
        )

    @property
    def blocks(self) -> int:
        return len(self.size)


@dataclass(frozen=True, eq=False)
class Tables:
    """All groups' blocks concatenated; ``start[g]`` is group ``g``'s first row, ``row_group`` maps
    each row back to its group."""

    groups: tuple[GroupTable, ...]
    start: tuple[int, ...]
    regions: npt.NDArray[np.int32]
    items: I64
    bases: I64
    size: I64
    component: npt.NDArray[np.int16]
    row_group: npt.NDArray[np.intp]
    based: bool
    scale: I64
    """``items`` over ``size``: ``(3, rows)``, so one multiply by a per-row ``[src; dst; 1]`` index
    gives both offsets and the size."""
    index: I64
    """``(3, groups)``: zeros over ones, the per-group index template a request's singles fill in."""
    blocks: tuple[int, ...]
    """Each group's block count (rows per index or run)."""

    @classmethod
    def build(cls, groups: Sequence[GroupTable]) -> Tables:
        counts = [g.blocks for g in groups]
        start = tuple(int(s) for s in np.cumsum([0, *counts])[:-1])
        comps = [np.full(g.blocks, g.component, dtype=np.int16) for g in groups]
        items = np.concatenate([g.items for g in groups], axis=1)
        size = np.concatenate([g.size for g in groups])
        index = np.zeros((3, len(groups)), dtype=np.int64)
        index[2] = 1
        return cls(
            tuple(groups),
            start,
            _frozen(np.concatenate([g.regions for g in groups], axis=1)),
            _frozen(items),
            _frozen(np.concatenate([g.bases for g in groups], axis=1)),
            _frozen(size),
            _frozen(np.concatenate(comps)),
            _frozen(np.repeat(np.arange(len(groups), dtype=np.intp), counts)),
            any(g.based for g in groups),
            _frozen(np.concatenate((items, size[None, :]))),
            _frozen(index),
            tuple(counts),
        )
