"""One NIXL request per room, or one per component? The engine's fixed cost per request, measured.

Two ``NixlTransport``s (this process and a spawned peer, host memory, loopback): the same writes posted
as one request or split into several, each case timed per iteration (post + wait for all), rounds
alternating between cases; prints the median and best microseconds per iteration. This is the
measurement behind ``agent/requests.py: transfer_requests`` (docs/benchmarks.md, 18:02).

    python3 bench/nixl_requests.py [--iterations 1500] [--rounds 6]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
import uuid
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dataplane.config import NixlConfig
from dataplane.transports import MemoryRegion, Writes
from dataplane.transports.nixl import NixlTransport, ucx_environment

KV, AUX, MAMBA = 0, 1, 2
SIZES = [256 << 20, 64 << 10, 1 << 20]
"""KV pool large enough that a mixed batch's 64 B block exceeds the prepared-list limit (exact path)."""


def serve(conn: Connection, name: str) -> None:
    """The peer: registers ``SIZES`` and waits until told to exit."""
    os.environ.update(ucx_environment(NixlConfig(ucx_net_devices="lo")))  # this process: UCX on loopback
    buffers = [np.zeros(n, dtype=np.uint8) for n in SIZES]
    transport = NixlTransport(name, NixlConfig(ucx_net_devices="lo"))
    blobs = transport.register([MemoryRegion(b.ctypes.data, b.nbytes) for b in buffers])
    conn.send((transport.endpoint(), blobs))
    conn.recv()
    transport.close()


def writes(rows: list[tuple[int, int, int, int, int]]) -> Writes:
    a = np.array(rows, dtype=np.int64)
    return Writes(a[:, 0].astype(np.int32), a[:, 1], a[:, 2].astype(np.int32), a[:, 3], a[:, 4])


def cases() -> dict[str, list[list[tuple[int, int, int, int, int]]]]:
    kv = [(KV, 4096 * 5, KV, 4096 * 7, 4096)]
    aux = [(AUX, 64 * 3, AUX, 64 * 4, 64)]
    mamba = [(MAMBA, 1024 * 2, MAMBA, 1024 * 9, 1024)]
    kv30 = [(KV, 4096 * 3 * i, KV, 4096 * (3 * i + 1), 4096) for i in range(30)]
    mamba72 = [(MAMBA, 1024 * i, MAMBA, 1024 * i, 1024) for i in range(72)]
    return {
        "kv + aux: 2 requests": [kv, aux],
        "kv + aux: 1 request": [kv + aux],
        "kv + aux + mamba: 3 requests": [kv, aux, mamba],
        "kv + aux + mamba: 1 request": [kv + aux + mamba],
        "30 kv + aux + 72 mamba: 3 requests": [kv30, aux, mamba72],
        "30 kv + aux + 72 mamba: 1 request": [kv30 + aux + mamba72],
    }


def main() -> int:
    os.environ.update(ucx_environment(NixlConfig(ucx_net_devices="lo")))  # this process: UCX on loopback
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iterations", type=int, default=1500, help="iterations per case and round")
    p.add_argument("--rounds", type=int, default=6, help="rounds, cases alternating within each")
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    child = ctx.Process(target=serve, args=(there, f"peer-{uuid.uuid4().hex[:8]}"), daemon=True)
    child.start()
    endpoint, blobs = here.recv()
    buffers = [np.ones(n, dtype=np.uint8) for n in SIZES]
    results: dict[str, list[float]] = {}
    with NixlTransport("requests-bench", NixlConfig(ucx_net_devices="lo")) as transport:
        transport.register([MemoryRegion(b.ctypes.data, b.nbytes) for b in buffers])
        peer = transport.connect("peer", endpoint, blobs)
        prepared = {name: [writes(g) for g in groups] for name, groups in cases().items()}
        for _ in range(args.rounds):
            for name, batches in prepared.items():
                start = time.perf_counter()
                for _ in range(args.iterations):
                    transfers = [transport.write(peer, w) for w in batches]
                    for t in transfers:
                        transport.wait(t, time.monotonic() + 5)
                per = (time.perf_counter() - start) / args.iterations * 1e6
                results.setdefault(name, []).append(per)
    here.send("exit")
    child.join(10)
    print(f"{'case':40s} {'median us':>10s} {'best us':>10s}")
    for name, values in results.items():
        print(f"{name:40s} {statistics.median(values):10.1f} {min(values):10.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
