"""Does NIXL's posting thread (``NixlConfig.postThread``) overlap host copies with the worker's own work?

Two ``NixlTransport``s (this process and a spawned peer, host memory, loopback). Per request: ``--work``
µs of pure-Python work (standing in for a room's control path), then one write of two ``--size`` blocks,
with ``--inflight`` requests outstanding (the oldest is waited for). Runs alternate the thread off and
on; prints µs per request and GB/s per run. UCX copies a host write inside ``postXferReq``: posted in
line, copy and work add up; from the thread they overlap.

    python3 bench/nixl_posting.py [--size 1M] [--work 190] [--inflight 4] [--requests 400] [--rounds 2]
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing as mp
import os
import sys
import time
import uuid
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dataplane.commands.args import parse_size
from dataplane.config import NixlConfig
from dataplane.transports import MemoryRegion, Writes
from dataplane.transports.nixl import NixlTransport, ucx_environment

SLOTS = 16


def serve(conn: Connection, name: str, size: int) -> None:
    os.environ.update(ucx_environment(NixlConfig(ucx_net_devices="lo")))  # this process: UCX on loopback
    buffers = [np.zeros(SLOTS * size, dtype=np.uint8) for _ in range(2)]
    transport = NixlTransport(name, NixlConfig(ucx_net_devices="lo"))
    blobs = transport.register([MemoryRegion(b.ctypes.data, b.nbytes) for b in buffers])
    conn.send((transport.endpoint(), blobs))
    conn.recv()
    transport.close()


def spin(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def run(post_thread: bool, size: int, work: float, inflight: int, requests: int) -> float:
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    name = f"posting-peer-{uuid.uuid4().hex[:6]}"
    child = ctx.Process(target=serve, args=(there, name, size), daemon=True)
    child.start()
    try:
        endpoint, blobs = here.recv()
        buffers = [np.ones(SLOTS * size, dtype=np.uint8) for _ in range(2)]
        config = NixlConfig(ucx_net_devices="lo", post_thread=post_thread)
        with NixlTransport(f"posting-{uuid.uuid4().hex[:6]}", config) as transport:
            transport.register([MemoryRegion(b.ctypes.data, b.nbytes) for b in buffers])
            peer = transport.connect(name, endpoint, blobs)
            region = np.array([0, 1], np.int32)
            outstanding: collections.deque = collections.deque()
            deadline = time.monotonic() + 120
            start = 0.0
            for i in range(requests + 20):  # the first 20 warm up
                if i == 20:
                    while outstanding:
                        transport.wait(outstanding.popleft(), deadline)
                    start = time.perf_counter()
                spin(work)
                at = np.full(2, (i % SLOTS) * size)
                outstanding.append(transport.write(peer, Writes(region, at, region, at, np.full(2, size))))
                while len(outstanding) >= inflight:
                    transport.wait(outstanding.popleft(), deadline)
            while outstanding:
                transport.wait(outstanding.popleft(), deadline)
            elapsed = time.perf_counter() - start
        here.send("stop")
    finally:
        child.join(10)
    return elapsed / requests


def main() -> int:
    os.environ.update(ucx_environment(NixlConfig(ucx_net_devices="lo")))  # this process: UCX on loopback
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1M", help="block size; each request writes two blocks")
    ap.add_argument("--work", type=float, default=190.0, help="µs of Python work per request")
    ap.add_argument("--inflight", type=int, default=4)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    size = parse_size(args.size)
    for _ in range(args.rounds):
        for post_thread in (False, True):
            per = run(post_thread, size, args.work, args.inflight, args.requests)
            print(
                f"post thread {'on ' if post_thread else 'off'}  {args.size} x2, work {args.work:.0f} us, "
                f"{args.inflight} in flight: {per * 1e6:7.1f} us/request, {2 * size / per / 1e9:6.2f} GB/s",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
