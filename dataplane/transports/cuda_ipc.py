"""CUDA IPC adapter: GPU memory of a peer on the same node, written by one copy kernel per batch.

For prefill and decode on one node (one GPU, or GPUs joined by NVLink), a network transport only adds
per-descriptor costs: UCX's cuda_ipc path reached 0.3 GB/s on 4 KiB pages and about 55% of a
device-to-device copy on 64 MiB blocks (docs/gpu.md). Here the peer's regions are mapped into this
process once (``cudaIpcOpenMemHandle``), and a batch of writes — any number, any sizes, any regions —
is one launch of ``copy_kernel``: the plan's five columns go up as one table, and the kernel finds each
write's addresses, checks its bounds and copies it page to page, so small pages need no staging and
the host's work does not grow with the pages. A TP-sliced plan goes up compact (``takes_strided``):
three more columns give each row's count and strides, and the kernel copies every write they stand
for, so a room's head slices cost its rows, not its tokens, on the host. Completion is a CUDA event;
transfers finish in launch order (one stream), so their buffers are released oldest first. A kernel
cannot be cancelled, but it never waits on the peer: it ends on its own, and ``disconnect`` waits for
this stream before unmapping.

Bounds are checked by the kernel (``bounds_checked_by_engine``): a write outside its regions is
skipped, and the transfer fails naming the first such write, as ``check_bounds`` would have.

Region blobs carry the allocation's IPC handle and the region's offset in it; the endpoint carries the
node's boot id, and ``connect`` refuses a peer on another node (IPC handles mean nothing there).
The same shape serves MoRI's intra-node XGMI path on AMD (HIP IPC); only CUDA was run.
"""

from __future__ import annotations

import os
import socket
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from ..errors import BadInput, IncompatiblePeer, TransferFailed, WireFormatError
from .base import MemoryRegion, Peer, Transfer, TransferState, Transport, Writes, write_error
from .copy_kernel import CopyKernel, columns, geometry, pack, prepare_strided, region_table
from .cudart import D2H, H2D, CudaError, runtime
from .ipc_memory import export_ipc, open_ipc

ALIGN = 256
"""Each side's base pointer is its lowest region's address rounded down to this (allocations are)."""


class _Endpoint(msgspec.Struct, array_like=True, frozen=True):
    node: str
    hostname: str
    pid: int
    device_id: int


class _Region(msgspec.Struct, array_like=True, frozen=True):
    handle: bytes
    offset: int
    size: int
    alloc_size: int
    addr: int
    """The region's address in the exporting process (used as is by a peer in that same process)."""


_decode_endpoint = msgspec.msgpack.Decoder(_Endpoint)
_decode_region = msgspec.msgpack.Decoder(_Region)
_encode = msgspec.msgpack.Encoder()


def node_id() -> str:
    """This node's boot id: equal for two processes exactly when they share the machine's GPUs."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return socket.gethostname()


def parse_peer(
    peer_id: str, endpoint: bytes, remote_regions: Sequence[bytes]
) -> tuple[_Endpoint, list[_Region]]:
    """A peer's endpoint and region blobs, decoded and checked before any handle is opened: the peer
    must run on this node, and every region must lie inside the allocation its handle names."""
    try:
        ep = _decode_endpoint.decode(endpoint)
        regions = [_decode_region.decode(b) for b in remote_regions]
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise WireFormatError(f"cuda-ipc: peer {peer_id!r} sent a bad endpoint or region: {exc}") from exc
    if ep.node != node_id():
        raise IncompatiblePeer(
            f"cuda-ipc: peer {peer_id!r} runs on another node ({ep.hostname}); CUDA IPC reaches only "
            "this node's GPUs — use the nixl or mori backend between nodes"
        )
    if not regions:
        raise WireFormatError(f"cuda-ipc: peer {peer_id!r} registered no regions")
    for i, r in enumerate(regions):
        if len(r.handle) != 64:
            raise WireFormatError(
                f"cuda-ipc: peer {peer_id!r} region {i}: IPC handle of {len(r.handle)} bytes, not 64"
            )
        if r.size <= 0 or r.offset < 0 or r.offset + r.size > r.alloc_size:
            raise WireFormatError(
                f"cuda-ipc: peer {peer_id!r} region {i} [{r.offset}, +{r.size}) lies outside its "
                f"{r.alloc_size}-byte allocation"
            )
    return ep, regions


@dataclass(eq=False)
class CudaIpcPeer(Peer):
    addrs: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """Mapped address of each remote region in this process."""
    base: int = 0
    closers: list[Callable[[], None]] = field(default_factory=list)
    regions: Any = None
    """The kernel's region table for this peer and us (``copy_kernel.region_table``), on the device."""


@dataclass(eq=False)
class CudaIpcTransfer(Transfer):
    event: int = 0
    table: Any = None
    """The batch's packed table: pinned host memory (numpy view), then the flag read back into it."""
    buffers: tuple[Any, ...] = ()
    """The pinned and device tables (``_table``), kept until the kernel is done with them."""
    rows: int = 0
    """Entries in the table (``count`` counts writes: a strided entry is several)."""
    strided: bool = False


class CudaIpcTransport(Transport):
    """One process's GPU regions, writable by peers on the same node; writes to peers' regions."""

    name = "cuda-ipc"
    one_request_rows = 1 << 62
    """Any room is one kernel: one launch and one event beat one per component."""
    bounds_checked_by_engine = True
    takes_strided = True
    """A TP-sliced plan's strided entries go up as they are; the kernel expands them (``copy_kernel``)."""
    spare_tables = 8
    """Table buffers (pinned and device) kept for reuse: allocating them per batch cost ~35 µs in the
    agent, a fifth of its host time per room (docs/gpu.md)."""

    def __init__(self, device_id: int = 0):
        import torch

        self._torch = torch
        if not torch.cuda.is_available():
            raise BadInput("the cuda-ipc transport needs a CUDA device (torch sees none)")
        self._device = torch.device("cuda", device_id)
        self._device_id = device_id
        torch.cuda.set_device(device_id)
        self._rt = runtime()
        self._rt.set_device(device_id)
        self._thread = threading.get_ident()
        self._tables: list[tuple[Any, Any, np.ndarray]] = []
        self._stream_obj = torch.cuda.Stream(self._device)
        self._stream = int(self._stream_obj.cuda_stream)
        self._engine_stream = int(torch.cuda.default_stream(self._device).cuda_stream)
        self._ready = self._rt.event()
        self._events: list[int] = []
        self._inflight: deque[CudaIpcTransfer] = deque()
        self._kernel = CopyKernel(torch, self._device)  # compiled now, not inside a room's deadline
        self._addrs = np.zeros(0, dtype=np.int64)
        self._base = 0
        self._peers: list[CudaIpcPeer] = []
        self._closed = False

    def endpoint(self) -> bytes:
        return _encode.encode(_Endpoint(node_id(), socket.gethostname(), os.getpid(), self._device_id))

    def _register(self, regions: list[MemoryRegion]) -> list[bytes]:
        blobs = []
        for i, r in enumerate(regions):
            if r.device != "cuda":
                raise BadInput(f"cuda-ipc: region {i} is host memory; this transport moves GPU memory only")
            if r.device_id != self._device_id:
                raise BadInput(f"cuda-ipc: region {i} is on GPU {r.device_id}, not {self._device_id}")
            handle, offset, alloc_size = export_ipc(r.addr, r.device_id)
            blobs.append(_encode.encode(_Region(handle, offset, r.size, alloc_size, r.addr)))
        self._addrs = np.array([r.addr for r in regions], dtype=np.int64)
        self._base = int(self._addrs.min()) // ALIGN * ALIGN
        return blobs

    def connect(self, peer_id: str, endpoint: bytes, remote_regions: Sequence[bytes]) -> CudaIpcPeer:
        ep, regions = parse_peer(peer_id, endpoint, remote_regions)
        peer = CudaIpcPeer(peer_id, np.array([r.size for r in regions], dtype=np.int64))
        try:
            mapped: dict[int, int] = {}
            for r in regions:
                if ep.pid == os.getpid():
                    continue  # our own memory, valid here as is (a process cannot open its own handles)
                if r.addr - r.offset not in mapped:  # each allocation once, however many regions it holds
                    ptr, closer = open_ipc(r.handle, self._device_id)
                    mapped[r.addr - r.offset] = ptr
                    peer.closers.append(closer)
            peer.addrs = np.array(
                [r.addr if ep.pid == os.getpid() else mapped[r.addr - r.offset] + r.offset for r in regions],
                dtype=np.int64,
            )
            peer.base = int(peer.addrs.min()) // ALIGN * ALIGN
            table = region_table(
                self._addrs - self._base, self._local_sizes, peer.addrs - peer.base, peer.remote_sizes
            )
            peer.regions = self._torch.from_numpy(table).to(self._device)
        except BaseException:
            for closer in peer.closers:
                closer()
            raise
        self._peers.append(peer)
        return peer

    def _release(self, peer: CudaIpcPeer) -> None:
        self._stream_obj.synchronize()  # no kernel of ours may still be writing into the mapping
        self._retire()
        peer.regions = None
        closers, peer.closers = peer.closers, []
        for closer in closers:
            closer()

    def _start(self, peer: Peer, writes: Writes, overlap: bool) -> CudaIpcTransfer:
        assert isinstance(peer, CudaIpcPeer)
        rt, stream = self._rt, self._stream
        n = len(writes)
        nbytes = writes.nbytes
        transfer = CudaIpcTransfer(peer, writes.count, nbytes, rows=n, strided=writes.repeat is not None)
        try:
            self._retire()
            if threading.get_ident() != self._thread:  # the device is per thread; kernels launch on it
                rt.set_device(self._device_id)
                self._thread = threading.get_ident()
            words = 1 + columns(writes) * n
            transfer.buffers = host, dev, view = self._table(words)
            if writes.repeat is None:
                transfer.table = pack(writes, lambda k: view[:k])
                g = geometry(n, nbytes, int(writes.size.max()))
            else:
                transfer.table, g = prepare_strided(writes, lambda k: view[:k])
            # Sources are written by the engine on its default stream: copy only after that work.
            rt.record(self._ready, self._engine_stream)
            rt.wait(stream, self._ready)
            rt.memcpy(dev.data_ptr(), host.data_ptr(), 8 * words, H2D, stream)
            self._kernel.launch(
                g, stream, (self._base, peer.base), peer.regions.data_ptr(), dev.data_ptr(), n,
                len(self._addrs), len(peer.addrs),
            )
            rt.memcpy(host.data_ptr(), dev.data_ptr(), 8, D2H, stream)  # the flag, read at completion
            transfer.event = self._events.pop() if self._events else rt.event()
            rt.record(transfer.event, stream)
        except Exception as exc:
            raise TransferFailed(f"cuda-ipc: write to {peer.peer_id!r}: {type(exc).__name__}: {exc}") from exc
        self._inflight.append(transfer)
        return transfer

    def _table(self, words: int) -> tuple[Any, Any, np.ndarray]:
        """A spare pinned and device table pair of at least ``words`` int64 words, or a new one."""
        for i in range(len(self._tables) - 1, -1, -1):
            if len(self._tables[i][2]) >= words:
                return self._tables.pop(i)
        size = 1 << max(10, (words - 1).bit_length())
        host = self._torch.empty(size, dtype=self._torch.int64, pin_memory=True)
        dev = self._torch.empty(size, dtype=self._torch.int64, device=self._device)
        return host, dev, host.numpy()

    def _retire(self) -> None:
        """Finish the transfers whose event is done, oldest first (one stream: they end in order), and
        release their buffers and events."""
        while self._inflight:
            transfer = self._inflight[0]
            try:
                if not self._rt.done(transfer.event):
                    return
            except CudaError as exc:  # the context is broken: nothing in flight will finish
                for t in self._inflight:
                    if t.state is TransferState.IN_PROGRESS:
                        t.fail(TransferFailed(f"cuda-ipc: write to {t.peer.peer_id!r}: {exc}"))
                self._inflight.clear()
                return
            self._inflight.popleft()
            self._events.append(transfer.event)
            if transfer.state is TransferState.IN_PROGRESS:
                self._finish(transfer)
            if len(self._tables) < self.spare_tables:
                self._tables.append(transfer.buffers)
            transfer.table, transfer.buffers = None, ()

    def _finish(self, transfer: CudaIpcTransfer) -> None:
        table, n = transfer.table, transfer.rows
        bad = int(table[0])
        if bad >= n:
            transfer.state = TransferState.DONE
            return
        lr, lo, rr, ro, size = (int(table[1 + k * n + bad]) for k in range(5))
        assert isinstance(transfer.peer, CudaIpcPeer)
        sizes = self._local_sizes.tolist(), transfer.peer.remote_sizes.tolist()
        why = write_error(bad, lr, lo, rr, ro, size, *sizes)
        if why is None and transfer.strided:  # the entry's first write is inside: its last is not
            count, ls, rs = (int(table[1 + k * n + bad]) for k in range(5, 8))
            last = (lo + (count - 1) * ls, ro + (count - 1) * rs)
            why = write_error(bad, lr, last[0], rr, last[1], size, *sizes) or f"write {bad}: count {count}"
        transfer.fail(TransferFailed(f"cuda-ipc: write to {transfer.peer.peer_id!r} refused by the copy "
                                     f"kernel (nothing written for it): {why}"))

    def poll(self, transfer: Transfer) -> TransferState:
        assert isinstance(transfer, CudaIpcTransfer)
        if transfer.state is TransferState.IN_PROGRESS:
            self._retire()
        return transfer.state

    def abort(self, transfer: Transfer) -> None:
        """A launched kernel runs to its end (it never waits on the peer); the transfer just fails. Its
        buffers stay until the kernel is done."""
        if transfer.state is TransferState.IN_PROGRESS:
            transfer.fail(TransferFailed(f"cuda-ipc: transfer to {transfer.peer.peer_id!r} aborted"))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for peer in list(self._peers):
            self.disconnect(peer)
        self._stream_obj.synchronize()
        self._retire()
        for event in [*self._events, self._ready]:
            self._rt.destroy(event)
        self._events = []
