"""The copy UCX makes between two processes on one host (CMA, ``process_vm_writev``), by memory kind.

    .venv/bin/python bench/cma_copy.py [--kinds anon-thp,memfd,memfd-hugetlb] [--chunks 1M,16M]
                                       [--buffer 64M] [--seconds 1] [--json]

A child process allocates and touches a destination buffer of each kind; the parent writes into it
from a source buffer of the same kind, chunk after chunk, for ``--seconds``, and reports GB/s. Kinds:
``anon-thp`` (private memory with transparent huge pages: what the direct agent's numpy pools get),
``anon-4k`` (private, huge pages refused), ``memfd`` (ordinary shared pages: the sidecar engine's pools
on a host without reserved huge pages), ``memfd-hugetlb`` (shared, reserved 2 MiB pages: the sidecar
engine's pools where the host has them; needs ``/proc/sys/vm/nr_hugepages``). It isolates the page-size
effect on a sidecar's transfer from everything else the agents do (docs/sidecar.md).
Linux only.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import sys
import time
from typing import Any

MFD_HUGETLB = 4
KINDS = ("anon-thp", "anon-4k", "memfd", "memfd-hugetlb")


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _libc() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    iov = ctypes.POINTER(_Iovec)
    libc.process_vm_writev.argtypes = [ctypes.c_int, iov, ctypes.c_ulong, iov, ctypes.c_ulong, ctypes.c_ulong]
    libc.process_vm_writev.restype = ctypes.c_ssize_t
    return libc


def allocate(kind: str, size: int) -> tuple[mmap.mmap, int, Any]:
    """A touched buffer of ``kind``: the mapping, its address, and the ctypes view keeping it."""
    if kind.startswith("anon"):
        mm = mmap.mmap(-1, size, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        mm.madvise(mmap.MADV_HUGEPAGE if kind == "anon-thp" else mmap.MADV_NOHUGEPAGE)
    else:
        fd = os.memfd_create("pdpair-cma", os.MFD_CLOEXEC | (MFD_HUGETLB if kind == "memfd-hugetlb" else 0))
        try:
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED)
        finally:
            os.close(fd)
    mm.write(b"\1" * size)
    view = (ctypes.c_char * size).from_buffer(mm)
    return mm, ctypes.addressof(view), view


def measure(kind: str, chunk: int, seconds: float, size: int) -> float:
    """GB/s of ``process_vm_writev`` from this process into a child's buffer, both of ``kind``."""
    libc = _libc()
    addr_r, addr_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            _, addr, _view = allocate(kind, size)
            os.write(addr_w, addr.to_bytes(8, "little"))
        except OSError:
            code = 1
            os.write(addr_w, (0).to_bytes(8, "little"))
        os.read(done_r, 1)
        os._exit(code)
    try:
        remote = int.from_bytes(os.read(addr_r, 8), "little")
        if not remote:
            raise OSError(f"{kind}: the child could not allocate (huge pages reserved?)")
        _, local, _view = allocate(kind, size)
        moved, n, start = 0, 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            off = (n * chunk) % (size - size % chunk)
            src, dst = _Iovec(local + off, chunk), _Iovec(remote + off, chunk)
            got = libc.process_vm_writev(pid, ctypes.byref(src), 1, ctypes.byref(dst), 1, 0)
            if got != chunk:
                raise OSError(ctypes.get_errno(), f"process_vm_writev wrote {got} of {chunk} bytes")
            moved, n = moved + got, n + 1
        return moved / (time.perf_counter() - start) / 1e9
    finally:
        os.write(done_w, b"x")
        os.waitpid(pid, 0)
        for fd in (addr_r, addr_w, done_r, done_w):
            os.close(fd)


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20}
    text = text.strip().upper()
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kinds", default="anon-thp,memfd,memfd-hugetlb", help=f"of {', '.join(KINDS)}")
    p.add_argument("--chunks", default="1M,16M", help="bytes per write")
    p.add_argument("--buffer", default="64M", help="each process's buffer (2 MiB multiples for hugetlb)")
    p.add_argument("--seconds", type=float, default=1.0, help="per kind and chunk")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = set(kinds) - set(KINDS)
    if unknown:
        p.error(f"unknown kinds {sorted(unknown)}; choose from {', '.join(KINDS)}")
    size = parse_size(args.buffer)
    chunks = [parse_size(c) for c in args.chunks.split(",") if c]
    if size <= 0 or any(c <= 0 or c > size for c in chunks):
        p.error(f"chunks must be between 1 byte and the buffer ({size} bytes)")
    rows = []
    for chunk in chunks:
        for kind in kinds:
            try:
                gbps = measure(kind, chunk, args.seconds, size)
                rows.append({"kind": kind, "chunk": chunk, "gbps": round(gbps, 3)})
            except OSError as exc:
                rows.append({"kind": kind, "chunk": chunk, "gbps": None, "error": str(exc)})
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        for r in rows:
            rate = f"{r['gbps']:7.2f} GB/s" if r["gbps"] is not None else f"  failed: {r['error']}"
            print(f"{r['chunk'] >> 10:>8} KiB  {r['kind']:14} {rate}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
