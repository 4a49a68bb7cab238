"""NIXL's adapter: host memory (DRAM) and VRAM over UCX, one NIXL agent per transport.

Translation only: it registers memory, connects peers and starts, polls and aborts writes. How a
batch is described to NIXL is ``descriptors``; who posts it (in line, the native poster in
``native/``, else the Python thread in ``posting``) is chosen here per batch; everything that touches
NIXL's SDK itself is in ``sdk``. A compact plan (``Writes.repeat``) is taken as it is
(``takes_strided``) and described from its entries.

Peers' region descriptors are our own msgpack ``[addr, size, dev_id, mem_type]``, decoded with
msgspec: NIXL's ``get_serialized_descs`` / ``deserialize_descs`` use pickle and never see peer bytes.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import msgspec
import numpy as np

from ...config import NixlConfig
from ...errors import PDPairError, TransferFailed, WireFormatError
from ..base import MemoryRegion, Peer, Transfer, TransferState, Transport, Writes
from .descriptors import Descriptions, Side, quietly
from .native import NativePoster, NativeUnavailable
from .posting import Poster
from .sdk import (
    EntryPointsUnavailable,
    MemType,
    entry_points,
    load_sdk,
    mapped,
    native_failure,
    new_agent,
    thread_params,
)

log = logging.getLogger(__name__)

RemoteDesc = tuple[int, int, int, MemType]
_decode_desc = msgspec.msgpack.Decoder(RemoteDesc)
_encode = msgspec.msgpack.Encoder()


@dataclass(eq=False)
class NixlPeer(Peer):
    side: Side | None = None
    """Its regions as NIXL sees them and the lists prepared over them."""

    @property
    def agent_name(self) -> str:
        return self.side.agent if self.side is not None else ""


@dataclass(eq=False)
class NixlTransfer(Transfer):
    handles: list[Any] = field(default_factory=list)
    unposted: int = 0
    """Handles still queued on the posting thread (``posting.Poster``); running until 0."""
    cancelled: bool = False
    live: bool = True
    """Counted in the transport's running transfers until ``abort`` (every end passes through it)."""
    post_error: TransferFailed | None = None
    post_lock: threading.Lock = field(default_factory=threading.Lock)
    """Held by the posting thread while it posts one of this transfer's handles, and by ``abort``:
    a handle is never released while being posted, nor posted once released."""
    token: int = 0
    """Its id on the native poster (0: not handed to it); ``wakes`` is true until it is reported."""
    native_status: int = 1
    """What the native poster reported: 0 done, negative a NIXL error (1: not yet)."""


class NixlTransport(Transport):
    """``name`` must be unique among the agents that talk to each other (it names the NIXL agent).

    UCX's own settings (``NixlConfig.ucx_tls``, ``ucx_net_devices``) are the process's environment,
    set where the process starts (``sdk.ucx_environment``); this adapter reads and writes none."""

    name = "nixl"
    takes_strided = True
    """A compact plan's strided entries are described from their counts and strides
    (``descriptors``), never expanded into one row per write first."""
    post_inline_bytes = 256 << 10
    """Batches this small are posted in line even with a posting thread: their copy costs less than
    handing them over (a thread wake-up, ~100 µs on the hosts measured)."""

    def __init__(self, agent_name: str, config: NixlConfig | None = None, *, sdk: ModuleType | None = None):
        config = config or NixlConfig()
        self._sdk = sdk or load_sdk()
        sync = getattr(self._sdk, "nixl_thread_sync_t", None)
        own_threads = config.num_threads > 0
        post_thread = config.post_thread and not own_threads
        extra = {"sync_mode": sync.NIXL_THREAD_SYNC_RW} if post_thread and sync is not None else {}
        threaded = bool(extra)
        conf = self._sdk.nixl_agent_config(
            enable_listen_thread=False, backends=[] if own_threads else list(config.backends),
            enable_prog_thread=config.progress_thread is not False, **extra,
        )
        try:
            self._agent = new_agent(self._sdk, agent_name, conf, config.progress_delay_us)
            if own_threads:
                for backend in config.backends:
                    self._agent.create_backend(backend, thread_params(backend, config.num_threads))
        except Exception as exc:
            raise mapped(exc, "create agent") from exc
        self._closed = False
        self._reg: list[Any] = []
        self._local = Side("", np.zeros((0, 3), dtype=np.uint64), ())
        self._descriptions = Descriptions(self._agent, 1 << 20)
        self._peers: list[NixlPeer] = []
        self._threaded = threaded
        self._poster: Poster | None = None
        self._native: NativePoster | None = None
        self._native_wanted = config.native_poster
        self._native_live: dict[int, NixlTransfer] = {}
        self._tokens = itertools.count(1)
        self._leaked: list[Any] = []
        """Handles the native poster was still inside NIXL with when cancelled: released at close."""
        self._efd: int | None = None
        self._running = 0

    @property
    def prep_limit(self) -> int:
        """Most blocks one prepared list may hold; beyond it, exact descriptors are cheaper."""
        return self._descriptions.prep_limit

    @prep_limit.setter
    def prep_limit(self, value: int) -> None:
        self._descriptions.prep_limit = value

    @property
    def paths(self) -> Counter[str]:
        """Engine requests made so far by how they were described (``descriptors.Descriptions``)."""
        return self._descriptions.paths

    def endpoint(self) -> bytes:
        return bytes(self._agent.get_agent_metadata())

    def _register(self, regions: list[MemoryRegion]) -> list[bytes]:
        mem: tuple[MemType, ...] = tuple("VRAM" if r.device == "cuda" else "DRAM" for r in regions)
        for kind in sorted(set(mem)):
            rows = [(r.addr, r.size, r.device_id, "") for r, m in zip(regions, mem, strict=True) if m == kind]
            try:
                self._reg.append(self._agent.register_memory(rows, kind))
            except Exception as exc:
                raise mapped(exc, f"register {kind}") from exc
        self._local = Side.of("", [(r.addr, r.size, r.device_id) for r in regions], mem)
        if self._threaded and set(mem) == {"DRAM"}:
            self._start_poster()
        return [_encode.encode((r.addr, r.size, r.device_id, m)) for r, m in zip(regions, mem, strict=True)]

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "requests_by_path": dict(self.paths)}

    def _start_poster(self) -> None:
        """The native posting thread when it loads here, else the Python one (the reason logged)."""
        if self._native_wanted:
            efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            try:
                self._native = NativePoster(entry_points(self._agent.agent), efd)
                self._efd = efd
                return
            except (NativeUnavailable, EntryPointsUnavailable, OSError) as exc:
                os.close(efd)
                log.warning("nixl: native poster unavailable, posting from a Python thread: %s", exc)
        self._poster = Poster(self._post_one, self._posted)

    @property
    def wake_fd(self) -> int | None:
        return self._efd

    def collect(self) -> None:
        native = self._native
        if native is None or not self._native_live:
            return
        for token, status in native.take():
            transfer = self._native_live.pop(token, None)
            if transfer is not None:
                transfer.native_status, transfer.wakes = status, False

    def connect(self, peer_id: str, endpoint: bytes, remote_regions: Sequence[bytes]) -> NixlPeer:
        try:
            descs = [_decode_desc.decode(blob) for blob in remote_regions]
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise WireFormatError(f"nixl: peer {peer_id!r} sent a bad region descriptor: {exc}") from exc
        if any(addr <= 0 or size <= 0 or dev < 0 for addr, size, dev, _ in descs):
            raise WireFormatError(f"nixl: peer {peer_id!r} sent a region with a bad address, size or device")
        try:
            agent_name = self._agent.add_remote_agent(bytes(endpoint))
        except Exception as exc:
            raise WireFormatError(f"nixl: peer {peer_id!r} sent unusable agent metadata: {exc}") from exc
        name = agent_name if isinstance(agent_name, str) else agent_name.decode()
        side = Side.of(name, [d[:3] for d in descs], tuple(d[3] for d in descs))
        peer = NixlPeer(peer_id, side.sizes, side=side)
        self._peers.append(peer)
        return peer

    def _release(self, peer: NixlPeer) -> None:
        if self._poster is not None:
            self._poster.drain()  # nothing of this peer's may still be posting from its prepared lists
        for transfer in [t for t in self._native_live.values() if t.peer is peer]:
            self.abort(transfer)
        side, name = peer.side, peer.agent_name
        handles = side.handles() if side is not None else []
        if side is not None:
            side.forget()
        if self._native is not None and self._native.stuck:
            # the native thread is inside a NIXL call that may be this peer's: its lists and
            # connection stay as they are (freed with the agent, if ever)
            log.warning("nixl: %r disconnected without releasing its NIXL state (native poster stuck)",
                        peer.peer_id)
            self._leaked += handles
            return
        errors = [quietly(h.release) for h in handles]
        errors.append(quietly(self._agent.remove_remote_agent, name))
        if any(errors):
            raise TransferFailed(f"nixl: disconnecting {peer.peer_id!r}: {next(e for e in errors if e)}")

    def _start(self, peer: Peer, writes: Writes, overlap: bool) -> NixlTransfer:
        assert isinstance(peer, NixlPeer) and peer.side is not None
        transfer = NixlTransfer(peer, writes.count, writes.nbytes)
        poster = self._poster_for(writes, overlap)
        self._running += 1
        try:
            transfer.handles = self._descriptions.requests(self._local, peer.side, writes)
            if isinstance(poster, NativePoster):
                transfer.token, transfer.wakes = next(self._tokens), True
                self._native_live[transfer.token] = transfer
                poster.submit(transfer.token, [h._handle for h in transfer.handles])
            elif isinstance(poster, Poster):
                transfer.wakes = self.waker is not None
                poster.submit(transfer)
            else:
                for handle in transfer.handles:
                    self._post_one(transfer, handle)
        except PDPairError:
            self.abort(transfer)
            raise
        except Exception as exc:
            self.abort(transfer)
            raise mapped(exc, f"write to {peer.peer_id!r}") from exc
        return transfer

    def _poster_for(self, writes: Writes, overlap: bool) -> Poster | NativePoster | None:
        """The posting thread, when this copy should run there. Only with other work to overlap it
        with (another transfer running, or the caller's word): alone (one room at a time) the worker
        would wait for it anyway and the hand-off only adds latency. A small copy goes there only
        while the thread is awake with work queued anyway (no wake-up to pay): with rooms in flight,
        a room's small component requests would otherwise cost the worker their copies."""
        poster: Poster | NativePoster | None
        if self._native is not None:
            poster, backlog = self._native, len(self._native_live)
        else:
            poster, backlog = self._poster, self._poster.backlog if self._poster is not None else 0
        if poster is None or not (overlap or self._running):
            return None
        return poster if writes.nbytes > self.post_inline_bytes or backlog else None

    def _post_one(self, transfer: NixlTransfer, handle: Any) -> None:
        """Post one prepared handle, in line or on the posting thread; raises ``TransferFailed``."""
        try:
            status = self._agent.transfer(handle)
        except Exception as exc:
            raise mapped(exc, f"write to {transfer.peer.peer_id!r}") from exc
        if status == "ERR":
            raise TransferFailed(f"nixl: posting a write to {transfer.peer.peer_id!r} failed")

    def _posted(self, transfer: NixlTransfer) -> None:
        """On the posting thread, after a transfer's last post: its state is worth a poll now."""
        if transfer.wakes:
            transfer.wakes = False
            waker = self.waker
            if waker is not None:
                waker()

    def poll(self, transfer: Transfer) -> TransferState:
        assert isinstance(transfer, NixlTransfer)
        if transfer.state is not TransferState.IN_PROGRESS or transfer.unposted:
            return transfer.state
        if transfer.token:
            return self._poll_native(transfer)
        if transfer.post_error is not None:
            self.abort(transfer)
            return transfer.fail(transfer.post_error)
        try:
            states = [self._agent.check_xfer_state(h) for h in transfer.handles]
        except Exception as exc:
            self.abort(transfer)
            return transfer.fail(mapped(exc, f"write to {transfer.peer.peer_id!r}"))
        if "ERR" in states:
            self.abort(transfer)
            return transfer.fail(TransferFailed(f"nixl: write to {transfer.peer.peer_id!r} failed"))
        if all(s == "DONE" for s in states):
            self.abort(transfer)
            transfer.state = TransferState.DONE
        return transfer.state

    def _poll_native(self, transfer: NixlTransfer) -> TransferState:
        if transfer.wakes:
            self.collect()
            if transfer.wakes:
                return transfer.state
        status = transfer.native_status
        self.abort(transfer)
        if status == 0:
            transfer.state = TransferState.DONE
            return transfer.state
        return transfer.fail(native_failure(status, f"write to {transfer.peer.peer_id!r}"))

    def abort(self, transfer: Transfer) -> None:
        assert isinstance(transfer, NixlTransfer)
        if self._native_live.pop(transfer.token, None) is not None:
            assert self._native is not None
            transfer.wakes = False
            if not self._native.cancel(transfer.token):
                log.warning(
                    "nixl: a cancelled write to %r is stuck in NIXL; its handles are kept until close",
                    transfer.peer.peer_id,
                )
                self._leaked += transfer.handles
                transfer.handles = []
        with transfer.post_lock:  # waits out a post of this transfer's in progress on the posting thread
            transfer.cancelled = True
            handles, transfer.handles = transfer.handles, []
        if transfer.live:
            transfer.live = False
            self._running -= 1
        if transfer.state is TransferState.IN_PROGRESS:
            transfer.fail(TransferFailed(f"nixl: transfer to {transfer.peer.peer_id!r} aborted"))
        for handle in handles:
            # A handle NIXL cannot cancel yet stays on the agent's leak list, freed when it closes.
            quietly(handle.release)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._poster is not None:
            self._poster.close()
            self._poster = None
        if self._native is not None:
            for transfer in list(self._native_live.values()):
                self.abort(transfer)
            if not self._native.close():
                # its thread is stuck inside NIXL: everything it may touch stays allocated for good
                log.error("nixl: the native poster did not stop; this transport's NIXL state is abandoned")
                _ABANDONED.append(self)
                return
            self._native = None
            for handle in self._leaked:
                quietly(handle.release)
        self._leaked.clear()
        for peer in list(self._peers):
            quietly(self.disconnect, peer)
        for handle in self._local.handles():
            quietly(handle.release)
        self._local.forget()
        for reg in self._reg:
            quietly(self._agent.deregister_memory, reg)
        self._reg.clear()
        if self._efd is not None:
            os.close(self._efd)
            self._efd = None


_ABANDONED: list[NixlTransport] = []
"""Transports whose native poster never stopped: kept alive so that nothing it uses is ever freed."""


__all__ = ["NixlPeer", "NixlTransfer", "NixlTransport"]
