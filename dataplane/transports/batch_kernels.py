"""A large batch's host passes in one compiled loop each (numba), when numba is installed.

Checking a batch's bounds and building its copy kernel's span table take about twenty numpy calls,
each a full pass over the batch: ~0.25 ms for 16K page writes on the H200 machine's host, several
times the GPU copy of those pages. Each function here is one pass. Both have numpy twins
(``base.check_bounds``'s vector path, ``spans.plan_spans``), which the tests hold them to, and which
run where numba is missing or ``PDPAIR_BATCH_KERNELS=0``. Compiled at first import (on-disk cache).
"""

from __future__ import annotations

from typing import Any

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


def _span_scan(lr: Any, lo: Any, rr: Any, ro: Any, size: Any, laddr: Any, raddr: Any, lbase: int,
               rbase: int) -> tuple[int, int, int]:
    """(low four bits of every source offset, destination offset and size OR-ed, total, largest)."""
    bits, total, largest = 0, 0, 0
    for i in range(size.shape[0]):
        n = size[i]
        bits |= (laddr[lr[i]] - lbase + lo[i]) | (raddr[rr[i]] - rbase + ro[i]) | n
        total += n
        largest = max(largest, n)
    return bits & 15, total, largest


def _span_fill(lr: Any, lo: Any, rr: Any, ro: Any, size: Any, laddr: Any, raddr: Any, lbase: int,
               rbase: int, chunk: int, shift: int, out: Any) -> int:
    """Fill ``out`` (3, m) with the spans, each write cut in ``chunk`` bytes, in units of
    ``1 << shift`` bytes; returns how many columns were written."""
    j = 0
    for i in range(size.shape[0]):
        s = laddr[lr[i]] - lbase + lo[i]
        d = raddr[rr[i]] - rbase + ro[i]
        n = size[i]
        if n <= chunk:
            out[0, j] = s >> shift
            out[1, j] = d >> shift
            out[2, j] = n >> shift
            j += 1
            continue
        k = 0
        while k < n:
            out[0, j] = (s + k) >> shift
            out[1, j] = (d + k) >> shift
            out[2, j] = min(chunk, n - k) >> shift
            j += 1
            k += chunk
    return j


def _sig_bad(t: Any) -> Any:
    i32, i64 = t.Array(t.int32, 1, "C", readonly=True), t.Array(t.int64, 1, "C", readonly=True)
    return t.int64(i32, i64, i32, i64, i64, i64, i64)


def _sig_scan(t: Any) -> Any:
    i32, i64 = t.Array(t.int32, 1, "C", readonly=True), t.Array(t.int64, 1, "C", readonly=True)
    return t.UniTuple(t.int64, 3)(i32, i64, i32, i64, i64, i64, i64, t.int64, t.int64)


def _sig_fill(t: Any) -> Any:
    i32, i64 = t.Array(t.int32, 1, "C", readonly=True), t.Array(t.int64, 1, "C", readonly=True)
    out = t.Array(t.int64, 2, "C")
    return t.int64(i32, i64, i32, i64, i64, i64, i64, t.int64, t.int64, t.int64, t.int64, out)


FIRST_BAD, WHY_NOT = compiled(_first_bad, _sig_bad, ENV)
SPAN_SCAN, _ = compiled(_span_scan, _sig_scan, ENV) if FIRST_BAD is not None else (None, "")
SPAN_FILL, _ = compiled(_span_fill, _sig_fill, ENV) if FIRST_BAD is not None else (None, "")
