"""NIXL adapter: host memory (DRAM) and VRAM over UCX, one NIXL agent per transport.

Translation only. Writes go through pre-prepared descriptor lists: for a batch whose offsets and sizes
share a block size ``g``, every region is prepared once (per peer, per ``g``) as a strided list of
``g``-byte blocks, and each request is just two index arrays for ``make_prepped_xfer`` (NIXL merges
adjacent blocks back into large transfers). A small batch of mixed sizes (a room: KV pages, a state
slot, a 64-byte aux slot) uses lists that cut each region by its own grain instead (``Cut``,
``blocks.settle_grains``): one index per item, no descriptors built per request — on the 2-vCPU dev VM
a 12-write request cost 64-68 µs to make, post and finish as exact descriptors and 42 µs this way.
Batches neither way fits (lists too long, or far more indices than writes) go as exact descriptors
(``initialize_xfer``).

Peers' region descriptors are our own msgpack ``[addr, size, dev_id, mem_type]``, decoded with
msgspec: NIXL's ``get_serialized_descs`` / ``deserialize_descs`` use pickle and never see peer bytes.
"""

from __future__ import annotations

import collections
import importlib
import itertools
import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Literal

import msgspec
import numpy as np

from ..config import NixlConfig
from ..errors import PDPairError, PeerGone, TransferFailed, WireFormatError
from . import blocks
from .base import SMALL, MemoryRegion, Peer, Transfer, TransferState, Transport, Writes
from .native import NativePoster, NativeUnavailable
from .posting import Poster

log = logging.getLogger("pdpair.transports.nixl")

SDK_MODULES = ("nixl_cu12._api", "nixl_cu13._api", "nixl._api")
MemType = Literal["DRAM", "VRAM"]
RemoteDesc = tuple[int, int, int, MemType]
INDICES_PER_ROW = 8
"""A batch whose common block size would need more prepared-list indices than this per write (plus
64) goes as exact descriptors, one per write: a mixed batch's block is its smallest write's."""
GRAIN_REFUSALS = 16
"""A peer whose small batches this many times could not be cut by grain (lists over ``prep_limit``)
stops trying: its batches go the other ways without the attempt's cost."""
_decode_desc = msgspec.msgpack.Decoder(RemoteDesc)
_encode = msgspec.msgpack.Encoder()


def load_sdk() -> ModuleType:
    """The first NIXL python API that imports (CUDA 12 wheel, CUDA 13 wheel, meta package)."""
    for name in SDK_MODULES:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise TransferFailed(f"NIXL is not installed (tried {', '.join(SDK_MODULES)})")


_BUILD = threading.Lock()


def _new_agent(sdk: ModuleType, name: str, conf: Any, progress_delay_us: int) -> Any:
    """``sdk.nixl_agent(name, conf)`` with the progress thread's delay set.

    NIXL's Python API hard-wires ``pthrDelay = 0``: the UCX progress thread then spins without pause,
    a whole core per agent even when idle, which starves every other thread of a small host (the
    agent's own worker, the peer process). With a delay the thread arms the UCX worker and sleeps in
    ``poll`` until an event or the delay, at ~4% of a core. The API offers no parameter for it, so the
    one bindings call that builds the agent is intercepted, under a lock, while the agent is made."""
    bind = getattr(sdk, "nixlBind", None)
    if bind is None or progress_delay_us <= 0:
        return sdk.nixl_agent(name, conf)
    build = bind.nixlAgent

    def with_delay(agent_name: str, agent_config: Any) -> Any:
        agent_config.pthrDelay = progress_delay_us
        return build(agent_name, agent_config)

    with _BUILD:
        bind.nixlAgent = with_delay
        try:
            return sdk.nixl_agent(name, conf)
        finally:
            bind.nixlAgent = build


def _thread_params(backend: str, threads: int) -> dict[str, str]:
    """Backend parameters that hand every request to the backend's own ``threads`` threads.

    NIXL's UCX backend splits a request across its dedicated threads only from ``split_batch_size``
    descriptors (default 1024); a room's request has a few, so without it ``num_threads`` changes
    nothing. With it the post returns once the thread has issued the writes, and UCX copies a host
    write while that thread progresses its own worker: no Python thread waits on the copy."""
    if backend == "UCX":
        return {"num_threads": str(threads), "split_batch_size": "1"}
    key = _THREAD_PARAM.get(backend)
    return {key: str(threads)} if key is not None else {}


_THREAD_PARAM = {
    "OBJ": "num_threads", "LIBFABRIC": "num_threads", "GDS_MT": "thread_count", "UCCL": "num_cpus",
}
"""Each other backend's name for its thread count, as NIXL's own ``nixl_agent`` passes it."""


def _mapped(exc: Exception, what: str) -> TransferFailed:
    if type(exc).__name__ == "nixlRemoteDisconnectError":
        return PeerGone(f"nixl: {what}: peer disconnected ({exc})")
    return TransferFailed(f"nixl: {what}: {type(exc).__name__}: {exc}")


REMOTE_DISCONNECT = -10
"""NIXL's ``NIXL_ERR_REMOTE_DISCONNECT`` (``nixl_types.h``), as the native poster reports it."""


def _native_failure(status: int, what: str) -> TransferFailed:
    if status == REMOTE_DISCONNECT:
        return PeerGone(f"nixl: {what}: peer disconnected")
    return TransferFailed(f"nixl: {what} failed (NIXL status {status})")


@dataclass(eq=False)
class NixlPeer(Peer):
    agent_name: str = ""
    descs: np.ndarray = field(default_factory=lambda: np.zeros((0, 3), dtype=np.uint64))
    table: list[list[int]] = field(default_factory=list)
    """``descs`` as Python lists (a room's few exact descriptors are built faster from them)."""
    mem: tuple[MemType, ...] = ()
    prepped: dict[tuple[MemType, int], Any] = field(default_factory=dict)
    bases: dict[tuple[MemType, int], np.ndarray] = field(default_factory=dict)
    """(kind, block) → first block index of each region in that prepared list (``blocks.layout``)."""
    cut: Cut | None = None
    one_kind: bool = True
    """Every region of one memory kind: a batch needs no split by kind (``_by_memory``)."""


@dataclass(eq=False)
class Cut:
    """One side's regions, each cut in blocks of its own grain, as one prepared list per memory kind
    (``blocks.settle_grains``). A grain only ever shrinks (to a divisor), and a kind's list is remade
    when one of its grains does; the lists it replaces stay alive until the side goes (``close``,
    ``disconnect``), since transfers made from them may still run."""

    agent: str
    grains: list[int]
    lists: dict[MemType, tuple[Any, list[int]]] = field(default_factory=dict)
    """kind → (prepared list, each region's first index in it; -1: not in it)"""
    retired: list[Any] = field(default_factory=list)
    refusals: int = 0

    def handles(self) -> list[Any]:
        return [h for h, _ in self.lists.values()] + self.retired


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
    """``name`` must be unique among the agents that talk to each other (it names the NIXL agent)."""

    name = "nixl"
    post_inline_bytes = 256 << 10
    """Batches this small are posted in line even with a posting thread: their copy costs less than
    handing them over (a thread wake-up, ~100 µs on the hosts measured)."""
    prep_limit = 1 << 20
    """Most blocks one prepared list may hold; beyond it, exact descriptors are cheaper."""

    def __init__(self, agent_name: str, config: NixlConfig | None = None, *, sdk: ModuleType | None = None):
        config = config or NixlConfig()
        # UCX reads its configuration from the environment when the backend is created, and NIXL
        # offers no other way to pass it: this constructor is the one place that writes os.environ.
        for var, value in (("UCX_TLS", config.ucx_tls), ("UCX_NET_DEVICES", config.ucx_net_devices)):
            if value is not None:
                os.environ[var] = value
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
            self._agent = _new_agent(self._sdk, agent_name, conf, config.progress_delay_us)
            if own_threads:
                for backend in config.backends:
                    self._agent.create_backend(backend, _thread_params(backend, config.num_threads))
        except Exception as exc:
            raise _mapped(exc, "create agent") from exc
        self._closed = False
        self._reg: list[Any] = []
        self._descs = np.zeros((0, 3), dtype=np.uint64)
        self._table: list[list[int]] = []
        self._mem: tuple[MemType, ...] = ()
        self._local_prepped: dict[tuple[MemType, int], Any] = {}
        self._local_bases: dict[tuple[MemType, int], np.ndarray] = {}
        self._cut: Cut | None = None
        self._one_kind = True
        self.paths: collections.Counter[str] = collections.Counter()
        """Engine requests made so far by how they were described: ``grain`` (lists cut by grain),
        ``block`` (lists cut in one block size), ``exact`` (descriptors built for the request)."""
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

    def endpoint(self) -> bytes:
        return bytes(self._agent.get_agent_metadata())

    def _register(self, regions: list[MemoryRegion]) -> list[bytes]:
        mem: tuple[MemType, ...] = tuple("VRAM" if r.device == "cuda" else "DRAM" for r in regions)
        for kind in sorted(set(mem)):
            rows = [(r.addr, r.size, r.device_id, "") for r, m in zip(regions, mem, strict=True) if m == kind]
            try:
                self._reg.append(self._agent.register_memory(rows, kind))
            except Exception as exc:
                raise _mapped(exc, f"register {kind}") from exc
        self._descs = np.array([(r.addr, r.size, r.device_id) for r in regions], dtype=np.uint64)
        self._table = self._descs.tolist()
        self._mem = mem
        self._cut = Cut("", [0] * len(regions))
        self._one_kind = len(set(mem)) == 1
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
                self._native = NativePoster(self._agent.agent, efd)
                self._efd = efd
                return
            except (NativeUnavailable, OSError) as exc:
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
        peer = NixlPeer(
            peer_id,
            np.array([d[1] for d in descs], dtype=np.int64),
            agent_name=agent_name if isinstance(agent_name, str) else agent_name.decode(),
            descs=np.array([d[:3] for d in descs], dtype=np.uint64).reshape(-1, 3),
            table=[list(d[:3]) for d in descs],
            mem=tuple(d[3] for d in descs),
        )
        peer.cut = Cut(peer.agent_name, [0] * len(descs))
        peer.one_kind = len(set(peer.mem)) <= 1
        self._peers.append(peer)
        return peer

    def _release(self, peer: NixlPeer) -> None:
        if self._poster is not None:
            self._poster.drain()  # nothing of this peer's may still be posting from its prepared lists
        for transfer in [t for t in self._native_live.values() if t.peer is peer]:
            self.abort(transfer)
        if self._native is not None and self._native.stuck:
            # the native thread is inside a NIXL call that may be this peer's: its lists and
            # connection stay as they are (freed with the agent, if ever)
            log.warning("nixl: %r disconnected without releasing its NIXL state (native poster stuck)",
                        peer.peer_id)
            self._leaked += [*peer.prepped.values(), *(peer.cut.handles() if peer.cut else [])]
            peer.prepped.clear()
            peer.cut = None
            return
        handles = [*peer.prepped.values(), *(peer.cut.handles() if peer.cut else [])]
        errors = [self._quietly(h.release) for h in handles]
        peer.prepped.clear()
        peer.cut = None
        errors.append(self._quietly(self._agent.remove_remote_agent, peer.agent_name))
        if any(errors):
            raise TransferFailed(f"nixl: disconnecting {peer.peer_id!r}: {next(e for e in errors if e)}")

    def _start(self, peer: Peer, writes: Writes, overlap: bool) -> NixlTransfer:
        assert isinstance(peer, NixlPeer)
        transfer = NixlTransfer(peer, len(writes), writes.nbytes)
        poster = self._poster_for(writes, overlap)
        self._running += 1
        try:
            parts = self._by_memory(peer, writes)
            transfer.handles = [self._prepare(peer, w, lm, rm) for w, lm, rm in parts]
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
            raise _mapped(exc, f"write to {peer.peer_id!r}") from exc
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

    def _by_memory(self, peer: NixlPeer, writes: Writes) -> list[tuple[Writes, MemType, MemType]]:
        """The batch cut by (local, remote) memory kind: one NIXL request per pair. Both sides of one
        kind (the usual case) skip the per-write split, which dominated small requests' posting."""
        if self._one_kind and peer.one_kind:
            return [(writes, self._mem[0], peer.mem[0])]
        lmem, rmem = np.array(self._mem)[writes.local_region], np.array(peer.mem)[writes.remote_region]
        pairs = sorted(set(zip(lmem.tolist(), rmem.tolist(), strict=True)))
        return [(writes.subset((lmem == lm) & (rmem == rm)), lm, rm) for lm, rm in pairs]

    def _post_one(self, transfer: NixlTransfer, handle: Any) -> None:
        """Post one prepared handle, in line or on the posting thread; raises ``TransferFailed``."""
        try:
            status = self._agent.transfer(handle)
        except Exception as exc:
            raise _mapped(exc, f"write to {transfer.peer.peer_id!r}") from exc
        if status == "ERR":
            raise TransferFailed(f"nixl: posting a write to {transfer.peer.peer_id!r} failed")

    def _posted(self, transfer: NixlTransfer) -> None:
        """On the posting thread, after a transfer's last post: its state is worth a poll now."""
        if transfer.wakes:
            transfer.wakes = False
            waker = self.waker
            if waker is not None:
                waker()

    def _prepare(self, peer: NixlPeer, w: Writes, lm: MemType, rm: MemType) -> Any:
        if len(w) <= SMALL:
            handle = self._by_grains(peer, w, lm, rm)
            if handle is not None:
                self.paths["grain"] += 1
                return handle
        g = blocks.block_size(w, self._local_sizes, peer.remote_sizes, self.prep_limit)
        if g is not None and w.nbytes // g > INDICES_PER_ROW * len(w) + 64:
            g = None  # e.g. one room's 1 MiB page and 64 B aux slot: 16K indices, or two exact rows
        if g is None:
            local = _exact(self._descs, self._table, w, remote=False)
            remote = _exact(peer.descs, peer.table, w, remote=True)
            local, remote = self._agent.get_xfer_descs(local, lm), self._agent.get_xfer_descs(remote, rm)
            handle = self._agent.initialize_xfer("WRITE", local, remote, peer.agent_name)
            self.paths["exact"] += 1
        else:
            lside = self._prepped(self._local_prepped, "", self._descs, self._mem, lm, g)
            rside = self._prepped(peer.prepped, peer.agent_name, peer.descs, peer.mem, rm, g)
            lbase = _bases(self._local_bases, self._local_sizes, self._mem, lm, g)
            rbase = _bases(peer.bases, peer.remote_sizes, peer.mem, rm, g)
            lidx = blocks.block_indices(w.local_region, w.local_offset, w.size, lbase, g)
            ridx = blocks.block_indices(w.remote_region, w.remote_offset, w.size, rbase, g)
            handle = self._agent.make_prepped_xfer("WRITE", lside, lidx, rside, ridx)
            self.paths["block"] += 1
        return handle

    def _by_grains(self, peer: NixlPeer, w: Writes, lm: MemType, rm: MemType) -> Any:
        """A small batch as indices into both sides' lists cut by grain, re-cutting a side whose
        grains it does not fit; None: it goes another way (lists would pass ``prep_limit``, or it
        needs far more indices than writes, e.g. a 1 MiB write into a region cut in 64-byte blocks)."""
        local, remote = self._cut, peer.cut
        if local is None or remote is None or remote.refusals >= GRAIN_REFUSALS:
            return None
        lists = w.lists
        settled = blocks.settle_grains(lists, local.grains, remote.grains)
        if settled is None:
            return None
        new_l, new_r = settled
        lg = local.grains if not new_l else [new_l.get(r, g) for r, g in enumerate(local.grains)]
        rg = remote.grains if not new_r else [new_r.get(r, g) for r, g in enumerate(remote.grains)]
        if sum(s // lg[a] for a, s in zip(lists[0], lists[4], strict=True)) > INDICES_PER_ROW * len(w) + 64:
            return None
        if (new_l or new_r) and not self._recut(peer, local, remote, (new_l, lg), (new_r, rg)):
            return None
        lhandle, lbases = local.lists[lm]
        rhandle, rbases = remote.lists[rm]
        li, ri = blocks.grain_indices(lists, local.grains, lbases, rbases)
        return self._agent.make_prepped_xfer("WRITE", lhandle, li, rhandle, ri)

    def _recut(
        self, peer: NixlPeer, local: Cut, remote: Cut,
        lnew: tuple[dict[int, int], list[int]], rnew: tuple[dict[int, int], list[int]],
    ) -> bool:
        """Adopt new grains on both sides — (changed regions, every region's grain) each — remaking
        the lists of the memory kinds they touch, all or nothing; False (nothing changed) when a
        list would pass ``prep_limit`` (counted against the peer) or NIXL cannot prepare one (the
        peer then stops trying)."""
        sides = (
            (local, self._descs, self._mem, self._local_sizes, *lnew),
            (remote, peer.descs, peer.mem, peer.remote_sizes, *rnew),
        )
        plans = []
        for cut, descs, mem, sizes, changed, grains in sides:
            for kind in sorted({mem[r] for r in changed}):
                mask = np.array(mem) == kind
                if blocks.cut_entries(sizes.tolist(), grains, mask.tolist()) > self.prep_limit:
                    remote.refusals += 1
                    return False
                plans.append((cut, kind, descs, mask, grains))
        made: list[tuple[Cut, MemType, Any, list[int]]] = []
        try:
            for cut, kind, descs, mask, grains in plans:
                rows, bases = blocks.cut_rows(descs, grains, mask)
                made.append((cut, kind, self._agent.prep_xfer_dlist(cut.agent, rows, kind), bases))
        except Exception as exc:
            log.warning("nixl: cannot prepare lists cut by grain for %r, not trying again: %s",
                        peer.peer_id, exc)
            for _, _, handle, _ in made:
                self._quietly(handle.release)
            remote.refusals = GRAIN_REFUSALS
            return False
        local.grains, remote.grains = lnew[1], rnew[1]
        for cut, kind, handle, bases in made:
            old = cut.lists.get(kind)
            if old is not None:
                cut.retired.append(old[0])
            cut.lists[kind] = (handle, bases)
        return True

    def _prepped(
        self, cache: dict[tuple[MemType, int], Any], agent: str, descs: np.ndarray,
        mem: tuple[MemType, ...], kind: MemType, block: int,
    ) -> Any:
        """The prepared list of ``kind`` regions cut in ``block``-byte blocks, made once and cached."""
        if (kind, block) not in cache:
            rows = blocks.strided_rows(descs, np.array(mem) == kind, block)
            cache[kind, block] = self._agent.prep_xfer_dlist(agent, rows, kind)
        return cache[kind, block]

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
            return transfer.fail(_mapped(exc, f"write to {transfer.peer.peer_id!r}"))
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
        return transfer.fail(_native_failure(status, f"write to {transfer.peer.peer_id!r}"))

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
            self._quietly(handle.release)

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
                self._quietly(handle.release)
        self._leaked.clear()
        for peer in list(self._peers):
            self._quietly(self.disconnect, peer)
        for handle in [*self._local_prepped.values(), *(self._cut.handles() if self._cut else [])]:
            self._quietly(handle.release)
        self._local_prepped.clear()
        self._cut = None
        for reg in self._reg:
            self._quietly(self._agent.deregister_memory, reg)
        self._reg.clear()
        if self._efd is not None:
            os.close(self._efd)
            self._efd = None

    @staticmethod
    def _quietly(fn: Any, *args: Any) -> Exception | None:
        try:
            fn(*args)
        except Exception as exc:
            return exc
        return None


_ABANDONED: list[NixlTransport] = []
"""Transports whose native poster never stopped: kept alive so that nothing it uses is ever freed."""


def _bases(
    cache: dict[tuple[MemType, int], np.ndarray], sizes: np.ndarray, mem: tuple[MemType, ...],
    kind: MemType, block: int,
) -> np.ndarray:
    """``blocks.layout`` of one side's ``kind`` regions, computed once per (kind, block)."""
    if (kind, block) not in cache:
        cache[kind, block] = blocks.layout(sizes, np.array(mem) == kind, block)
    return cache[kind, block]


def _exact(
    descs: np.ndarray, table: list[list[int]], w: Writes, *, remote: bool
) -> np.ndarray | list[tuple[int, int, int]]:
    """(addr, len, dev) rows for exactly the given writes' local (or remote) side: tuples for a few
    (a room's; ``table`` is ``descs`` as lists), else Nx3."""
    if len(w) <= SMALL:
        lr, lo, rr, ro, sizes = w.lists
        ids, offs = (rr, ro) if remote else (lr, lo)
        return [(table[r][0] + off, n, table[r][2]) for r, off, n in zip(ids, offs, sizes, strict=True)]
    region, offset = (w.remote_region, w.remote_offset) if remote else (w.local_region, w.local_offset)
    rows = np.empty((len(w), 3), dtype=np.uint64)
    rows[:, 0] = descs[region, 0] + offset.astype(np.uint64)
    rows[:, 1] = w.size
    rows[:, 2] = descs[region, 2]
    return rows
