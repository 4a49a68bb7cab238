"""Row gather / scatter kernels on one GPU: which torch op moves scattered pages fastest.

    python3 bench/gpu_kernels.py

For page sizes 4 KiB..1 MiB, times (CUDA events, median of 20) a gather of N random rows of an arena
into a contiguous buffer and the matching scatter back, for ``index_select(out=)``, advanced indexing,
``index_copy_``, ``index_put_`` and element widths of 16 (complex128), 8 (int64) and 4 bytes, and a
plain contiguous copy of the same bytes. GB/s counts the bytes moved once.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch


def timed(fn: Callable[[], object]) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / 1e3)
    return statistics.median(out)


def main() -> None:
    total = 256 << 20
    arena = torch.randint(0, 255, (2 * total,), dtype=torch.uint8, device="cuda")
    stage = torch.empty(total, dtype=torch.uint8, device="cuda")
    names = ("copy", "sel_out", "adv_idx", "idx_copy", "idx_put")
    print(f"{'page':>8s} {'dtype':>10s} " + " ".join(f"{n:>8s}" for n in names))
    for page in (4 << 10, 64 << 10, 1 << 20):
        n = total // page
        idx = torch.randperm(2 * n, device="cuda")[:n]
        for dtype, width in ((torch.complex128, 16), (torch.int64, 8), (torch.int32, 4)):
            src = arena.view(dtype).view(2 * n, page // width)
            dst = stage.view(dtype).view(n, page // width)
            t = {
                "copy": timed(lambda: stage.copy_(arena[:total])),
                "sel_out": timed(lambda: torch.index_select(src, 0, idx, out=dst)),  # noqa: B023
                "adv_idx": timed(lambda: dst.copy_(src[idx])),  # noqa: B023
                "idx_copy": timed(lambda: src.index_copy_(0, idx, dst)),  # noqa: B023
                "idx_put": timed(lambda: src.index_put_((idx,), dst)),  # noqa: B023
            }
            cells = " ".join(f"{total / v / 1e9:8.0f}" for v in t.values())
            print(f"{page >> 10:>6d}Ki {str(dtype).split('.')[-1]:>10s} {cells}", flush=True)


if __name__ == "__main__":
    main()
