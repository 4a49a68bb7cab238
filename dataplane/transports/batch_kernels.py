"""A large batch's bounds check in one compiled loop (numba), when numba is installed.

Checking a batch's bounds takes about a dozen numpy calls, each a full pass over the batch; this is
one. Its numpy twin (``base.check_bounds``' vector path), which the tests hold it to, runs where numba
is missing or ``PDPAIR_BATCH_KERNELS=0``. Compiled at first import (on-disk cache).
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


def _sig_bad(t: Any) -> Any:
    i32, i64 = t.Array(t.int32, 1, "C", readonly=True), t.Array(t.int64, 1, "C", readonly=True)
    return t.int64(i32, i64, i32, i64, i64, i64, i64)


FIRST_BAD, WHY_NOT = compiled(_first_bad, _sig_bad, ENV)
