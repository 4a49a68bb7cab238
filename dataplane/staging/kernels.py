"""Triton copy kernel (imported lazily): whole rows between two row-indexed views.

``copy_rows(src, dst, src_rows, dst_rows)`` does ``dst[dst_rows[i]] = src[src_rows[i]]`` for every
``i`` in one launch (a contiguous staging slot passes ``arange`` as its index). Rows whose width in
8-byte words is a multiple of 16 get 16-byte accesses (Triton specializes such integer arguments and
products inherit the divisibility). Gather and scatter are both this one kernel. Torch's
``index_select`` / ``index_copy_`` do the same in ``gpu.TorchStager``'s torch mode;
``bench/gpu_kernels.py`` compares them.
"""

from __future__ import annotations

from functools import cache
from typing import Any

__all__ = ["copy_rows"]


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
