"""Triton copy kernels (imported lazily): whole rows between two row-indexed views, and spans.

``copy_rows(src, dst, src_rows, dst_rows)`` does ``dst[dst_rows[i]] = src[src_rows[i]]`` for every
``i`` in one launch (a contiguous staging slot passes ``arange`` as its index). Rows whose width in
8-byte words is a multiple of 16 get 16-byte accesses (Triton specializes such integer arguments and
products inherit the divisibility). Gather, scatter, and a row-to-row copy into a peer's
CUDA-IPC-mapped arena are all this one kernel. Torch's ``index_select`` / ``index_copy_`` do the
same in ``gpu.TorchStager``'s torch mode; ``bench/gpu_kernels.py`` compares them.
"""

from __future__ import annotations

from functools import cache
from typing import Any

__all__ = ["copy_rows", "copy_spans"]


@cache
def _kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def _copy_rows(src, dst, sidx, didx, words, BLOCK: tl.constexpr):
        r = tl.program_id(0)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < words
        s = tl.load(sidx + r).to(tl.int64) * words
        d = tl.load(didx + r).to(tl.int64) * words
        tl.store(dst + d + offs, tl.load(src + s + offs, mask=mask), mask=mask)

    return _copy_rows


def copy_rows(src: Any, dst: Any, src_rows: Any, dst_rows: Any) -> None:
    """``dst[dst_rows[i]] = src[src_rows[i]]`` on the current stream; 2-D views of equal row width,
    int64 index tensors on the device."""
    import triton

    words, count = src.shape[1], src_rows.shape[0]
    if dst.shape[1] != words or dst_rows.shape[0] != count:
        raise ValueError(f"rows differ: {src.shape}/{count} vs {dst.shape}/{dst_rows.shape[0]}")
    if count == 0:
        return
    block = min(2048, triton.next_power_of_2(words))
    grid = (count, triton.cdiv(words, block))
    _kernel()[grid](src, dst, src_rows, dst_rows, words, BLOCK=block, num_warps=8 if block >= 2048 else 4)


@cache
def _span_kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["n"])
    def _copy_spans(src, dst, table, n, BLOCK: tl.constexpr, VEC: tl.constexpr):
        i = tl.program_id(0)
        s = tl.load(table + i) * VEC
        d = tl.load(table + n + i) * VEC
        words = tl.load(table + 2 * n + i) * VEC
        for k in range(0, tl.cdiv(words, BLOCK)):
            offs = k * BLOCK + tl.arange(0, BLOCK)
            mask = offs < words
            tl.store(dst + d + offs, tl.load(src + s + offs, mask=mask), mask=mask)

    return _copy_spans


def copy_spans(src: Any, dst: Any, table: Any, vec: int, mean_words: int) -> None:
    """For each column ``(s, d, w)`` of the int64 device ``table`` (3, n): copy ``w * vec`` elements
    from ``src + s * vec`` to ``dst + d * vec``, one program per column, on the current stream.

    ``src`` / ``dst`` are tensors whose data pointers are the two bases (only the pointers are used:
    spans may reach past the tensors' own sizes, so callers check bounds). Scaling by ``vec`` lets
    Triton prove 16-byte alignment (``vec=2`` over int64) and emit vector loads. Tile and warps as
    measured on an H200 (2026-11-29, docs/gpu.md): 4096 x 16 warps moved 16 x 64 MiB at 93% of a
    device-to-device copy (2048 x 8: 89%); pages of 4-64 KiB ran the same at any tile up to 4096."""
    import triton

    n = table.shape[1]
    if n == 0:
        return
    block = max(256, min(4096, triton.next_power_of_2(mean_words * vec)))
    warps = 16 if block >= 4096 else 4
    _span_kernel()[(n,)](src, dst, table, n, BLOCK=block, VEC=vec, num_warps=warps)
