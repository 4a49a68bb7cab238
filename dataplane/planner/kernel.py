"""The common request shape's plan as one compiled call (numba), when numba is installed.

``CommonShape.plan`` in numpy is about twenty numpy calls, each a fixed ~0.5-1.5 µs whatever its size,
for ~2,600 rows; this kernel does the same work in one call: one pass over both sides' pages (range
check and the runs), the three output arrays, the runs copied for every KV buffer, and the
single-index rows. The call needs at least one page (``CommonShape`` never calls it with none). It
writes exactly the numpy path's rows (the tests compare the two, and both with the general path); it
declines (empty arrays) where the numpy path declines on range (pages and state slots; the caller
checks the aux slots, which come as plain ints), and the caller then falls back the same way.

numba is an optional dependency (the ``agent`` extra pins it): without it, or with
``PDPAIR_PLANNER_KERNEL=0`` in the environment, ``KERNEL`` is ``None`` and the numpy path runs.
The kernel is compiled for one signature when this module is first imported (so an agent pays for it
at start-up, never on a request), with numba's on-disk cache where one is writable: importing the
planner then takes ~0.5 s more (numba itself and the cached kernel), ~1.8 s the first time (compiling).
The kernel holds no state and releases the GIL (``nogil``); any thread may call it. ``KERNEL`` is its
compiled entry point (``entry_point``), which converts its arguments without matching their types to
the signature, so its one caller (``CommonShape.plan``) checks every array's dtype and dimensions.

The per-peer ``table`` (``pack_table``) is one flat int64 array; a call passes it, both sides' pages,
both aux slots (ints) and both sides' state slots (int32, one per component: a decoded message's
arrays as they are)::

    [kv_limit, item, blocks, singles, based, components,
     kv_local_region (blocks), kv_remote_region (blocks),
     scale (3 x singles), gather (3 x singles), bases (2 x singles),
     local_region (singles), remote_region (singles), component (singles),
     state_limit (2 x components: prefill's, then decode's)]
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from ..schema import KV_COMPONENT

__all__ = ["HEADER", "KERNEL", "compiled", "describe", "entry_point", "pack_table"]

log = logging.getLogger(__name__)

HEADER = 6
"""Entries before the per-block tables in a packed table."""
ENV = "PDPAIR_PLANNER_KERNEL"

Kernel = Callable[
    [
        npt.NDArray[np.int32],
        npt.NDArray[np.int32],
        npt.NDArray[np.int64],
        int,
        int,
        npt.NDArray[np.int32],
        npt.NDArray[np.int32],
    ],
    tuple[npt.NDArray[np.int64], npt.NDArray[np.int32], npt.NDArray[np.int16]],
]


def pack_table(
    kv_limit: int,
    item: int,
    kv_regions: npt.NDArray[np.int32],
    scale: npt.NDArray[np.int64],
    gather: npt.NDArray[np.intp],
    bases: npt.NDArray[np.int64] | None,
    regions: npt.NDArray[np.int32],
    component: npt.NDArray[np.int16],
    state_limits: npt.NDArray[np.int64],
) -> npt.NDArray[np.int64]:
    """The kernel's per-peer table (see the module docstring), read-only. ``state_limits`` is
    ``(2, components)``: each component's item count on the prefill side, then on the decode side."""
    blocks, singles = kv_regions.shape[1], scale.shape[1]
    parts: list[Any] = [
        [kv_limit, item, blocks, singles, int(bases is not None), state_limits.shape[1]],
        kv_regions.reshape(2, blocks).ravel(),
        scale.ravel(),
        gather.ravel(),
        (bases if bases is not None else np.zeros((2, singles), np.int64)).ravel(),
        regions.ravel(),
        component,
        state_limits.ravel(),
    ]
    table = np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])
    table.setflags(write=False)
    return table


def _source(
    src: Any, dst: Any, table: Any, src_aux: Any, dst_aux: Any, src_slots: Any, dst_slots: Any
) -> Any:
    """The kernel's source, compiled by numba for ``_compile``'s one signature: ``src`` and ``dst``
    int32 pages (any strides), the packed ``table``, the aux slots (in range: the caller checks
    them) and each component's state slot on either side (int32, any strides)."""
    limit, item, blocks, singles, based = table[0], table[1], table[2], table[3], table[4]
    n, components = src.shape[0], table[5]
    if src_slots.shape[0] != components or dst_slots.shape[0] != components:
        return (np.empty((3, 0), np.int64), np.empty((2, 0), np.int32), np.empty(0, np.int16))
    # The request's single indices, [src per group..., dst per group..., 1] (aux, then each
    # component: what the table's ``gather`` picks from), each state slot checked against its limit.
    picks = np.empty(2 * components + 3, np.int64)
    picks[0], picks[components + 1], picks[2 * components + 2] = src_aux, dst_aux, 1
    limits = HEADER + 2 * blocks + 11 * singles
    for c in range(components):
        s, d = np.int64(src_slots[c]), np.int64(dst_slots[c])
        if s < 0 or d < 0 or s >= table[limits + c] or d >= table[limits + components + c]:
            return (np.empty((3, 0), np.int64), np.empty((2, 0), np.int32), np.empty(0, np.int16))
        picks[1 + c], picks[components + 2 + c] = s, d
    first = np.empty((3, n), np.int64)  # the runs' [src offset; dst offset; size], as in numpy
    # Unsigned indices wherever an index meets an array (numba checks a signed index for
    # wraparound on every access, which costs a quarter of the call and keeps the copy loops from
    # vectorising). No signed value may meet them: numba widens uint64 with int64 to float64.
    runs, one = np.uint64(0), np.uint64(1)
    prev_s = prev_d = np.int64(-2)
    for i in range(np.uint64(n)):  # range check of both sides and the runs, in one pass
        s, d = np.int64(src[i]), np.int64(dst[i])
        if s < 0 or d < 0 or s >= limit or d >= limit:
            return (np.empty((3, 0), np.int64), np.empty((2, 0), np.int32), np.empty(0, np.int16))
        if s == prev_s + 1 and d == prev_d + 1:
            first[2, runs - one] += item
        else:
            first[0, runs] = s * item
            first[1, runs] = d * item
            first[2, runs] = item
            runs += one
        prev_s, prev_d = s, d
    kv_rows = blocks * np.int64(runs)
    rows = kv_rows + singles
    i64 = np.empty((3, rows), np.int64)
    i32 = np.empty((2, rows), np.int32)
    i16 = np.empty(rows, np.int16)
    u_runs = np.uint64(runs)
    for j in range(3):  # every KV buffer writes the same runs
        row, runs_j = i64[j], first[j]
        for b in range(blocks):
            at = np.uint64(b) * u_runs
            for r in range(u_runs):
                row[at + r] = runs_j[r]
    local, remote = i32[0], i32[1]
    for b in range(blocks):
        at = np.uint64(b) * u_runs
        region = np.int32(table[HEADER + b])
        for r in range(u_runs):
            local[at + r] = region
        region = np.int32(table[HEADER + blocks + b])
        for r in range(u_runs):
            remote[at + r] = region
    for r in range(np.uint64(kv_rows)):
        i16[r] = KV_COMPONENT
    scale = HEADER + 2 * blocks
    gather, bases, regions = scale + 3 * singles, scale + 6 * singles, scale + 8 * singles
    # The single-index rows: table scale x the request's pick, plus any base (tested once, so no
    # row loop branches).
    u_singles, u_kv = np.uint64(singles), np.uint64(kv_rows)
    u_scale, u_gather = np.uint64(scale), np.uint64(gather)
    for j in range(3):
        row, at = i64[j], np.uint64(j) * u_singles
        for r in range(u_singles):
            row[u_kv + r] = table[u_scale + at + r] * picks[np.uint64(table[u_gather + at + r])]
    if based:
        u_bases = np.uint64(bases)
        for j in range(2):
            row, at = i64[j], np.uint64(j) * u_singles
            for r in range(u_singles):
                row[u_kv + r] += table[u_bases + at + r]
    u_regions = np.uint64(regions)
    for r in range(u_singles):
        local[u_kv + r] = table[u_regions + r]
        remote[u_kv + r] = table[u_regions + u_singles + r]
        i16[u_kv + r] = table[u_regions + np.uint64(2) * u_singles + r]
    return (i64, i32, i16)


def _compile() -> Kernel | None:
    """The compiled kernel, or ``None`` (numba missing, disabled by ``PDPAIR_PLANNER_KERNEL=0``, or
    failing to compile: then with a warning in the log)."""
    global _WHY_NOT
    kernel, _WHY_NOT = compiled(_source, _signature, ENV)
    return cast(Kernel | None, kernel if kernel is None else entry_point(kernel))


def entry_point(dispatcher: Any) -> Any:
    """The compiled code of a kernel built for one signature, called without numba's dispatcher
    (which matches every argument's type to its signatures first: a quarter of this kernel's fixed
    cost per call), or ``dispatcher`` itself where numba offers no such entry. It converts arrays
    without checking their dtype or dimensions, so a caller passes only what the signature names:
    ``CommonShape._plan`` checks the request's pages (int32, 1-D); the table and the picks it makes."""
    overloads = getattr(dispatcher, "overloads", None)
    if not isinstance(overloads, dict) or len(overloads) != 1:
        return dispatcher
    entry = getattr(next(iter(overloads.values())), "entry_point", None)
    return entry if callable(entry) else dispatcher


def _signature(t: Any) -> Any:
    pages = t.Array(t.int32, 1, "A", readonly=True)
    table = t.Array(t.int64, 1, "C", readonly=True)
    out = t.Tuple((t.Array(t.int64, 2, "C"), t.Array(t.int32, 2, "C"), t.Array(t.int16, 1, "C")))
    return out(pages, pages, table, t.int64, t.int64, pages, pages)


def compiled(source: Callable[..., Any], signature: Callable[[Any], Any], env: str) -> tuple[Any, str]:
    """``source`` compiled by numba for ``signature(numba.types)`` (nogil, on-disk cache where one is
    writable), or ``(None, why not)``: numba missing, ``env=0`` in the environment, or a failure to
    compile (logged). Shared by every compiled fast path, each with a numpy twin."""
    if os.environ.get(env, "1") == "0":
        return None, f"{env}=0"
    try:
        import numba
    except ImportError:
        return None, "numba not installed"
    sig = signature(numba.types)

    def jit(cache: bool) -> Any:
        return numba.njit(sig, cache=cache, nogil=True, boundscheck=False, error_model="numpy")(source)

    try:
        try:
            return jit(cache=True), ""
        except RuntimeError:  # no writable cache location: compile in memory, every start-up
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return jit(cache=False), ""
    except Exception as exc:
        log.warning("%s unavailable (%s: %s); using numpy", source.__name__, type(exc).__name__, exc)
        return None, f"kernel failed to compile: {type(exc).__name__}"


_WHY_NOT = ""


def describe() -> str:
    """What plans the common shape in this process, for benchmark reports."""
    if KERNEL is not None:
        return f"numba {_numba_version()} kernel"
    return f"numpy ({_WHY_NOT or 'no kernel'})"


def _numba_version() -> str:
    import numba

    return str(numba.__version__)


KERNEL: Kernel | None = _compile()
