"""Contiguous-run grouping of paired page indices, vectorised.

sglang's ``group_concurrent_contiguous`` splits paired (src, dst) index arrays wherever either side
stops increasing by exactly one; each resulting run becomes one write per buffer. Here the runs are
returned as three arrays (src start, dst start, length) instead of lists of lists, so callers turn them
into byte offsets with one multiply.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ..errors import PlanError

__all__ = ["Runs", "contiguous_runs", "group_concurrent_contiguous"]

Runs = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]


def contiguous_runs(src: npt.NDArray[np.integer], dst: npt.NDArray[np.integer]) -> Runs:
    """``(src_start, dst_start, length)`` of the maximal runs where both sides step by +1."""
    if src.size != dst.size:
        raise PlanError(f"paired index arrays differ in length: src {src.size}, dst {dst.size}")
    if src.size == 0:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty.copy(), empty.copy()
    s = src.astype(np.int64, copy=False)
    d = dst.astype(np.int64, copy=False)
    breaks = np.flatnonzero((np.diff(s) != 1) | (np.diff(d) != 1)) + 1
    starts = np.concatenate(([0], breaks))
    lengths = np.diff(np.concatenate((starts, [s.size])))
    return s[starts], d[starts], lengths


def group_concurrent_contiguous(
    src: npt.NDArray[np.integer], dst: npt.NDArray[np.integer]
) -> tuple[list[list[int]], list[list[int]]]:
    """sglang's list-of-lists shape, for comparing against its vectors; an empty side gives no groups."""
    if src.size == 0 or dst.size == 0:
        return [], []
    s_start, d_start, length = contiguous_runs(src, dst)
    src_groups = [list(range(a, a + n)) for a, n in zip(s_start.tolist(), length.tolist(), strict=True)]
    dst_groups = [list(range(a, a + n)) for a, n in zip(d_start.tolist(), length.tolist(), strict=True)]
    return src_groups, dst_groups
