"""The ``cuda-ipc`` transport alone, in one process: how long ``write`` takes to return (host planning
and the launches) and until its event is done, for 4 KiB..64 MiB page batches (docs/gpu.md).

The transport is connected to its own second region (a process cannot open its own IPC handles, so
the same-process peer uses the addresses as they are), so no NIXL agent shares the process. Needs a
CUDA GPU:

    python3 bench/gpu_ipc.py
"""
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dataplane.transports import MemoryRegion, TransferState, Writes
from dataplane.transports.cuda_ipc import CudaIpcTransport

PAGES = {
    "4K x16384": (4096, 16384),
    "64K x4096": (65536, 4096),
    "1M x256": (1 << 20, 256),
    "64M x16": (64 << 20, 16),
}
HALF = 1 << 30


def batch(rng: np.random.Generator, page: int, n: int) -> Writes:
    """``n`` random pages of region 0 to random pages of region 1."""
    slots = HALF // page
    lo = rng.permutation(slots)[:n].astype(np.int64) * page
    ro = rng.permutation(slots)[:n].astype(np.int64) * page
    return Writes(np.zeros(n, np.int32), lo, np.ones(n, np.int32), ro, np.full(n, page, np.int64))


def main() -> None:
    torch.cuda.set_device(0)
    arena = torch.zeros(2 * HALF, dtype=torch.uint8, device="cuda")
    transport = CudaIpcTransport(0)
    blobs = transport.register(
        [MemoryRegion(arena.data_ptr() + i * HALF, HALF, "cuda", 0) for i in range(2)]
    )
    peer = transport.connect("self", transport.endpoint(), blobs)
    rng = np.random.default_rng(0)
    for name, (page, n) in PAGES.items():
        w = batch(rng, page, n)
        post, done = [], []
        for _ in range(40):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            transfer = transport.write(peer, w)
            t1 = time.perf_counter()
            deadline = time.monotonic() + 10
            while transport.poll(transfer) is TransferState.IN_PROGRESS and time.monotonic() < deadline:
                pass  # spin: the figure is the transport's, not a sleeping poller's
            if transport.poll(transfer) is not TransferState.DONE:
                raise RuntimeError(f"{name}: transfer not done: {transfer.error}")
            t2 = time.perf_counter()
            post.append((t1 - t0) * 1e6)
            done.append((t2 - t0) * 1e6)
        med = statistics.median(done)
        print(f"{name:10s} write returns {statistics.median(post):6.0f} us  done {med:6.0f} us  "
              f"{w.nbytes / med / 1e3:7.0f} GB/s", flush=True)
    transport.close()


if __name__ == "__main__":
    main()
