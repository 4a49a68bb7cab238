"""NIXL host-memory write throughput between two processes on loopback, through ``NixlTransport``.

Cases: one 64 MiB block, and 4096 scattered 64 KiB blocks (256 MiB, random slot order on both sides).
UCX default transports (CMA / shared memory) vs ``UCX_TLS=tcp``; ``UCX_NET_DEVICES=lo`` always.

    .venv/bin/python bench/nixl_probe.py [--repeat 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import sys
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dataplane.config import NixlConfig
from dataplane.transports import MemoryRegion, Writes
from dataplane.transports.nixl import NixlTransport, ucx_environment
from tests.integration.transport_peer import serve

SIZE = 256 << 20
BLOCK = 64 << 10


def cases(rng: np.random.Generator) -> dict[str, Writes]:
    n = SIZE // BLOCK
    one = np.zeros(1, np.int32)
    zero = np.zeros(1, np.int64)
    big = Writes(one, zero, one, zero, np.array([64 << 20], np.int64))
    scattered = Writes(
        np.zeros(n, np.int32), rng.permutation(n).astype(np.int64) * BLOCK,
        np.zeros(n, np.int32), rng.permutation(n).astype(np.int64) * BLOCK, np.full(n, BLOCK, np.int64),
    )
    return {"1 x 64 MiB": big, "4096 x 64 KiB scattered": scattered}


def measure(tls: str | None, repeat: int) -> list[dict[str, object]]:
    ctx = mp.get_context("spawn")
    conn, child_conn = ctx.Pipe()
    child = ctx.Process(target=serve, args=(child_conn, f"probe-peer-{tls}", [SIZE], tls), daemon=True)
    child.start()
    conn.send(("hello",))
    endpoint, blobs, _ = conn.recv()
    src = np.random.default_rng(0).integers(0, 256, SIZE, dtype=np.uint8)
    config = NixlConfig(ucx_tls=tls, ucx_net_devices="lo")
    for var in ("UCX_TLS", "UCX_NET_DEVICES"):  # this process's UCX settings, for this measurement
        os.environ.pop(var, None)
    os.environ.update(ucx_environment(config))
    t = NixlTransport(f"probe-{tls}", config)
    t.register([MemoryRegion(src.ctypes.data, SIZE)])
    peer = t.connect("peer", endpoint, blobs)
    rows = []
    for name, w in cases(np.random.default_rng(1)).items():
        t.wait(t.write(peer, w), time.monotonic() + 60)
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            t.wait(t.write(peer, w), time.monotonic() + 60)
            times.append(time.perf_counter() - t0)
        best, median = min(times), float(np.median(times))
        rows.append({"ucx": tls or "default", "case": name, "bytes": w.nbytes,
                     "best_gbps": w.nbytes / best / 1e9, "median_gbps": w.nbytes / median / 1e9})
    t.close()
    conn.send(("exit",))
    child.join(10)
    return rows


def memcpy_gbps() -> float:
    """The machine's own copy speed now: the yardstick, since load on a shared host moves everything."""
    a, b = np.ones(SIZE, np.uint8), np.empty(SIZE, np.uint8)
    np.copyto(b, a)
    t0 = time.perf_counter()
    np.copyto(b, a)
    return SIZE / (time.perf_counter() - t0) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = measure(None, args.repeat) + measure("tcp", args.repeat)
    if args.json:
        print(json.dumps({"memcpy_gbps": memcpy_gbps(), "rows": rows}))
        return
    host = f"{platform.node()} {platform.machine()}, python {platform.python_version()}"
    print(f"# {host}, nixl-cu12 {version('nixl-cu12')}, numpy {np.__version__}")
    base = memcpy_gbps()
    print(f"# in-process numpy memcpy of 256 MiB right now: {base:.2f} GB/s (rel = median / memcpy)")
    print(f"{'ucx':8} {'case':26} {'best GB/s':>10} {'median GB/s':>12} {'rel':>6}")
    for r in rows:
        rel = float(r["median_gbps"]) / base  # type: ignore[arg-type]
        print(f"{r['ucx']:8} {r['case']:26} {r['best_gbps']:10.2f} {r['median_gbps']:12.2f} {rel:6.2f}")


if __name__ == "__main__":
    main()
