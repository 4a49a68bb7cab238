"""Copy kernels on one GPU, timed with CUDA events: ``copy_spans`` tile and warp variants against torch
copies, for 16 x 64 MiB blocks and scattered 4 KiB / 64 KiB pages (docs/gpu.md, "Where the time goes").
Needs a CUDA GPU and Triton:

    python3 bench/gpu_copy_kernels.py
"""
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gpu_kernels import timed
from dataplane.staging.kernels import _span_kernel

GiB = 1 << 30


def table(src: np.ndarray, dst: np.ndarray, sizes: np.ndarray, chunk: int) -> torch.Tensor:
    """The span table (16-byte units) of writes ``src -> dst``, each cut in ``chunk`` bytes."""
    pieces = (sizes + chunk - 1) // chunk
    which = np.repeat(np.arange(len(sizes)), pieces)
    start = (np.arange(pieces.sum()) - np.repeat(np.cumsum(pieces) - pieces, pieces)) * chunk
    length = np.minimum(chunk, sizes[which] - start)
    spans = np.stack([src[which] + start, dst[which] + start, length]) // 16
    return torch.from_numpy(np.ascontiguousarray(spans)).cuda()


def main() -> None:
    torch.cuda.set_device(0)
    src = torch.randint(0, 255, (GiB + (64 << 20),), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    s64, d64 = src.view(torch.int64), dst.view(torch.int64)

    def spans(t: torch.Tensor, block: int, warps: int) -> Callable[[], object]:
        n = t.shape[1]
        return lambda: _span_kernel()[(n,)](s64, d64, t, n, BLOCK=block, VEC=2, num_warps=warps)

    rows = [("d2d 1GiB contiguous", GiB, timed(lambda: dst[:GiB].copy_(src[:GiB])))]
    rng = np.random.default_rng(0)
    blk = 64 << 20
    perm_s, perm_d = rng.permutation(16) * blk, rng.permutation(16) * blk

    def memcpys() -> None:
        for a, b in zip(perm_s.tolist(), perm_d.tolist(), strict=True):
            dst[b:b + blk].copy_(src[a:a + blk])

    rows.append(("16x64MiB torch copy_", GiB, timed(memcpys)))
    for chunk in (256 << 10, 1 << 20, 4 << 20):
        t = table(perm_s, perm_d, np.full(16, blk, np.int64), chunk)
        for block, warps in ((1024, 4), (2048, 8), (4096, 8), (4096, 16), (8192, 16)):
            rows.append((f"16x64MiB spans chunk={chunk >> 10}K B={block} w={warps}", GiB,
                         timed(spans(t, block, warps))))
    for page, count, variants in ((4096, 16384, ((256, 2), (256, 4), (512, 4), (512, 8))),
                                  (65536, 4096, ((1024, 4), (2048, 8), (4096, 8)))):
        ps = rng.permutation(2 * count)[:count].astype(np.int64) * page
        pd = rng.permutation(2 * count)[:count].astype(np.int64) * page
        t = table(ps, pd, np.full(count, page, np.int64), 1 << 20)
        for block, warps in variants:
            rows.append((f"{count}x{page >> 10}KiB spans B={block} w={warps}", count * page,
                         timed(spans(t, block, warps))))
        idx_s, idx_d = torch.from_numpy(ps // page).cuda(), torch.from_numpy(pd // page).cuda()
        sv = src[: 2 * count * page].view(torch.int64).view(2 * count, page // 8)
        dv = dst[: 2 * count * page].view(torch.int64).view(2 * count, page // 8)
        rows.append((f"{count}x{page >> 10}KiB index_copy_(index_select)", count * page,
                     timed(lambda: dv.index_copy_(0, idx_d, sv.index_select(0, idx_s)))))  # noqa: B023
    for name, nbytes, sec in rows:
        print(f"{name:48s} {sec * 1e6:9.1f} us {nbytes / sec / 1e9:8.1f} GB/s")


if __name__ == "__main__":
    main()
