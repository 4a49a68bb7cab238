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

Table layout (int64): ``[flag, lr[n], lo[n], rr[n], ro[n], size[n]]``. ``flag`` goes up as ``n`` and
the kernel lowers it to the index of the first write outside its regions (an atomic min). Such a
write is skipped, never clamped. Region tables: ``[src_off[nl], src_size[nl], dst_off[nr],
dst_size[nr]]``, offsets from the two base pointers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from .base import Writes

MIN_CHUNK = 64 << 10
PROGRAMS = 1024
"""Aim for at least this many programs per launch (an H200 has 132 SMs): a few huge writes are cut
into chunks of at least ``MIN_CHUNK`` so that they still fill the GPU."""
MAX_GRID_Y = 65535
BLOCKS = (256, 512, 1024, 2048, 4096)
"""Tile widths in 8-byte words; 4096 x 16 warps moved 16 x 64 MiB at 93% of a device-to-device
copy on an H200, and 4-64 KiB pages ran the same at any width (docs/gpu.md)."""


def pack(writes: Writes, alloc: Callable[[int], np.ndarray] | None = None) -> np.ndarray:
    """The batch as the kernel's int64 table, in ``alloc(words)`` (pinned memory, ready to upload)."""
    n = len(writes)
    table = (alloc or (lambda k: np.empty(k, dtype=np.int64)))(1 + 5 * n)
    table[0] = n
    for k, column in enumerate(
        (writes.local_region, writes.local_offset, writes.remote_region, writes.remote_offset, writes.size)
    ):
        np.copyto(table[1 + k * n : 1 + (k + 1) * n], column)
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


def replay(
    table: np.ndarray, regions: np.ndarray, nl: int, src: np.ndarray, dst: np.ndarray, g: Geometry
) -> int:
    """What the kernel does, in numpy: copy ``src`` bytes to ``dst`` bytes (flat, offsets from the two
    bases) program by program; returns the flag (the first write outside its regions, else ``n``)."""
    n = int(table[0])
    lr, lo, rr, ro, size = (table[1 + k * n : 1 + (k + 1) * n] for k in range(5))
    nr = (len(regions) - 2 * nl) // 2
    flag = n
    for i in range(n):
        ok = 0 <= lr[i] < nl and 0 <= rr[i] < nr and size[i] > 0 and lo[i] >= 0 and ro[i] >= 0
        if ok:
            s_off, s_size = regions[lr[i]], regions[nl + lr[i]]
            d_off, d_size = regions[2 * nl + rr[i]], regions[2 * nl + nr + rr[i]]
            ok = lo[i] <= s_size - size[i] and ro[i] <= d_size - size[i]
        if not ok:
            flag = min(flag, i)
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
        BLOCK: tl.constexpr,
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
        self._compiled: dict[int, Any] = {}
        for block in BLOCKS:
            warps = 16 if block >= 4096 else 4
            compiled = kernel.warmup(
                words, words, data, data, words, words, 1, 1, 1, 1, BLOCK=block, num_warps=warps, grid=(1,)
            )
            self._compiled[block] = compiled

    def launch(
        self, g: Geometry, stream: int, bases: tuple[int, int], regions: int, table: int, n: int, nl: int,
        nr: int,
    ) -> None:
        """One launch on ``stream``. ``bases`` and the two tables must be 16-byte aligned (the variants
        were compiled so, and use it for vector accesses)."""
        if (bases[0] | bases[1] | regions | table) & 15:
            raise ValueError("copy kernel pointers must be 16-byte aligned")
        src, dst = bases
        self._compiled[g.block][(g.grid[0], g.grid[1], 1)](
            src, dst, src, dst, regions, table, n, nl, nr, g.chunk, g.block, stream=stream
        )


__all__ = ["BLOCKS", "CopyKernel", "Geometry", "geometry", "pack", "region_table", "replay"]
