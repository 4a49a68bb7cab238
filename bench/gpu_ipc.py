"""The ``cuda-ipc`` transport alone, in one process: how long ``write`` takes to return (host planning
and the launches) and until its event is done, for 4 KiB..64 MiB page batches (docs/gpu.md), and for
Qwen3-Next rooms between equal and mismatched TP sizes (``rooms``: the planner's compact plan as the
agent hands it over, and each TP-mismatched room once more expanded to one write per head slice,
verified byte for byte). A probe: the rooms' standing figures come from ``bench/gpu_transfer.py``,
which runs them between two processes beside the other cases (docs/benchmarks.md).

The transport is connected to its own second region (a process cannot open its own IPC handles, so
the same-process peer uses the addresses as they are), so no NIXL agent shares the process. Needs a
CUDA GPU:

    python3 bench/gpu_ipc.py [--rooms-only] [--json PATH]
"""
import json
import statistics
import sys
import time
from collections.abc import Callable
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
    json_path = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None
    if "--rooms-only" in sys.argv:
        rooms(json_path)
        return
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
    rooms(json_path)


ROOMS = (
    # name, prefill TP and rank, decode TP and rank, KV heads (Qwen3-Next has 2; 8 to split 4 or 8 ways)
    ("qwen3-next TP1->1", 1, 0, 1, 0, 2),
    ("qwen3-next TP1->2", 1, 0, 2, 1, 2),
    ("qwen3-next/8kv TP4->4", 4, 2, 4, 2, 8),
    ("qwen3-next/8kv TP2->4", 2, 1, 4, 3, 8),
    ("qwen3-next/8kv TP8->4", 8, 5, 4, 2, 8),
)
POOL, ROOM_PAGES, REPS = 2048, 512, 20


def _aligned(sizes: list[int]) -> tuple[list[int], int]:
    offs, at = [], 0
    for size in sizes:
        offs.append(at)
        at += -(-size // 256) * 256
    return offs, at


def _time(transport: CudaIpcTransport, peer: object, w: Writes, name: str) -> tuple[float, float, float]:
    """Median µs until ``write`` returns, until its event is seen done, and on the GPU (events on the
    transport's stream around the write), over ``REPS`` writes."""
    post, done, gpu = [], [], []
    for _ in range(REPS):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(transport._stream_obj)
        t0 = time.perf_counter()
        transfer = transport.write(peer, w)  # type: ignore[arg-type]
        t1 = time.perf_counter()
        end.record(transport._stream_obj)
        deadline = time.monotonic() + 10
        while transport.poll(transfer) is TransferState.IN_PROGRESS and time.monotonic() < deadline:
            pass
        if transport.poll(transfer) is not TransferState.DONE:
            raise RuntimeError(f"{name}: transfer not done: {transfer.error}")
        done.append((time.perf_counter() - t0) * 1e6)
        post.append((t1 - t0) * 1e6)
        end.synchronize()
        gpu.append(start.elapsed_time(end) * 1e3)
    return statistics.median(post), statistics.median(done), statistics.median(gpu)


def room(
    name: str, src_tp: int, src_rank: int, dst_tp: int, dst_rank: int, kv_heads: int
) -> tuple[dict, Callable[[], bool]]:
    """One Qwen3-Next room (full-size tensors, 512 pages of 64 tokens in runs of 1-16, one mamba slot)
    from a prefill rank to a decode rank through ``cuda-ipc``: the planner's plan as it comes (strided
    rows where TP differs) and, for a TP-mismatched room, expanded to one write per row, timed; and
    a check to call later that writes the plan once onto poisoned memory, verifies it byte for byte
    and frees the room. ``rooms`` times every room before it verifies any: a verification (thousands
    of small comparisons) left the copies timed after it at ~1 ms whatever their bytes."""
    from dataclasses import replace

    from dataplane.harness.bench.codec import fragmented_pages
    from dataplane.planner import PeerLayout, RequestIndices, plan_request
    from dataplane.schema.profiles import profile

    qwen = profile("qwen3-next")
    qwen = replace(qwen, kv=replace(qwen.kv, heads=kv_heads))
    local = qwen.schema(tp_size=src_tp, tp_rank=src_rank, pool_pages=POOL, max_requests=2)
    peer_schema = qwen.schema(tp_size=dst_tp, tp_rank=dst_rank, pool_pages=POOL, max_requests=2)
    rng = np.random.default_rng(35)
    src_kv, dst_kv = fragmented_pages(rng, ROOM_PAGES, POOL), fragmented_pages(rng, ROOM_PAGES, POOL)
    req = RequestIndices.of(src_kv, dst_kv, 0, 1, [[1]], [[0]])
    plan = plan_request(local, PeerLayout.from_schema(peer_schema), req)
    lsizes = [r.size for r in local.regions()]
    rsizes = [r.size for r in peer_schema.regions()]
    loffs, ltotal = _aligned(lsizes)
    roffs, rtotal = _aligned(rsizes)
    src = torch.randint(0, 255, (ltotal,), dtype=torch.uint8, device="cuda")
    src[src == 0x5A] = 0x5B  # no source byte looks like the poison
    dst = torch.full((rtotal,), 0x5A, dtype=torch.uint8, device="cuda")
    transport = CudaIpcTransport(0)
    base_l, base_r = src.data_ptr(), dst.data_ptr()
    blobs = transport.register(
        [MemoryRegion(base_l + o, s, "cuda", 0) for o, s in zip(loffs, lsizes, strict=True)]
        + [MemoryRegion(base_r + o, s, "cuda", 0) for o, s in zip(roffs, rsizes, strict=True)]
    )
    peer = transport.connect("self", transport.endpoint(), blobs)
    nl = len(lsizes)
    p = Writes.of(plan)
    w = Writes(p.local_region, p.local_offset, p.remote_region + nl, p.remote_offset, p.size, p.repeat)
    out: dict = {"room": name, "bytes": w.nbytes, "writes": w.count, "rows": len(w)}
    out["post_us"], out["done_us"], out["gpu_us"] = _time(transport, peer, w, name)
    out["gbps"] = w.nbytes / out["done_us"] / 1e3
    if w.repeat is not None:
        e = w.expanded()
        out["expanded_post_us"], out["expanded_done_us"], _ = _time(transport, peer, e, name + " expanded")
        out["expanded_gbps"] = e.nbytes / out["expanded_done_us"] / 1e3
    return out, lambda: _verify(transport, peer, w, (src, dst), (loffs, roffs), nl)


def _verify(
    transport: CudaIpcTransport, peer: object, w: Writes, memory: tuple, offsets: tuple, nl: int
) -> bool:
    src, dst = memory
    loffs, roffs = offsets
    dst.fill_(0x5A)
    transfer = transport.write(peer, w)  # type: ignore[arg-type]
    transport.wait(transfer, time.monotonic() + 30)
    torch.cuda.synchronize()
    changed = int((dst != 0x5A).sum())
    rep = w.repeats()
    bad = 0
    for k in range(len(w)):
        count, ls, rs, size = int(rep[0, k]), int(rep[1, k]), int(rep[2, k]), int(w.size[k])
        a = src.as_strided((count, size), (ls, 1), loffs[int(w.local_region[k])] + int(w.local_offset[k]))
        at = roffs[int(w.remote_region[k]) - nl] + int(w.remote_offset[k])
        b = dst.as_strided((count, size), (rs, 1), at)
        bad += not torch.equal(a, b)
    transport.close()
    return bad == 0 and changed == w.nbytes


def rooms(json_path: str | None) -> None:
    timed = [room(*spec) for spec in ROOMS]
    results = []
    for r, verify in timed:
        r["verified"] = verify()
        results.append(r)
    del timed
    torch.cuda.empty_cache()
    equal = {r["room"].split()[0]: r["gbps"] for r in results if r["writes"] == r["rows"]}
    for r in results:
        extra = (f"  expanded: done {r['expanded_done_us']:7.0f} us {r['expanded_gbps']:6.0f} GB/s"
                 if "expanded_gbps" in r else "")
        share = r["gbps"] / equal[r["room"].split()[0]]
        print(f"{r['room']:24s} {r['bytes'] / 2**20:7.1f} MiB {r['writes']:7d} writes {r['rows']:6d} rows  "
              f"write returns {r['post_us']:5.0f} us  GPU {r['gpu_us']:5.0f} us  done {r['done_us']:5.0f} us "
              f"{r['gbps']:6.0f} GB/s ({share:4.0%} of equal TP)  verified {'yes' if r['verified'] else 'NO'}"
              f"{extra}", flush=True)
    if json_path:
        Path(json_path).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
