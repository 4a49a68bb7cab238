"""Contiguous-run grouping of paired page indices, vectorised.

sglang's ``group_concurrent_contiguous`` splits paired (src, dst) index arrays wherever either side
stops increasing by exactly one; each resulting run becomes one write per buffer. Here the runs are
returned as arrays (src start, dst start, length) instead of lists of lists, so callers turn them
into byte offsets with one multiply. ``paired_runs`` is the planner's form: both sides' starts as one
``(2, runs)`` array, computed with a handful of numpy calls on the stacked pair.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ..errors import PlanError

__all__ = [
    "Runs",
    "contiguous_runs",
    "group_concurrent_contiguous",
    "interleaved",
    "paired_runs",
    "word_edges",
    "word_runs",
]

Runs = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]
I64 = npt.NDArray[np.int64]


def paired_runs(src: npt.NDArray[np.integer], dst: npt.NDArray[np.integer]) -> tuple[I64, I64]:
    """``(starts, lengths)`` for equal-length, non-empty ``src``/``dst``: ``starts[0]`` are the src
    starts, ``starts[1]`` the dst starts of the maximal runs where both sides step by +1."""
    n = src.size
    pair = np.concatenate((src, dst), dtype=np.int64).reshape(2, n)
    broken = pair[:, 1:] - pair[:, :-1] != 1
    bounds = np.empty(n + 1, dtype=np.bool_)
    bounds[0] = bounds[n] = True
    np.logical_or(broken[0], broken[1], out=bounds[1:n])
    edges = np.flatnonzero(bounds)
    starts = edges[:-1]
    return pair[:, starts], edges[1:] - starts


def contiguous_runs(src: npt.NDArray[np.integer], dst: npt.NDArray[np.integer]) -> Runs:
    """``(src_start, dst_start, length)`` of the maximal runs where both sides step by +1."""
    if src.size != dst.size:
        raise PlanError(f"paired index arrays differ in length: src {src.size}, dst {dst.size}")
    if src.size == 0:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty.copy(), empty.copy()
    starts, lengths = paired_runs(src.ravel(), dst.ravel())
    return starts[0], starts[1], lengths.astype(np.int64, copy=False)


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


_BOTH_STEP = (1 << 32) + 1
"""Two lanes that both step by +1, as the step of the 64-bit words the lanes form (either endianness)."""


def interleaved(src: npt.NDArray[np.int32], dst: npt.NDArray[np.int32]) -> npt.NDArray[np.int32]:
    """``(n, 2)`` int32 rows ``(src[i], dst[i])``: each row is one 64-bit word, so one subtraction of
    words and one compare find the runs, and one gather picks both sides' starts."""
    buf = np.empty((src.size, 2), dtype=np.int32)
    buf[:, 0] = src
    buf[:, 1] = dst
    return buf


def word_edges(buf: npt.NDArray[np.int32]) -> npt.NDArray[np.intp]:
    """Run boundaries of an ``interleaved`` pair: ``edges[k]`` is run ``k``'s first row and
    ``edges[-1] == len(buf)``, so run ``k`` is ``buf[edges[k]:edges[k + 1]]``.

    Only for indices already checked to lie in ``0 <= i < 2**31``. Then a word is ``hi * 2**32 + lo``
    with both lanes non-negative, and a word step of ``2**32 + 1`` means ``(hi step - 1) * 2**32 ==
    1 - lo step``, where ``|1 - lo step| < 2**32``: both lanes stepped by exactly 1."""
    n = len(buf)
    words = buf.view(np.int64).reshape(n)
    bounds = np.empty(n + 1, dtype=np.bool_)
    bounds[0] = bounds[n] = True
    np.not_equal(words[1:] - words[:-1], _BOTH_STEP, out=bounds[1:n])
    return bounds.nonzero()[0]


def word_runs(buf: npt.NDArray[np.int32]) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.intp]]:
    """``(starts, lengths)`` of the runs of an ``interleaved`` pair (see ``word_edges``): ``starts``
    is ``(runs, 2)``, the rows that start each run."""
    edges = word_edges(buf)
    starts = edges[:-1]
    return buf.take(starts, axis=0), edges[1:] - starts
