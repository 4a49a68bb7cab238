"""CUDA IPC adapter: GPU memory of a peer on the same node, written by one copy kernel per batch.

For prefill and decode on one node (one GPU, or GPUs joined by NVLink), a transfer engine only adds
per-descriptor costs: UCX's cuda_ipc path reached 0.3 GB/s on 4 KiB pages and about 55% of a
device-to-device copy on 64 MiB blocks (docs/gpu.md). Here the peer's regions are mapped into this
process once (``cudaIpcOpenMemHandle``), and a batch of writes — any number, any sizes, any regions —
is one ``copy_spans`` launch on the transport's stream: the plan's offsets go to the GPU as one small
table and every page is copied straight from its source page to its destination page, so small pages
need no staging. Writes of 16 MiB and more go first, as ``cudaMemcpyAsync`` calls that start at once.
Completion is a CUDA event. A kernel cannot be cancelled, but it never waits on the
peer: it ends on its own, and ``disconnect`` waits for this stream before unmapping.

Region blobs carry the allocation's IPC handle and the region's offset in it; the endpoint carries the
node's boot id, and ``connect`` refuses a peer on another node (IPC handles mean nothing there).
The same shape serves MoRI's intra-node XGMI path on AMD (HIP IPC); only CUDA was run.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from ..errors import BadInput, IncompatiblePeer, TransferFailed, WireFormatError
from .base import MemoryRegion, Peer, Transfer, TransferState, Transport, Writes
from .ipc_memory import DeviceBuffer, export_ipc, memcpy_async, open_ipc
from .spans import plan_writes

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


@dataclass(eq=False)
class CudaIpcTransfer(Transfer):
    event: Any = None
    table: Any = None
    host_table: Any = None
    """The span table on the device and in pinned host memory, kept until the transfer is done."""


class CudaIpcTransport(Transport):
    """One process's GPU regions, writable by peers on the same node; writes to peers' regions."""

    name = "cuda-ipc"
    one_request_rows = 1 << 62
    """Any room is one kernel: one launch and one event beat one per component."""
    memcpy_bytes = 16 << 20
    memcpy_max = 64
    """Writes this large (up to this many in a batch) go as ``cudaMemcpyAsync`` calls (``_copy_large``)."""

    def __init__(self, device_id: int = 0):
        import torch

        self._torch = torch
        if not torch.cuda.is_available():
            raise BadInput("the cuda-ipc transport needs a CUDA device (torch sees none)")
        self._device = torch.device("cuda", device_id)
        self._device_id = device_id
        torch.cuda.set_device(device_id)
        self._stream = torch.cuda.Stream(self._device)
        self._ready = torch.cuda.Event()
        self._addrs = np.zeros(0, dtype=np.int64)
        self._base = 0
        self._peers: list[CudaIpcPeer] = []
        self._views: dict[tuple[int, int], Any] = {}
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
        self._span_kernel_warm()
        return blobs

    def _span_kernel_warm(self) -> None:
        """Compile the copy kernel's usual variants now, not inside the first room's deadline."""
        from ..staging.kernels import copy_spans

        empty = self._torch.zeros((3, 1), dtype=self._torch.int64, device=self._device)
        with self._torch.cuda.stream(self._stream):
            for mean in (128, 256, 512, 1024, 2048):  # every tile width, 16-byte units
                copy_spans(self._view(self._base, 8), self._view(self._base, 8), empty, 2, mean)
        self._stream.synchronize()

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
        except BaseException:
            for closer in peer.closers:
                closer()
            raise
        peer.base = int(peer.addrs.min()) // ALIGN * ALIGN
        self._peers.append(peer)
        return peer

    def disconnect(self, peer: Peer) -> None:
        assert isinstance(peer, CudaIpcPeer)
        if not peer.connected:
            return
        peer.connected = False
        self._peers.remove(peer)
        self._stream.synchronize()  # no kernel of ours may still be writing into the mapping
        self._views = {k: v for k, v in self._views.items() if k[0] != peer.base}
        closers, peer.closers = peer.closers, []
        for closer in closers:
            closer()

    def _view(self, base: int, unit: int) -> Any:
        """A tensor whose data pointer is ``base``, typed for ``unit``-byte elements (the kernel uses
        only the pointer)."""
        key = (base, unit)
        if key not in self._views:
            t = self._torch.as_tensor(DeviceBuffer(base, 16, self._device_id), device=self._device)
            self._views[key] = t.view({16: self._torch.int64, 8: self._torch.int64, 4: self._torch.int32,
                                       2: self._torch.int16, 1: self._torch.uint8}[unit])
        return self._views[key]

    def _start(self, peer: Peer, writes: Writes) -> CudaIpcTransfer:
        assert isinstance(peer, CudaIpcPeer)
        torch = self._torch
        transfer = CudaIpcTransfer(peer, len(writes), writes.nbytes)
        try:
            with torch.cuda.stream(self._stream):
                # Sources are written by the engine on its default stream: copy only after that work.
                self._ready.record(torch.cuda.default_stream(self._device))
                self._stream.wait_event(self._ready)
                rest = self._copy_large(peer, writes)
                if len(rest):
                    self._launch(peer, rest, transfer)
                transfer.event = torch.cuda.Event()
                transfer.event.record(self._stream)
        except Exception as exc:
            raise TransferFailed(f"cuda-ipc: write to {peer.peer_id!r}: {type(exc).__name__}: {exc}") from exc
        return transfer

    def _copy_large(self, peer: CudaIpcPeer, writes: Writes) -> Writes:
        """Writes of ``memcpy_bytes`` or more as one ``cudaMemcpyAsync`` each (they start at once, while
        the rest is planned); returns the rest. 16 x 64 MiB: 1.92 TB/s as copies, 1.93 as the kernel,
        but the kernel starts only after the batch's planning and upload."""
        if writes.size.max() < self.memcpy_bytes:
            return writes
        large = writes.size >= self.memcpy_bytes
        if int(np.count_nonzero(large)) > self.memcpy_max:
            return writes
        copy, stream = memcpy_async(), self._stream.cuda_stream
        rows = zip(
            writes.local_region[large].tolist(), writes.local_offset[large].tolist(),
            writes.remote_region[large].tolist(), writes.remote_offset[large].tolist(),
            writes.size[large].tolist(), strict=True,
        )
        for lr, lo, rr, ro, n in rows:
            copy(int(peer.addrs[rr]) + ro, int(self._addrs[lr]) + lo, n, stream)
        return writes.subset(~large)

    def _launch(self, peer: CudaIpcPeer, writes: Writes, transfer: CudaIpcTransfer) -> None:
        """The rest as one ``copy_spans`` kernel; its table goes up from pinned memory, which torch's
        host allocator keeps from reuse until the upload is done."""
        from ..staging.kernels import copy_spans

        torch = self._torch

        def pinned(n: int) -> np.ndarray:
            transfer.host_table = torch.empty((3, n), dtype=torch.int64, pin_memory=True)
            return transfer.host_table.numpy()

        spans = plan_writes(
            writes.local_region, writes.local_offset, writes.remote_region, writes.remote_offset,
            writes.size, (self._addrs, peer.addrs), (self._base, peer.base), pinned,
        )
        transfer.table = transfer.host_table.to(self._device, non_blocking=True)
        copy_spans(
            self._view(self._base, spans.unit), self._view(peer.base, spans.unit),
            transfer.table, 2 if spans.unit == 16 else 1, spans.mean_units,
        )

    def poll(self, transfer: Transfer) -> TransferState:
        assert isinstance(transfer, CudaIpcTransfer)
        if transfer.state is not TransferState.IN_PROGRESS:
            return transfer.state
        try:
            done = transfer.event.query()
        except Exception as exc:
            return transfer.fail(TransferFailed(f"cuda-ipc: write to {transfer.peer.peer_id!r}: {exc}"))
        if done:
            transfer.table = transfer.host_table = None
            transfer.state = TransferState.DONE
        return transfer.state

    def abort(self, transfer: Transfer) -> None:
        """A launched kernel runs to its end (it never waits on the peer); the transfer just fails."""
        if transfer.state is TransferState.IN_PROGRESS:
            transfer.fail(TransferFailed(f"cuda-ipc: transfer to {transfer.peer.peer_id!r} aborted"))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for peer in list(self._peers):
            self.disconnect(peer)
        self._stream.synchronize()

