"""A batch of writes as the work list of one copy kernel (``staging.kernels.copy_spans``); numpy, no I/O.

The kernel runs one program per span: ``(src, dst, length)`` in units of ``unit`` bytes, offsets from
one base pointer per side. Writes longer than ``chunk`` are cut, so a few huge writes still fill the
GPU with programs; the unit is the widest power of two (≤ 16 B) that divides every address and size,
so aligned pages move as 16-byte vectors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .batch_kernels import SPAN_FILL, SPAN_SCAN

MIN_CHUNK = 64 << 10
MAX_CHUNK = 1 << 20
PROGRAMS = 1024
"""Aim for at least this many programs per launch (an H200 has 132 SMs) before cutting below 1 MiB."""


@dataclass(frozen=True)
class Spans:
    """``table`` is int64 ``(3, n)``: source offsets, destination offsets, lengths, in ``unit`` bytes."""

    table: np.ndarray
    unit: int
    mean_units: int
    """Mean span length in units, for the kernel's tile width."""

    def __len__(self) -> int:
        return int(self.table.shape[1])


def unit_of(*arrays: np.ndarray) -> int:
    """The largest of 16, 8, 4, 2, 1 dividing every value of every array."""
    bits = 0
    for a in arrays:
        if a.size:
            bits |= int(np.bitwise_or.reduce(a, axis=None)) & 15
    return 16 if bits == 0 else bits & -bits


def chunk_for(total: int) -> int:
    """The span cut: a power of two in [64 KiB, 1 MiB], small enough to give ~``PROGRAMS`` spans."""
    want = max(1, total // PROGRAMS)
    return int(min(MAX_CHUNK, max(MIN_CHUNK, 1 << (want.bit_length() - 1))))


def plan_spans(
    src: np.ndarray, dst: np.ndarray, size: np.ndarray, bases: tuple[int, int] = (0, 0),
    alloc: Callable[[int], np.ndarray] | None = None,
) -> Spans:
    """Spans for writes ``src[i] → dst[i]`` of ``size[i]`` bytes (byte offsets from the two base
    pointers, whose addresses ``bases`` count towards the alignment). ``alloc(n)`` gives the int64
    ``(3, n)`` array to fill (pinned memory, ready for the upload); a new one by default."""
    src, dst, size = (np.asarray(a, dtype=np.int64) for a in (src, dst, size))
    if not src.shape == dst.shape == size.shape or src.ndim != 1:
        raise ValueError(f"span arrays must be 1-D and of one length: {src.shape}, {dst.shape}, {size.shape}")
    if len(size) and (size.min() <= 0 or min(src.min(), dst.min()) < 0):
        raise ValueError("spans need positive sizes and non-negative offsets")
    unit = unit_of(src | dst | size, np.array(bases, dtype=np.int64))
    shift = unit.bit_length() - 1
    total = int(size.sum())
    chunk = chunk_for(total)
    alloc = alloc or (lambda n: np.empty((3, n), dtype=np.int64))
    if len(size) == 0 or size.max() <= chunk:
        table = alloc(len(size))
        np.right_shift(src, shift, out=table[0])
        np.right_shift(dst, shift, out=table[1])
        np.right_shift(size, shift, out=table[2])
    else:
        pieces = (size + (chunk - 1)) // chunk
        first = np.repeat(np.cumsum(pieces) - pieces, pieces)
        which = np.repeat(np.arange(len(size)), pieces)
        start = (np.arange(int(pieces.sum())) - first) * chunk
        table = alloc(len(start))
        np.add(np.take(src, which), start, out=table[0])
        np.add(np.take(dst, which), start, out=table[1])
        np.minimum(chunk, np.take(size, which) - start, out=table[2])
        np.right_shift(table, shift, out=table)
    return Spans(table, unit, max(1, (total >> shift) // max(1, table.shape[1])))


Alloc = Callable[[int], np.ndarray]


def plan_writes(
    lr: np.ndarray, lo: np.ndarray, rr: np.ndarray, ro: np.ndarray, size: np.ndarray,
    addrs: tuple[np.ndarray, np.ndarray], bases: tuple[int, int], alloc: Alloc | None = None,
) -> Spans:
    """``plan_spans`` for writes given as region ids and offsets, regions at ``addrs`` (local,
    remote), offsets counted from ``bases``: two compiled passes when numba is installed
    (``batch_kernels``), else the addresses in numpy and then ``plan_spans``."""
    laddr, raddr = addrs
    if SPAN_SCAN is not None and SPAN_FILL is not None and len(size):
        try:
            bits, total, largest = SPAN_SCAN(lr, lo, rr, ro, size, laddr, raddr, bases[0], bases[1])
        except TypeError:  # arrays of other dtypes than the compiled signature's
            pass
        else:
            bits |= (bases[0] | bases[1]) & 15
            unit = 16 if bits == 0 else bits & -bits
            shift = unit.bit_length() - 1
            chunk = chunk_for(total)
            count = len(size) if largest <= chunk else int(((size + (chunk - 1)) // chunk).sum())
            table = (alloc or (lambda n: np.empty((3, n), dtype=np.int64)))(count)
            SPAN_FILL(lr, lo, rr, ro, size, laddr, raddr, bases[0], bases[1], chunk, shift, table)
            return Spans(table, unit, max(1, (total >> shift) // count))
    return plan_spans(
        _offsets(laddr, bases[0], lr, lo), _offsets(raddr, bases[1], rr, ro), size, bases, alloc
    )


def _offsets(addrs: np.ndarray, base: int, region: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """Byte offsets from ``base`` of each write's address (``take``: fancy indexing costs 3x more)."""
    if len(addrs) == 1:
        return offset + (int(addrs[0]) - base)
    return np.take(addrs, region) - base + offset
