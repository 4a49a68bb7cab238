"""MoRI-IO adapter (AMD ``amd-mori`` 1.2.4, ``mori.io``): GPU or host memory over RDMA.

Translation only. A batch of writes becomes one ``batch_write`` call with one group per (local region,
remote region) pair, each group its offset and size lists under its own transfer uid (mori's
``BatchWrite`` binds them as vectors); its statuses are polled. A compact plan (``Writes.repeat``) is
taken as it is: each group's offsets are worked out from its entries' counts and strides. Peer bytes are
validated with msgspec against mori's msgpack layouts (``EngineDesc`` 6 fields, ``MemoryDesc`` 15)
before mori's own ``unpack`` sees them. The SDK is injected (``sdk=``) or imported lazily, so tests pass
``dataplane.transports.mori_double`` — the MoRI hardware test double — without patching anything.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import msgspec
import numpy as np

from ..config import MoriConfig
from ..errors import PDPairError, PeerGone, TransferFailed, WireFormatError
from .base import MemoryRegion, Peer, Transfer, TransferState, Transport, Writes


class _EngineWire(msgspec.Struct, array_like=True):
    key: str
    node_id: str
    hostname: str
    host: str
    port: int
    pid: int


class _MemoryWire(msgspec.Struct, array_like=True):
    engine_key: str
    id: int
    device_id: int
    device_bus_id: str
    data: int
    size: int
    loc: int
    ipc_handle: bytes
    numa_node: int
    ipc_offset: int
    fabric_handle: bytes
    vpod_id: int
    vpod_ppod_id: str
    fabric_offset: int
    fabric_alloc_size: int


def rdma_environment(config: MoriConfig) -> dict[str, str]:
    """``MORI_RDMA_DEVICES`` as ``config`` asks: MoRI picks its NICs from it when the backend is
    created and takes them no other way, so the process sets it where it starts (the agent's
    runtime), before its engine is made."""
    return {"MORI_RDMA_DEVICES": ",".join(config.rdma_devices)} if config.rdma_devices else {}


def load_sdk() -> ModuleType:
    try:
        return importlib.import_module("mori.io")
    except ImportError as exc:
        raise TransferFailed(f"MoRI-IO (amd-mori, mori.io) is not importable: {exc}") from exc


def _mapped(exc: Exception, what: str) -> TransferFailed:
    return TransferFailed(f"mori: {what}: {type(exc).__name__}: {exc}")


def _offsets(writes: Writes, sel: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The local offsets, remote offsets and sizes of the selected entries' writes: a compact
    entry (``Writes.repeat``) becomes its ``count`` writes, ``stride`` bytes apart on each side, worked
    out per (local, remote) region pair rather than the whole batch expanded first."""
    lo, ro, size = writes.local_offset[sel], writes.remote_offset[sel], writes.size[sel]
    if writes.repeat is None:
        return lo, ro, size
    count, ls, rs = writes.repeat[:, sel]
    entry = np.repeat(np.arange(len(count)), count)
    step = np.arange(len(entry), dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
    return lo[entry] + step * ls[entry], ro[entry] + step * rs[entry], size[entry]


@dataclass(eq=False)
class MoriPeer(Peer):
    engine: Any = None
    descs: list[Any] = field(default_factory=list)

    @property
    def key(self) -> str:
        return str(self.engine.key)


@dataclass(eq=False)
class MoriTransfer(Transfer):
    statuses: list[Any] = field(default_factory=list)


class MoriTransport(Transport):
    """``key`` names the engine (unique per process and peer set); ``host`` is the address it binds."""

    name = "mori"
    takes_strided = True

    def __init__(
        self, key: str, host: str, config: MoriConfig | None = None, *, port: int = 0,
        sdk: ModuleType | None = None,
    ):
        config = config or MoriConfig()
        self._sdk = sdk or load_sdk()
        poll = self._sdk.PollCqMode.EVENT if config.poll_cq_mode == "event" else self._sdk.PollCqMode.POLLING
        try:
            self._engine = self._sdk.IOEngine(key, self._sdk.IOEngineConfig(host=host, port=port))
            self._engine.create_backend(self._sdk.BackendType.RDMA, self._sdk.RdmaBackendConfig(
                qp_per_transfer=config.qp_per_transfer, post_batch_size=config.post_batch_size,
                num_worker_threads=config.num_worker_threads, poll_cq_mode=poll, enable_notification=False,
            ))
        except Exception as exc:
            raise _mapped(exc, "create engine") from exc
        self._descs: list[Any] = []
        self._peers: list[MoriPeer] = []
        self._dead: set[str] = set()
        self._closed = False

    def endpoint(self) -> bytes:
        return bytes(self._engine.get_engine_desc().pack())

    def _register(self, regions: list[MemoryRegion]) -> list[bytes]:
        loc = self._sdk.MemoryLocationType
        for r in regions:
            gpu = r.device == "cuda"
            try:
                self._descs.append(self._engine.register_memory(
                    r.addr, r.size, r.device_id if gpu else -1, loc.GPU if gpu else loc.CPU))
            except Exception as exc:
                raise _mapped(exc, f"register {r.size} B at {r.addr:#x}") from exc
        return [bytes(d.pack()) for d in self._descs]

    def connect(self, peer_id: str, endpoint: bytes, remote_regions: Sequence[bytes]) -> MoriPeer:
        try:
            key = msgspec.msgpack.decode(endpoint, type=_EngineWire).key
            wires = [msgspec.msgpack.decode(b, type=_MemoryWire) for b in remote_regions]
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise WireFormatError(f"mori: peer {peer_id!r} sent a bad descriptor: {exc}") from exc
        if any(w.engine_key != key or w.size <= 0 for w in wires):
            raise WireFormatError(f"mori: peer {peer_id!r} sent memory of another engine or of no size")
        try:
            engine = self._sdk.EngineDesc.unpack(endpoint)
            self._engine.register_remote_engine(engine)
            descs = [self._sdk.MemoryDesc.unpack(b) for b in remote_regions]
        except Exception as exc:
            raise _mapped(exc, f"connect {peer_id!r}") from exc
        self._dead.discard(key)
        sizes = np.array([w.size for w in wires], dtype=np.int64)
        peer = MoriPeer(peer_id, sizes, engine=engine, descs=descs)
        self._peers.append(peer)
        return peer

    def _release(self, peer: MoriPeer) -> None:
        try:
            self._engine.deregister_remote_engine(peer.engine)
        except Exception as exc:
            raise _mapped(exc, f"disconnect {peer.peer_id!r}") from exc

    def _start(self, peer: Peer, writes: Writes, overlap: bool) -> MoriTransfer:
        assert isinstance(peer, MoriPeer)
        if peer.key in self._dead:
            raise PeerGone(f"mori: peer {peer.peer_id!r} ({peer.key}) has failed")
        pair_key = np.stack([writes.local_region, writes.remote_region])
        pairs, group = np.unique(pair_key, axis=1, return_inverse=True)
        args: list[list[Any]] = [[], [], [], [], [], []]
        for g, (lr, rr) in enumerate(pairs.T):
            lo, ro, size = _offsets(writes, group.reshape(-1) == g)
            values = (
                self._descs[lr], lo.tolist(), peer.descs[rr], ro.tolist(), size.tolist(),
                self._engine.allocate_transfer_uid(),
            )
            for out, value in zip(args, values, strict=True):
                out.append(value)
        try:
            statuses = list(self._engine.batch_write(*args))
        except Exception as exc:
            raise _mapped(exc, f"batch_write to {peer.peer_id!r}") from exc
        return MoriTransfer(peer, writes.count, writes.nbytes, statuses=statuses)

    def poll(self, transfer: Transfer) -> TransferState:
        assert isinstance(transfer, MoriTransfer)
        if transfer.state is not TransferState.IN_PROGRESS:
            return transfer.state
        self._drain_failures()
        peer = transfer.peer
        assert isinstance(peer, MoriPeer)
        if peer.key in self._dead:
            return transfer.fail(PeerGone(f"mori: peer {peer.peer_id!r} ({peer.key}) has failed"))
        failed = [s for s in transfer.statuses if s.Failed()]
        if failed:
            return transfer.fail(TransferFailed(
                f"mori: write to {peer.peer_id!r} failed: {failed[0].Code()}: {failed[0].Message()}"))
        if all(s.Succeeded() for s in transfer.statuses):
            transfer.state = TransferState.DONE
        return transfer.state

    def abort(self, transfer: Transfer) -> None:
        """MoRI cannot recall posted RDMA writes: forget the statuses; the memory must stay registered."""
        assert isinstance(transfer, MoriTransfer)
        transfer.statuses = []
        if transfer.state is TransferState.IN_PROGRESS:
            transfer.fail(TransferFailed(f"mori: transfer to {transfer.peer.peer_id!r} aborted"))

    def _drain_failures(self) -> None:
        pop = getattr(self._engine, "pop_peer_failure", None)
        for _ in range(1024):
            key = pop() if pop is not None else None
            if not key:
                return
            self._dead.add(str(key))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        errors: list[PDPairError] = []
        for peer in list(self._peers):
            try:
                self.disconnect(peer)
            except PDPairError as exc:
                errors.append(exc)
        for desc in self._descs:
            try:
                self._engine.deregister_memory(desc)
            except Exception as exc:
                errors.append(_mapped(exc, "deregister"))
        self._descs.clear()
        self._engine = None
        if errors:
            raise errors[0]
