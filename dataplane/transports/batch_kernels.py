"""A batch's host-side passes as compiled loops (numba), when numba is installed.

Each replaces about a dozen numpy calls (each a full pass over the batch, and a fixed few µs on a
busy host) with one: ``FIRST_BAD``, a large batch's bounds check; ``PACK_STRIDED``, the ``cuda-ipc``
copy kernel's table and launch geometry for a strided batch. Their numpy twins
(``base.check_bounds``' vector path; ``copy_kernel.pack`` and ``strided_geometry``), which the tests
hold them to, run where numba is missing or ``PDPAIR_BATCH_KERNELS=0``. Compiled at first import
(on-disk cache).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..planner.kernel import compiled

ENV = "PDPAIR_BATCH_KERNELS"


def _first_bad(lr: Any, lo: Any, rr: Any, ro: Any, size: Any, lsizes: Any, rsizes: Any) -> int:
    """Index of the first write outside its local or remote region (or with a bad size, offset or
    region id); -1 when every write is inside."""
    nl, nr = lsizes.shape[0], rsizes.shape[0]
    for i in range(size.shape[0]):
        n, a, b = size[i], lr[i], rr[i]
        if n <= 0 or lo[i] < 0 or ro[i] < 0 or a < 0 or a >= nl or b < 0 or b >= nr:
            return i
        if lo[i] + n > lsizes[a] or ro[i] + n > rsizes[b]:
            return i
    return -1


def _sig_bad(t: Any) -> Any:
    i32, i64 = t.Array(t.int32, 1, "C", readonly=True), t.Array(t.int64, 1, "C", readonly=True)
    return t.int64(i32, i64, i32, i64, i64, i64, i64)


FIRST_BAD, WHY_NOT = compiled(_first_bad, _sig_bad, ENV)


def _pack_strided(
    table: Any, lr: Any, lo: Any, rr: Any, ro: Any, size: Any, rep: Any, cols: Any, cap: int,
    programs: int, max_y: int,
) -> tuple[int, int, int]:
    """``copy_kernel.pack`` of a strided batch into ``table`` and its ``strided_geometry``:
    (bytes per program, grid rows per entry, tile width in words)."""
    n = size.shape[0]
    table[0] = n
    total = 0
    writes = 0
    widths = np.zeros(cols.shape[0] + 1, np.int64)
    for i in range(n):
        table[1 + i] = lr[i]
        table[1 + n + i] = lo[i]
        table[1 + 2 * n + i] = rr[i]
        table[1 + 3 * n + i] = ro[i]
        table[1 + 4 * n + i] = size[i]
        table[1 + 5 * n + i] = rep[0, i]
        table[1 + 6 * n + i] = rep[1, i]
        table[1 + 7 * n + i] = rep[2, i]
        s, c = max(size[i], 1), max(rep[0, i], 1)
        total += s * c
        writes += c
        w = 0
        while w < cols.shape[0] and cols[w] < (s + 7) // 8:
            w += 1
        widths[w] += c
    chunk = max(1, min(cap, -(-max(total, 1) // programs)))
    while True:
        splits = 0
        for i in range(n):
            per = max(1, chunk // max(size[i], 1))
            splits = max(splits, -(-max(rep[0, i], 1) // per))
        if splits <= max_y:
            break
        chunk *= 2
    half, seen, w = (writes + 1) // 2, 0, 0
    while w < cols.shape[0] - 1:
        seen += widths[w]
        if seen >= half:
            break
        w += 1
    return chunk, splits, cols[w]


def _sig_pack(t: Any) -> Any:
    i32, i64 = t.Array(t.int32, 1, "C", readonly=True), t.Array(t.int64, 1, "C", readonly=True)
    rep = t.Array(t.int64, 2, "A", readonly=True)
    return t.UniTuple(t.int64, 3)(t.Array(t.int64, 1, "C"), i32, i64, i32, i64, i64, rep, i64, t.int64,
                                  t.int64, t.int64)


PACK_STRIDED, _ = compiled(_pack_strided, _sig_pack, ENV)
