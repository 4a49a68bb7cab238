"""The ``cuda-ipc`` transport on a real GPU: a second process's regions mapped through CUDA IPC and
written by one copy kernel per batch; then the real agents over it (``transfer.backend: cuda-ipc``),
every byte verified by decode. Needs a CUDA GPU with Triton: CPU-only CI skips these with that reason
(``tests/unit/test_copy_kernel.py`` covers the kernel's table and geometry there, against its numpy
twin).
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import time
import urllib.request
from types import SimpleNamespace
from typing import Any

import msgspec
import numpy as np
import pytest

from dataplane.harness.waiting import wait_for
from tests.integration.test_agent_two_process import (
    HB,
    agents,
    assert_all_verified,
    config,
    finished,
)

torch = pytest.importorskip("torch", reason="needs a CUDA GPU")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

PAGES, PAGE = 512, 4096


def _owner(conn: Any) -> None:
    """The decode side: owns two regions (one allocation each), exports them, reports their bytes."""
    from dataplane.transports import MemoryRegion
    from dataplane.transports.cuda_ipc import CudaIpcTransport

    bufs = [torch.full((PAGES * PAGE,), 0x5A, dtype=torch.uint8, device="cuda") for _ in range(2)]
    transport = CudaIpcTransport(0)
    blobs = transport.register([MemoryRegion(b.data_ptr(), b.numel(), "cuda", 0) for b in bufs])
    torch.cuda.synchronize()
    conn.send((transport.endpoint(), blobs))
    assert conn.recv() == "read"
    conn.send([b.cpu().numpy() for b in bufs])
    conn.recv()
    transport.close()


def test_pages_land_where_the_plan_says_and_nowhere_else() -> None:
    from dataplane.errors import TransferFailed
    from dataplane.transports import MemoryRegion, TransferState, Writes
    from dataplane.transports.cuda_ipc import CudaIpcTransport

    ctx = mp.get_context("spawn")
    mine, theirs = ctx.Pipe()
    child = ctx.Process(target=_owner, args=(theirs,), daemon=True)
    child.start()
    try:
        src = torch.randint(0, 256, (2, PAGES * PAGE), dtype=torch.uint8, device="cuda")
        transport = CudaIpcTransport(0)
        transport.register([MemoryRegion(s.data_ptr(), s.numel(), "cuda", 0) for s in src])
        endpoint, blobs = mine.recv()
        peer = transport.connect("decode", endpoint, blobs)
        rng = np.random.default_rng(7)
        n = 300
        dst_pages = rng.choice(2 * PAGES, n, replace=False)
        src_pages = rng.integers(0, 2 * PAGES, n)
        sizes = rng.choice([PAGE, PAGE // 2, 64, 16 * PAGE], n)
        sizes = np.minimum(sizes, (PAGES - dst_pages % PAGES) * PAGE, dtype=np.int64)
        sizes = np.minimum(sizes, (PAGES - src_pages % PAGES) * PAGE)
        keep, end = np.zeros(n, bool), 0
        for i in np.argsort(dst_pages).tolist():  # destinations must not overlap within one batch
            if dst_pages[i] * PAGE >= end:
                keep[i], end = True, dst_pages[i] * PAGE + sizes[i]
        s, d = src_pages[keep], dst_pages[keep]
        w = Writes.of(SimpleNamespace(
            local_region=s // PAGES, local_offset=s % PAGES * PAGE, remote_region=d // PAGES,
            remote_offset=d % PAGES * PAGE, size=sizes[keep],
        ))
        odd = Writes.of(SimpleNamespace(  # byte-aligned: the kernel's 1-byte unit
            local_region=np.array([0, 1]), local_offset=np.array([3, 5]), remote_region=np.array([1, 0]),
            remote_offset=np.array([7, PAGE + 1]), size=np.array([13, 3 * PAGE + 1]),
        ))
        for batch in (w, odd):
            transfer = transport.write(peer, batch)
            transport.wait(transfer, time.monotonic() + 30)
            assert transport.poll(transfer) is TransferState.DONE
        last = (PAGES - 1) * PAGE
        bad = Writes.of(SimpleNamespace(  # rows 1 and 2 lie outside decode's regions: skipped, and named
            local_region=np.array([0, 0, 1, 1]), local_offset=np.array([0, PAGE, 0, 2 * PAGE]),
            remote_region=np.array([0, 0, 7, 1]), remote_offset=np.array([last, last + 16, 0, PAGE]),
            size=np.full(4, PAGE),
        ))
        transfer = transport.write(peer, bad)
        named = rf"write 1: remote region 0 \[{last + 16}, \+{PAGE}\) overflows"
        with pytest.raises(TransferFailed, match=named):
            transport.wait(transfer, time.monotonic() + 30)
        mine.send("read")
        got = mine.recv()
        want = [np.full(PAGES * PAGE, 0x5A, np.uint8) for _ in range(2)]
        host = src.cpu().numpy()
        for batch in (w, odd, bad.subset(np.array([True, False, False, True]))):
            b = batch
            for lr, lo, rr, ro, size in zip(
                b.local_region, b.local_offset, b.remote_region, b.remote_offset, b.size, strict=True
            ):
                want[rr][ro:ro + size] = host[lr][lo:lo + size]
        assert all(np.array_equal(g, x) for g, x in zip(got, want, strict=True))
        transport.close()
    finally:
        mine.send("bye")
        child.join(30)


def test_strided_entries_land_where_the_plan_says_and_nowhere_else() -> None:
    """A TP-sliced plan's strided entries (head slices of runs of tokens; 8-byte and odd sizes) as one
    batch, and an entry whose last write leaves decode's region: refused, named, nothing written."""
    from dataplane.errors import TransferFailed
    from dataplane.transports import MemoryRegion, Writes
    from dataplane.transports.cuda_ipc import CudaIpcTransport

    ctx = mp.get_context("spawn")
    mine, theirs = ctx.Pipe()
    child = ctx.Process(target=_owner, args=(theirs,), daemon=True)
    child.start()
    try:
        src = torch.randint(0, 256, (2, PAGES * PAGE), dtype=torch.uint8, device="cuda")
        transport = CudaIpcTransport(0)
        transport.register([MemoryRegion(s.data_ptr(), s.numel(), "cuda", 0) for s in src])
        endpoint, blobs = mine.recv()
        peer = transport.connect("decode", endpoint, blobs)
        rng = np.random.default_rng(35)
        rows: list[list[int]] = []
        ends = [0, 0]
        for _ in range(120):
            size = int(rng.choice([512, 96, 13, 4096]))
            count = int(rng.integers(1, 200))
            ls, rs = size + int(rng.choice([0, 8, 512])), size + int(rng.choice([0, 16, 1024]))
            lr, rr = int(rng.integers(0, 2)), int(rng.integers(0, 2))
            lo = int(rng.integers(0, 64)) * 8
            if max(lo + (count - 1) * ls, ends[rr] + (count - 1) * rs) + size > PAGES * PAGE:
                continue
            rows.append([lr, lo, rr, ends[rr], size, count, ls, rs])
            ends[rr] += (count - 1) * rs + size + int(rng.choice([0, 3, 64]))
        # each column contiguous, as ``Writes`` holds them (the strided kernel takes C arrays only)
        cols = np.ascontiguousarray(np.array(rows, dtype=np.int64).T)
        regions = cols[0].astype(np.int32), cols[2].astype(np.int32)
        w = Writes(regions[0], cols[1], regions[1], cols[3], cols[4], cols[5:8].copy())
        transfer = transport.write(peer, w)
        transport.wait(transfer, time.monotonic() + 30)
        last = PAGES * PAGE - 4096
        # entry 0's first write is inside decode's region 0, its third is not; entry 1 lands
        bad = Writes(np.array([0, 1], np.int32), np.array([0, 0]), np.array([0, 1], np.int32),
                     np.array([last, 0]), np.array([64, 64]), np.array([[3, 3], [2048, 128], [2048, 2048]]))
        transfer = transport.write(peer, bad)
        named = rf"write 0: remote region 0 \[{last + 4096}, \+64\) overflows"
        with pytest.raises(TransferFailed, match=named):
            transport.wait(transfer, time.monotonic() + 30)
        mine.send("read")
        got = mine.recv()
        want = [np.full(PAGES * PAGE, 0x5A, np.uint8) for _ in range(2)]
        host = src.cpu().numpy()
        for batch in (w, bad.subset(np.array([False, True]))):
            for lr, lo, rr, ro, size in zip(*batch.expanded().lists, strict=True):
                want[rr][ro:ro + size] = host[lr][lo:lo + size]
        assert all(np.array_equal(g, x) for g, x in zip(got, want, strict=True))
        transport.close()
    finally:
        mine.send("bye")
        child.join(30)


def test_a_peer_on_another_node_is_refused() -> None:
    from dataplane.errors import IncompatiblePeer
    from dataplane.transports import MemoryRegion
    from dataplane.transports.cuda_ipc import CudaIpcTransport, _encode, _Endpoint

    buf = torch.zeros(PAGE, dtype=torch.uint8, device="cuda")
    transport = CudaIpcTransport(0)
    blobs = transport.register([MemoryRegion(buf.data_ptr(), PAGE, "cuda", 0)])
    elsewhere = _encode.encode(_Endpoint("another-boot-id", "node-b", 1, 0))
    with pytest.raises(IncompatiblePeer, match="another node"):
        transport.connect("decode", elsewhere, blobs)
    transport.close()


@pytest.mark.parametrize("profile", ["qwen3-next", "deepseek-v3.2"])
def test_agents_over_cuda_ipc_verify_every_byte(tmp_path, profile) -> None:
    base = config(profile)
    gpu = msgspec.structs.replace(base.transfer, device="cuda", backend="cuda-ipc")
    with agents(tmp_path, msgspec.structs.replace(base, transfer=gpu)) as (_prefill, decode):
        wait_for("12 requests", lambda: finished(decode, 12), timeout=90)
        assert_all_verified(decode, 12, {"kv", "aux"})


def test_prefill_over_cuda_ipc_survives_a_killed_decode(tmp_path) -> None:
    """Decode (the exporter of the memory prefill writes into) is killed mid-stream: prefill marks it
    down by heartbeat, fails its rooms, unmaps its memory and stays healthy."""
    from dataplane.config import SyntheticConfig

    base = config(requests=0)
    slow = msgspec.structs.replace(
        base,
        transfer=msgspec.structs.replace(base.transfer, device="cuda", backend="cuda-ipc"),
        synthetic=SyntheticConfig(requests_per_second=20, requests=0, tokens=(700,), max_inflight=2),
    )
    with agents(tmp_path, slow) as (prefill, decode):
        wait_for("some requests", lambda: decode[0].status()["requests"]["succeeded"] >= 3, timeout=90)
        decode[0].signal(signal.SIGKILL)
        killed = time.monotonic()

        def down() -> bool:
            peers = prefill[0].status()["peers"]
            return bool(peers) and all(p["state"] == "down" for p in peers.values())

        wait_for("decode down on prefill", down, timeout=10)
        assert time.monotonic() - killed < HB * 6 + 2.5
        st = prefill[0].status()
        assert st["rooms"]["inflight"] == 0 and not st["ready"]
        assert "heartbeat lost" in next(iter(st["peers"].values()))["reason"]
        assert b"true" in urllib.request.urlopen(prefill[0].url + "/healthz", timeout=2).read()


def _dies(conn: Any) -> None:
    """An exporter that is killed while its memory is mapped by the peer."""
    from dataplane.transports import MemoryRegion
    from dataplane.transports.cuda_ipc import CudaIpcTransport

    buf = torch.zeros(64 << 20, dtype=torch.uint8, device="cuda")
    transport = CudaIpcTransport(0)
    blobs = transport.register([MemoryRegion(buf.data_ptr(), buf.numel(), "cuda", 0)])
    torch.cuda.synchronize()
    conn.send((transport.endpoint(), blobs))
    time.sleep(600)


def test_a_killed_peer_never_breaks_the_writer() -> None:
    """Writes into a killed peer's mapped memory end (done or failed, within their deadline), and the
    writer's GPU context keeps working: the driver keeps an exporter's allocation while it is mapped."""
    import os
    import signal

    from dataplane.transports import MemoryRegion, TransferState, Writes
    from dataplane.transports.cuda_ipc import CudaIpcTransport

    ctx = mp.get_context("spawn")
    mine, theirs = ctx.Pipe()
    child = ctx.Process(target=_dies, args=(theirs,), daemon=True)
    child.start()
    src = torch.randint(0, 256, (64 << 20,), dtype=torch.uint8, device="cuda")
    transport = CudaIpcTransport(0)
    transport.register([MemoryRegion(src.data_ptr(), src.numel(), "cuda", 0)])
    endpoint, blobs = mine.recv()
    peer = transport.connect("decode", endpoint, blobs)
    pages = np.arange(1024, dtype=np.int64) * 65536
    zero = np.zeros(1024, np.int32)
    w = Writes(zero, pages, zero, pages[::-1].copy(), np.full(1024, 65536))
    first = transport.write(peer, w)
    transport.wait(first, time.monotonic() + 30)
    assert child.pid is not None
    os.kill(child.pid, signal.SIGKILL)
    child.join(30)
    states = []
    for _ in range(3):
        t = transport.write(peer, w)
        deadline = time.monotonic() + 30
        while transport.poll(t) is TransferState.IN_PROGRESS and time.monotonic() < deadline:
            time.sleep(0.001)
        states.append(transport.poll(t))
    print("writes after the kill:", states)
    assert all(s is not TransferState.IN_PROGRESS for s in states)
    transport.disconnect(peer)
    assert int((src[:16].to(torch.int64) * 0 + 1).sum().item()) == 16  # the context still works
    transport.close()
