"""The ``cuda-ipc`` copy kernel (``transports.copy_kernel``) alone on one GPU, timed with CUDA events,
against torch copies of the same bytes: 16 x 64 MiB blocks, 256 x 1 MiB, and scattered 4 KiB /
64 KiB pages, at the geometry the transport picks and at every other tile width (docs/gpu.md).
Needs a CUDA GPU and Triton:

    python3 bench/gpu_copy_kernels.py
"""
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gpu_kernels import timed
from dataplane.transports.base import Writes
from dataplane.transports.copy_kernel import BLOCKS, CopyKernel, geometry, pack, region_table

GiB = 1 << 30


def main() -> None:
    torch.cuda.set_device(0)
    src = torch.randint(0, 255, (GiB + (64 << 20),), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    kernel = CopyKernel(torch, src.device)
    one = np.array([0], np.int64), np.array([src.numel()], np.int64)
    regions = torch.from_numpy(region_table(*one, *one)).cuda()
    stream = torch.cuda.current_stream().cuda_stream
    rows = [("d2d 1GiB contiguous", GiB, timed(lambda: dst[:GiB].copy_(src[:GiB])))]
    rng = np.random.default_rng(0)
    for page, count in ((64 << 20, 16), (1 << 20, 256), (65536, 4096), (4096, 16384)):
        ps = rng.permutation(GiB // page)[:count].astype(np.int64) * page
        pd = rng.permutation(GiB // page)[:count].astype(np.int64) * page
        zero = np.zeros(count, np.int32)
        w = Writes(zero, ps, zero, pd, np.full(count, page, np.int64))
        table = torch.from_numpy(pack(w)).cuda()
        best = geometry(count, count * page, page)
        for block in BLOCKS:
            g = replace(best, block=block, warps=16 if block >= 4096 else 4)
            mark = " (picked)" if block == best.block else ""

            def launch(g=g, table=table, count=count) -> None:  # type: ignore[no-untyped-def]
                kernel.launch(g, stream, (src.data_ptr(), dst.data_ptr()), regions.data_ptr(),
                              table.data_ptr(), count, 1, 1)

            rows.append((f"{count}x{page >> 10}KiB kernel B={block} grid={g.grid}{mark}", count * page,
                         timed(launch)))
        got = dst[torch.from_numpy(pd).cuda().view(-1, 1) + torch.arange(min(page, 4096), device="cuda")]
        want = src[torch.from_numpy(ps).cuda().view(-1, 1) + torch.arange(min(page, 4096), device="cuda")]
        assert torch.equal(got, want), "the kernel moved the wrong bytes"
        if page <= 65536:
            sv = src[:GiB].view(torch.int64).view(GiB // page, page // 8)
            dv = dst[:GiB].view(torch.int64).view(GiB // page, page // 8)
            si, di = torch.from_numpy(ps // page).cuda(), torch.from_numpy(pd // page).cuda()
            rows.append((f"{count}x{page >> 10}KiB torch index_copy_(index_select)", count * page, timed(
                lambda sv=sv, dv=dv, si=si, di=di: dv.index_copy_(0, di, sv.index_select(0, si))
            )))
    for name, nbytes, sec in rows:
        print(f"{name:60s} {sec * 1e6:9.1f} us {nbytes / sec / 1e9:8.1f} GB/s")


if __name__ == "__main__":
    main()
