"""The ``cuda-ipc`` transport's copy kernel: a batch of writes, as the plan gives them (region ids and
offsets), copied page to page on the GPU in one launch.

The kernel works out each write's addresses, bounds and alignment itself, so the host's cost of a
batch is one packing copy and a launch, whatever its number of writes. Building a per-write work list
on the host instead (the first version) cost 0.1-0.25 ms per 16K pages on the H200 machine, and 2-3x
that inside the agent, where one room at a time runs on cold caches (docs/gpu.md): far more than the
GPU's 50 µs copy.

- Host side (numpy, no I/O, tested on CPU): ``pack`` lays a batch out as one int64 table for one
  upload; ``geometry`` picks the launch; ``replay`` is the kernel's numpy twin, which the tests hold
  the packing and the geometry to.
- Device side (Triton, imported lazily): ``CopyKernel`` compiles its variants once and launches them
  with raw pointers through Triton's compiled-kernel launcher (~6 µs against ~30 µs for a JIT call,
  which binds and specialises its arguments on every call).

Table layout (int64): ``[flag, lr[n], lo[n], rr[n], ro[n], size[n]]``, and for a strided batch
(``Writes.repeat``: a TP-sliced plan's head slices, one entry per run of tokens) three more columns,
``count[n], ls[n], rs[n]``: entry ``i`` is ``count`` writes ``ls``/``rs`` bytes apart. ``flag`` goes
up as ``n`` and the kernel lowers it to the index of the first entry outside its regions (an atomic
min; of a strided entry, its first or last write). Such an entry is skipped, never clamped. Region
tables: ``[src_off[nl], src_size[nl], dst_off[nr], dst_size[nr]]``, offsets from the two base pointers.

A strided entry is cut into programs of whole writes, each program about ``Geometry.chunk`` bytes
(``max(1, chunk // size)`` writes: the kernel works it out per entry, so a batch mixing 512-byte head
slices with megabyte state blocks gives each its own share). A program copies writes of up to ``COLS``
words in 2-D tiles, ``TILE // COLS`` writes by ``COLS`` words, ``COLS`` fitted to the batch's typical
write, so slices of a few hundred bytes fill a tile as pages do and no lane divides to find its write;
longer writes it copies one after the other, a 1-D tile at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from .base import Writes
from .batch_kernels import PACK_STRIDED

MIN_CHUNK = 64 << 10
STRIDED_CHUNK = 256 << 10
"""Bytes per program of a strided batch: on the H200 a TP 2 -> 4 Qwen3-Next room (786K head slices of
512 bytes) ran at 66, 233, 402 and 784 GB/s with 4, 16, 64 and 256 KiB per program (docs/gpu.md)."""
PROGRAMS = 1024
"""Aim for at least this many programs per launch (an H200 has 132 SMs): a few huge writes are cut
into chunks of at least ``MIN_CHUNK`` so that they still fill the GPU."""
MAX_GRID_Y = 65535
BLOCKS = (256, 512, 1024, 2048, 4096)
"""Tile widths in 8-byte words; 4096 x 16 warps moved 16 x 64 MiB at 93% of a device-to-device
copy on an H200, and 4-64 KiB pages ran the same at any width (docs/gpu.md)."""
TILE = 4096
"""Elements of a strided batch's 2-D tile (``TILE // cols`` writes by ``cols`` words)."""
COLS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
"""A strided tile's widths in words; the variant is picked by the batch's typical write."""
_COLS = np.array(COLS, dtype=np.int64)


def columns(writes: Writes) -> int:
    """Columns of the batch's table: 5, or 8 for a strided batch."""
    return 5 if writes.repeat is None else 8


def pack(writes: Writes, alloc: Callable[[int], np.ndarray] | None = None) -> np.ndarray:
    """The batch as the kernel's int64 table, in ``alloc(words)`` (pinned memory, ready to upload)."""
    n = len(writes)
    table = (alloc or (lambda k: np.empty(k, dtype=np.int64)))(1 + columns(writes) * n)
    table[0] = n
    for k, column in enumerate(
        (writes.local_region, writes.local_offset, writes.remote_region, writes.remote_offset, writes.size)
    ):
        np.copyto(table[1 + k * n : 1 + (k + 1) * n], column)
    if writes.repeat is not None:
        np.copyto(table[1 + 5 * n : 1 + 8 * n].reshape(3, n), writes.repeat)
    return table


def region_table(
    src_off: np.ndarray, src_size: np.ndarray, dst_off: np.ndarray, dst_size: np.ndarray
) -> np.ndarray:
    """Both sides' regions for the kernel: offsets from the two base pointers, and sizes."""
    return np.concatenate([src_off, src_size, dst_off, dst_size]).astype(np.int64)


@dataclass(frozen=True)
class Geometry:
    chunk: int
    """Bytes per program: program ``(i, k)`` copies bytes ``[k * chunk, (k + 1) * chunk)`` of write ``i``."""
    grid: tuple[int, int]
    block: int
    warps: int
    per: int = 0
    """1 for a strided batch (0: not strided): program ``(i, k)`` copies writes ``[k * p, (k + 1) * p)``
    of entry ``i``, ``p = max(1, chunk // size[i])``; ``block`` is then the 2-D tile's width."""


def geometry(n: int, total: int, largest: int) -> Geometry:
    """Chunk and grid for ``n`` writes of ``total`` bytes, the largest ``largest``: every write is cut
    into at most ``PROGRAMS // n`` chunks (at least one), so a few huge writes fill the GPU while
    many pages launch one program each."""
    cuts = max(1, min(MAX_GRID_Y, PROGRAMS // max(1, n)))
    want = max(MIN_CHUNK, -(-max(1, largest) // cuts))
    chunk = 1 << (want - 1).bit_length()
    splits = max(1, -(-largest // chunk))
    mean_words = max(1, total // max(1, n * splits) // 8)
    block = min(BLOCKS[-1], max(BLOCKS[0], 1 << (mean_words - 1).bit_length()))
    return Geometry(chunk, (n, splits), block, 16 if block >= 4096 else 4)


def strided_geometry(size: np.ndarray, count: np.ndarray) -> Geometry:
    """Grid for a strided batch: each program takes about ``chunk`` bytes of whole writes of one entry
    (``STRIDED_CHUNK``, or less where the batch is too small to fill ``PROGRAMS`` programs; more where
    the grid would pass ``MAX_GRID_Y``), and its 2-D tiles are as wide as the write that most of the
    batch's writes are (its median by count), rounded up to a power of two. Tile widths are monotone
    in the write's size, so the median's width is the first width whose writes reach half the count:
    a histogram, not a sort."""
    size = np.maximum(np.asarray(size, np.int64), 1)
    count = np.maximum(np.asarray(count, np.int64), 1)
    total = max(1, int((size * count).sum()))
    chunk = max(1, min(STRIDED_CHUNK, -(-total // PROGRAMS)))
    splits = int((-(-count // np.maximum(1, chunk // size))).max())
    while splits > MAX_GRID_Y:
        chunk *= 2
        splits = int((-(-count // np.maximum(1, chunk // size))).max())
    words = (size + 7) // 8
    widths = np.bincount(np.searchsorted(COLS, words), weights=count, minlength=len(COLS) + 1)
    median = int(np.searchsorted(np.cumsum(widths), (int(count.sum()) + 1) // 2))
    return Geometry(chunk, (len(size), splits), COLS[min(median, len(COLS) - 1)], 16, 1)


def prepare_strided(writes: Writes, alloc: Callable[[int], np.ndarray]) -> tuple[np.ndarray, Geometry]:
    """``pack`` and ``strided_geometry`` of a strided batch: one compiled pass where numba is
    installed (``batch_kernels.PACK_STRIDED``; the numpy calls cost ~150 µs of a room's 300 on the
    H200 machine's host, docs/gpu.md), else the numpy twins."""
    assert writes.repeat is not None
    table = alloc(1 + 8 * len(writes))
    if PACK_STRIDED is None:
        pack(writes, lambda k: table)
        return table, strided_geometry(writes.size, writes.repeat[0])
    chunk, splits, cols = PACK_STRIDED(
        table, writes.local_region, writes.local_offset, writes.remote_region, writes.remote_offset,
        writes.size, writes.repeat, _COLS, STRIDED_CHUNK, PROGRAMS, MAX_GRID_Y,
    )
    return table, Geometry(int(chunk), (len(writes), int(splits)), int(cols), 16, 1)


def replay(
    table: np.ndarray, regions: np.ndarray, nl: int, src: np.ndarray, dst: np.ndarray, g: Geometry
) -> int:
    """What the kernel does, in numpy: copy ``src`` bytes to ``dst`` bytes (flat, offsets from the two
    bases) program by program; returns the flag (the first write outside its regions, else ``n``)."""
    n = int(table[0])
    lr, lo, rr, ro, size = (table[1 + k * n : 1 + (k + 1) * n] for k in range(5))
    zero = np.zeros(n, np.int64)
    count, ls, rs = (table[1 + k * n : 1 + (k + 1) * n] if g.per else zero for k in range(5, 8))
    nr = (len(regions) - 2 * nl) // 2
    flag = n
    for i in range(n):
        last_lo = lo[i] + (count[i] - 1) * ls[i] if g.per else lo[i]
        last_ro = ro[i] + (count[i] - 1) * rs[i] if g.per else ro[i]
        ok = 0 <= lr[i] < nl and 0 <= rr[i] < nr and size[i] > 0 and lo[i] >= 0 and ro[i] >= 0
        ok = ok and (not g.per or (count[i] > 0 and last_lo >= 0 and last_ro >= 0))
        if ok:
            s_off, s_size = regions[lr[i]], regions[nl + lr[i]]
            d_off, d_size = regions[2 * nl + rr[i]], regions[2 * nl + nr + rr[i]]
            ok = max(lo[i], last_lo) <= s_size - size[i] and max(ro[i], last_ro) <= d_size - size[i]
        if not ok:
            flag = min(flag, i)
            continue
        if g.per:
            per = max(1, g.chunk // int(size[i]))
            for k in range(g.grid[1]):
                for e in range(k * per, min(int(count[i]), (k + 1) * per)):
                    s, d, m = int(s_off + lo[i] + e * ls[i]), int(d_off + ro[i] + e * rs[i]), int(size[i])
                    dst[d : d + m] = src[s : s + m]
            continue
        for k in range(g.grid[1]):
            start = k * g.chunk
            m = max(0, min(g.chunk, int(size[i]) - start))
            s, d = int(s_off + lo[i]) + start, int(d_off + ro[i]) + start
            dst[d : d + m] = src[s : s + m]
    return flag


@cache
def _kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["n", "nl", "nr", "chunk"])
    def _copy_writes(
        src16, dst16, src1, dst1, regions, table, n: tl.int64, nl: tl.int64, nr: tl.int64, chunk: tl.int64,
        BLOCK: tl.constexpr, STRIDED: tl.constexpr, COLS: tl.constexpr,
    ):
        i = tl.program_id(0).to(tl.int64)
        k = tl.program_id(1).to(tl.int64)
        lr = tl.load(table + 1 + i)
        lo = tl.load(table + 1 + n + i)
        rr = tl.load(table + 1 + 2 * n + i)
        ro = tl.load(table + 1 + 3 * n + i)
        size = tl.load(table + 1 + 4 * n + i)
        ok = (lr >= 0) & (lr < nl) & (rr >= 0) & (rr < nr) & (size > 0) & (lo >= 0) & (ro >= 0)
        a = tl.where(ok, lr, 0)
        b = tl.where(ok, rr, 0)
        s_off = tl.load(regions + a)
        s_size = tl.load(regions + nl + a)
        d_off = tl.load(regions + 2 * nl + b)
        d_size = tl.load(regions + 2 * nl + nr + b)
        ok = ok & (lo <= s_size - size) & (ro <= d_size - size)
        if STRIDED:  # ``chunk``: bytes per program, in whole writes of this entry
            count = tl.load(table + 1 + 5 * n + i)
            ls = tl.load(table + 1 + 6 * n + i)
            rs = tl.load(table + 1 + 7 * n + i)
            last_lo = lo + (count - 1) * ls
            last_ro = ro + (count - 1) * rs
            ok = ok & (count > 0) & (last_lo >= 0) & (last_ro >= 0)
            ok = ok & (last_lo <= s_size - size) & (last_ro <= d_size - size)
            if (k == 0) & (ok.to(tl.int32) == 0):
                tl.atomic_min(table, i)
            one = tl.where(ok, size, 1)
            per = tl.maximum(chunk // one, 1)
            first = k * per
            writes = tl.maximum(tl.where(ok, tl.minimum(per, count - first), 0), 0)
            s = s_off + lo + first * ls
            d = d_off + ro + first * rs
            wide = (((s | d | one | ls | rs) & 7) == 0).to(tl.int64)
            unit = 1 + 7 * wide  # 8-byte words where everything is 8-byte aligned, else bytes
            length = one // unit
            s_u = s // unit
            d_u = d // unit
            ls_u = ls // unit
            rs_u = rs // unit
            pairs = (((s | d | one | ls | rs) & 15) == 0).to(tl.int64)
            if length <= COLS:  # 2-D tiles: BLOCK // COLS writes by COLS units
                rows = tl.arange(0, BLOCK // COLS)[:, None]
                w = tl.arange(0, COLS)[None, :]
                for j in range(0, tl.cdiv(writes, BLOCK // COLS)):
                    e = j * (BLOCK // COLS) + rows
                    mask = (e < writes) & (w < length)
                    if pairs == 1:  # 16-byte aligned: "* 2" lets Triton emit 16-byte accesses
                        sv = ((s >> 4) + e * (ls >> 4)) * 2 + w
                        dv = ((d >> 4) + e * (rs >> 4)) * 2 + w
                        tl.store(dst16 + dv, tl.load(src16 + sv, mask=mask), mask=mask)
                    elif wide == 1:
                        v = tl.load(src16 + s_u + e * ls_u + w, mask=mask)
                        tl.store(dst16 + d_u + e * rs_u + w, v, mask=mask)
                    else:
                        v1 = tl.load(src1 + s_u + e * ls_u + w, mask=mask)
                        tl.store(dst1 + d_u + e * rs_u + w, v1, mask=mask)
            else:  # long writes, one after the other, a 1-D tile at a time
                flat = tl.arange(0, BLOCK)
                for e in range(0, writes):
                    for c in range(0, tl.cdiv(length, BLOCK)):
                        w1 = c * BLOCK + flat
                        mask1 = w1 < length
                        if wide == 1:
                            v = tl.load(src16 + s_u + e * ls_u + w1, mask=mask1)
                            tl.store(dst16 + d_u + e * rs_u + w1, v, mask=mask1)
                        else:
                            v1 = tl.load(src1 + s_u + e * ls_u + w1, mask=mask1)
                            tl.store(dst1 + d_u + e * rs_u + w1, v1, mask=mask1)
        else:
            if (k == 0) & (ok.to(tl.int32) == 0):
                tl.atomic_min(table, i)
            start = k * chunk
            m = tl.maximum(tl.where(ok, tl.minimum(chunk, size - start), 0), 0)
            s = s_off + lo + start
            d = d_off + ro + start
            wide = (((s | d | m) & 15) == 0).to(tl.int64)
            # Offsets and lengths in 16-byte pairs of int64 words: "* 2" lets Triton prove 16-byte
            # alignment and emit vector loads and stores.
            words = ((m * wide) >> 4) * 2
            s8 = (s >> 4) * 2
            d8 = (d >> 4) * 2
            for j in range(0, tl.cdiv(words, BLOCK)):
                offs = j * BLOCK + tl.arange(0, BLOCK)
                mask = offs < words
                tl.store(dst16 + d8 + offs, tl.load(src16 + s8 + offs, mask=mask), mask=mask)
            rest = m * (1 - wide)
            for j in range(0, tl.cdiv(rest, BLOCK)):
                offs = j * BLOCK + tl.arange(0, BLOCK)
                mask = offs < rest
                tl.store(dst1 + d + offs, tl.load(src1 + s + offs, mask=mask), mask=mask)

    return _copy_writes


class CopyKernel:
    """The compiled variants (one per tile width) on one device; ``launch`` takes raw pointers."""

    def __init__(self, torch: Any, device: Any):
        kernel = _kernel()
        words = torch.zeros(8, dtype=torch.int64, device=device)
        data = words.view(torch.uint8)
        self._compiled: dict[tuple[int, bool], Any] = {}
        for block in BLOCKS:
            self._compiled[block, False] = kernel.warmup(
                words, words, data, data, words, words, 1, 1, 1, 1, BLOCK=block, STRIDED=False, COLS=1,
                num_warps=16 if block >= 4096 else 4, grid=(1,),
            )
        for cols in COLS:
            self._compiled[cols, True] = kernel.warmup(
                words, words, data, data, words, words, 1, 1, 1, 1, BLOCK=TILE, STRIDED=True, COLS=cols,
                num_warps=16, grid=(1,),
            )

    def launch(
        self, g: Geometry, stream: int, bases: tuple[int, int], regions: int, table: int, n: int, nl: int,
        nr: int,
    ) -> None:
        """One launch on ``stream``. ``bases`` and the two tables must be 16-byte aligned (the variants
        were compiled so, and use it for vector accesses)."""
        if (bases[0] | bases[1] | regions | table) & 15:
            raise ValueError("copy kernel pointers must be 16-byte aligned")
        src, dst = bases
        strided = g.per > 0
        self._compiled[g.block, strided][(g.grid[0], g.grid[1], 1)](
            src, dst, src, dst, regions, table, n, nl, nr, g.chunk,
            TILE if strided else g.block, strided, g.block if strided else 1, stream=stream,
        )


__all__ = [
    "BLOCKS",
    "COLS",
    "CopyKernel",
    "Geometry",
    "columns",
    "geometry",
    "pack",
    "prepare_strided",
    "region_table",
    "replay",
    "strided_geometry",
]
