"""The one seam between the agent and a transport (NIXL, MoRI, CUDA IPC): ``Transport`` and its small
value types.

An adapter (NIXL, MoRI) only translates: it registers memory, hands out opaque blobs the peer needs,
starts one-sided writes and reports their state. Everything above — handshake, planning, completion
notices, deadline policy — lives in the agent and is written once.

What the base class owns, so no adapter can forget it:

- bounds: every write is checked against the local and remote region sizes *before* the engine sees it
  (``PlanError``); nothing out of bounds ever reaches an engine — except one that checks every write
  itself and skips those outside (``bounds_checked_by_engine``: cuda-ipc's copy kernel);
- deadlines: ``wait`` polls until done, failed or past the deadline, and on a deadline aborts the
  transfer (a frozen peer over TCP never completes it) before raising ``DeadlineExceeded``.
"""

from __future__ import annotations

import enum
import functools
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol

import numpy as np
from mypy_extensions import mypyc_attr

from ..errors import BadInput, DeadlineExceeded, PlanError, TransferFailed
from .batch_kernels import FIRST_BAD

Device = Literal["cpu", "cuda"]


@dataclass(frozen=True)
class MemoryRegion:
    """A contiguous buffer this process owns; ``addr`` is a raw pointer (host or device)."""

    addr: int
    size: int
    device: Device = "cpu"
    device_id: int = 0

    def __post_init__(self) -> None:
        if self.addr <= 0 or self.size <= 0:
            raise BadInput(f"memory region needs a positive address and size, got {self.addr:#x}+{self.size}")
        if self.device not in ("cpu", "cuda"):
            raise BadInput(f"memory region device must be 'cpu' or 'cuda', got {self.device!r}")


class WriteSpec(Protocol):
    """Parallel arrays, one entry per write; the planner's ``WritePlan`` has exactly these."""

    local_region: Any
    local_offset: Any
    remote_region: Any
    remote_offset: Any
    size: Any


COLUMNS = ("local_region", "local_offset", "remote_region", "remote_offset", "size")
"""The five parallel arrays of a batch of writes, in ``Writes``' field order."""


@dataclass(frozen=True)
class Writes:
    """Validated, contiguous parallel arrays (int32 region ids, int64 offsets and sizes).

    ``repeat`` (``None``: one write per entry) is a compact plan's ``(3, n)`` int64
    ``[count; local stride; remote stride]`` (``WritePlan.repeat``): entry ``i`` stands for
    ``count[i]`` writes, the ``k``-th at ``offset + k * stride`` on each side. Only a transport with
    ``takes_strided`` is given such a batch; ``Transport.write`` expands it for the others."""

    local_region: np.ndarray
    local_offset: np.ndarray
    remote_region: np.ndarray
    remote_offset: np.ndarray
    size: np.ndarray
    repeat: np.ndarray | None = None

    @classmethod
    def of(cls, spec: WriteSpec) -> Writes:
        """Normalise a plan (or anything with the five arrays, and maybe ``repeat``) and check their
        shapes."""
        arrays = [
            np.ascontiguousarray(getattr(spec, name), dtype=np.int32 if name.endswith("region") else np.int64)
            for name in COLUMNS
        ]
        n = arrays[0].shape
        if any(a.ndim != 1 or a.shape != n for a in arrays):
            raise PlanError(f"write arrays must be 1-D and of one length, got {[a.shape for a in arrays]}")
        lr, lo, rr, ro, size = arrays
        rep = getattr(spec, "repeat", None)
        if rep is None:
            return cls(lr, lo, rr, ro, size)
        repeat = np.ascontiguousarray(rep, dtype=np.int64)
        if repeat.shape != (3, n[0]):
            raise PlanError(f"write repeat must be (3, {n[0]}) [count; strides], got {repeat.shape}")
        return cls(lr, lo, rr, ro, size, repeat)

    @classmethod
    def concat(cls, parts: Sequence[Writes]) -> Writes:
        """Several batches as one (in order), e.g. the rooms one engine request carries together."""
        lr, lo, rr, ro, size = (np.concatenate([getattr(w, name) for w in parts]) for name in COLUMNS)
        if all(w.repeat is None for w in parts):
            return cls(lr, lo, rr, ro, size)
        return cls(lr, lo, rr, ro, size, np.concatenate([w.repeats() for w in parts], axis=1))

    def subset(self, mask: np.ndarray) -> Writes:
        lr, lo, rr, ro, size = (getattr(self, name)[mask] for name in COLUMNS)
        return Writes(lr, lo, rr, ro, size, None if self.repeat is None else self.repeat[:, mask])

    def __len__(self) -> int:
        return int(self.size.shape[0])

    @functools.cached_property
    def nbytes(self) -> int:
        if self.repeat is not None:
            return int((self.size * self.repeat[0]).sum())
        return sum(self.lists[4]) if len(self.size) <= SMALL else int(self.size.sum())

    @property
    def count(self) -> int:
        """Writes in the batch (entries times their counts)."""
        return len(self) if self.repeat is None else int(self.repeat[0].sum())

    @functools.cached_property
    def lists(self) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
        """The five columns as Python lists, made once: a room's few writes are checked, measured and
        described in plain Python by several steps, each of which would otherwise convert them."""
        lr, lo, rr, ro, size = (getattr(self, name).tolist() for name in COLUMNS)
        return lr, lo, rr, ro, size

    def repeats(self) -> np.ndarray:
        """``repeat``, or its one-write-per-entry form (counts of 1, strides of 0)."""
        if self.repeat is not None:
            return self.repeat
        rep = np.zeros((3, len(self)), dtype=np.int64)
        rep[0] = 1
        return rep

    def expanded(self) -> Writes:
        """One write per entry (``self`` when it already is), each entry's writes in stride order."""
        rep = self.repeat
        if rep is None:
            return self
        count = rep[0]
        row = np.repeat(np.arange(len(count)), count)
        step = np.arange(len(row), dtype=np.int64) - (np.cumsum(count) - count)[row]
        return Writes(
            self.local_region[row],
            self.local_offset[row] + step * rep[1, row],
            self.remote_region[row],
            self.remote_offset[row] + step * rep[2, row],
            self.size[row],
        )

    def last(self) -> Writes:
        """Each entry's last write (offsets are linear in the write's number, so it and the entry's
        first bound every write of the entry)."""
        if self.repeat is None:
            return self
        steps = self.repeat[0] - 1
        return Writes(
            self.local_region,
            self.local_offset + steps * self.repeat[1],
            self.remote_region,
            self.remote_offset + steps * self.repeat[2],
            self.size,
        )


SMALL = 32
"""Batches up to this many writes are checked in plain Python: a dozen numpy calls on two-element
arrays cost more than the loop (most components of a request are one to a few writes)."""


def check_bounds(writes: Writes, local_sizes: np.ndarray, remote_sizes: np.ndarray) -> None:
    """Raise ``PlanError`` unless every write lies inside its local and remote region (of a strided
    entry: its first and its last write, which bound the others)."""
    if writes.repeat is not None:
        if len(writes) and int(writes.repeat[0].min()) < 1:
            raise PlanError("write counts must be at least 1")
        w = writes
        first = Writes(w.local_region, w.local_offset, w.remote_region, w.remote_offset, w.size)
        check_bounds(first, local_sizes, remote_sizes)
        check_bounds(writes.last(), local_sizes, remote_sizes)
        return
    n = len(writes)
    if n == 0:
        return
    if n <= SMALL:
        _check_rows(writes, local_sizes, remote_sizes)
        return
    if FIRST_BAD is not None:
        try:
            bad = FIRST_BAD(writes.local_region, writes.local_offset, writes.remote_region,
                            writes.remote_offset, writes.size, local_sizes, remote_sizes)
        except TypeError:  # arrays of other dtypes than the compiled signature's
            bad = 0
        if bad < 0:
            return
    if writes.size.min() <= 0 or writes.local_offset.min() < 0 or writes.remote_offset.min() < 0:
        raise PlanError("write sizes must be positive and offsets non-negative")
    for side, ids, offs, sizes in (
        ("local", writes.local_region, writes.local_offset, local_sizes),
        ("remote", writes.remote_region, writes.remote_offset, remote_sizes),
    ):
        # min/max and ``take`` instead of masks and fancy indexing: a 16K-write batch is checked in
        # tens of µs, and only a failing batch pays for finding its first bad row.
        if ids.min() < 0 or ids.max() >= len(sizes):
            i = int(np.argmax((ids < 0) | (ids >= len(sizes))))
            raise PlanError(_region_error(i, side, int(ids[i]), len(sizes)))
        end = offs + writes.size
        limit = sizes[0] if len(sizes) == 1 else np.take(sizes, ids)
        if np.any(end > limit):
            i = int(np.argmax(end > limit))
            raise PlanError(
                _overflow_error(i, side, int(ids[i]), int(offs[i]), int(writes.size[i]), int(sizes[ids[i]]))
            )


def _check_rows(writes: Writes, local_sizes: Any, remote_sizes: Any) -> None:
    """A few writes, one by one; the size tables are indexed as they are (a few lookups cost less
    than converting a table of every region)."""
    for i, (lr, lo, rr, ro, size) in enumerate(zip(*writes.lists, strict=True)):
        why = write_error(i, lr, lo, rr, ro, size, local_sizes, remote_sizes)
        if why is not None:
            raise PlanError(why)


def write_error(
    i: int, lr: int, lo: int, rr: int, ro: int, size: int, local_sizes: Any, remote_sizes: Any
) -> str | None:
    """Why write ``i`` lies outside its regions (``check_bounds``' words), or None when it does not."""
    if size <= 0 or lo < 0 or ro < 0:
        return (
            f"write {i}: size {size}, offsets {lo} and {ro}: "
            "write sizes must be positive and offsets non-negative"
        )
    for side, region, off, sizes in (("local", lr, lo, local_sizes), ("remote", rr, ro, remote_sizes)):
        if not 0 <= region < len(sizes):
            return _region_error(i, side, region, len(sizes))
        if off + size > sizes[region]:
            return _overflow_error(i, side, region, off, size, sizes[region])
    return None


def _region_error(i: int, side: str, region: int, count: int) -> str:
    return f"write {i}: {side} region {region} not in 0..{count - 1}"


def _overflow_error(i: int, side: str, region: int, off: int, size: int, limit: int) -> str:
    return f"write {i}: {side} region {region} [{off}, +{size}) overflows its {limit} bytes"


class TransferState(enum.Enum):
    IN_PROGRESS = "in_progress"
    DONE = "done"
    FAILED = "failed"


@mypyc_attr(allow_interpreted_subclasses=True)
@dataclass(eq=False)
class Peer:
    """A connected remote engine; adapters subclass it to keep their engine handles."""

    peer_id: str
    remote_sizes: np.ndarray
    """int64 size of each remote region, in the order the peer registered them."""
    connected: bool = True


@mypyc_attr(allow_interpreted_subclasses=True)
@dataclass(eq=False)
class Transfer:
    """One started batch of writes. ``error`` is set (a ``TransferFailed``) once ``state`` is FAILED."""

    peer: Peer
    count: int
    nbytes: int
    state: TransferState = TransferState.IN_PROGRESS
    error: TransferFailed | None = None
    started: float = field(default_factory=time.monotonic)
    holders: int = 1
    """How many users share this transfer (rooms one engine request carries together): ``release``
    aborts it only when the last lets go."""
    wakes: bool = False
    """While true, the adapter calls the transport's ``waker`` (or makes ``wake_fd`` readable) once
    this transfer's state may have changed: the caller need not poll it until then (its copy is
    queued on an engine thread)."""

    def fail(self, error: TransferFailed) -> TransferState:
        self.state, self.error = TransferState.FAILED, error
        return self.state


@mypyc_attr(allow_interpreted_subclasses=True)
class Transport(ABC):
    """One engine behind one small interface. Not thread-safe: one agent thread drives it."""

    waker: Callable[[], None] | None = None
    """Set by the driving thread: how an adapter's own thread tells it "poll again" (any thread may
    call it). Adapters that never set ``Transfer.wakes`` ignore it."""

    @property
    def wake_fd(self) -> int | None:
        """A descriptor that turns readable when a transfer with ``wakes`` set may have changed state;
        the driving thread waits on it beside its sockets and calls ``collect`` each turn."""
        return None

    def describe(self) -> dict[str, Any]:
        """What the agent's ``/status`` shows of the engine (adapters add their own counters)."""
        return {"engine": self.name}

    def collect(self) -> None:  # noqa: B027 - optional: adapters without an own signalling thread
        """Take in what the engine's own thread signalled (clears ``wake_fd``): a ``wakes`` transfer
        it reported becomes worth a ``poll``."""

    name: ClassVar[str]
    one_request_rows: ClassVar[int] = 128
    """A room of at most this many writes goes as one ``write`` (``agent.requests``), larger ones as
    one per component: what suits an engine whose lists are prepared per block size (NIXL)."""
    takes_strided: ClassVar[bool] = False
    """The engine takes strided entries (``Writes.repeat``) as they are; ``write`` expands them for
    the others."""
    bounds_checked_by_engine: ClassVar[bool] = False
    """The engine itself skips every write outside its regions and fails the transfer, naming the
    first (cuda-ipc's copy kernel): ``write`` then leaves out the host's pass over the batch."""
    _local_sizes: np.ndarray = np.zeros(0, dtype=np.int64)
    _peers: list[Any]
    """Connected peers: each adapter's ``connect`` appends, ``disconnect`` removes."""

    @abstractmethod
    def endpoint(self) -> bytes:
        """Opaque blob the peer passes to ``connect`` to reach this engine."""

    def register(self, regions: Sequence[MemoryRegion]) -> list[bytes]:
        """Register local memory once; returns one opaque descriptor blob per region, in order.

        Region ids in writes index this sequence."""
        if len(self._local_sizes):
            raise BadInput(f"{self.name}: memory is already registered (register once per transport)")
        if not regions:
            raise BadInput(f"{self.name}: register needs at least one region")
        blobs = self._register(list(regions))
        self._local_sizes = np.array([r.size for r in regions], dtype=np.int64)
        return blobs

    @abstractmethod
    def _register(self, regions: list[MemoryRegion]) -> list[bytes]: ...

    @abstractmethod
    def connect(self, peer_id: str, endpoint: bytes, remote_regions: Sequence[bytes]) -> Peer:
        """Make the peer's engine and its regions (blobs from its ``register``) reachable."""

    def disconnect(self, peer: Peer) -> None:
        """Forget the peer; idempotent. Its in-flight transfers may fail."""
        if not peer.connected:
            return
        peer.connected = False
        self._peers.remove(peer)
        self._release(peer)

    @abstractmethod
    def _release(self, peer: Any) -> None:
        """Free what the engine holds for a peer that ``disconnect`` has just forgotten."""

    def write(self, peer: Peer, writes: WriteSpec | Writes, *, overlap: bool = False) -> Transfer:
        """Start one-sided writes local → remote without blocking; bounds-checked first (``PlanError``),
        or by the engine (``bounds_checked_by_engine``: the transfer fails). ``overlap``: the caller
        has other work to do meanwhile, so an engine that copies inside its post (NIXL host memory)
        should post from its own thread rather than make the caller wait for the copy."""
        batch = writes if isinstance(writes, Writes) else Writes.of(writes)
        if batch.repeat is not None and not self.takes_strided:
            batch = batch.expanded()
        if not peer.connected:
            raise BadInput(f"{self.name}: peer {peer.peer_id!r} is disconnected")
        if not self.bounds_checked_by_engine:
            check_bounds(batch, self._local_sizes, peer.remote_sizes)
        if len(batch) == 0:
            return Transfer(peer, 0, 0, TransferState.DONE)
        return self._start(peer, batch, overlap)

    @abstractmethod
    def _start(self, peer: Peer, writes: Writes, overlap: bool) -> Transfer: ...

    @abstractmethod
    def poll(self, transfer: Transfer) -> TransferState:
        """Current state, without blocking; on FAILED, ``transfer.error`` says why."""

    @abstractmethod
    def abort(self, transfer: Transfer) -> None:
        """Release the transfer's engine resources, cancelling it if still running; idempotent."""

    def release(self, transfer: Transfer) -> None:
        """One holder is done with ``transfer``; the last one aborts it (a no-op once it is done)."""
        transfer.holders -= 1
        if transfer.holders <= 0:
            self.abort(transfer)

    def wait(self, transfer: Transfer, deadline: float) -> None:
        """Block until done (``time.monotonic`` deadline). Raises ``DeadlineExceeded`` (after aborting
        the transfer), ``PeerGone`` or ``TransferFailed``."""
        pause = 20e-6
        while True:
            state = self.poll(transfer)
            if state is TransferState.DONE:
                return
            if state is TransferState.FAILED:
                assert transfer.error is not None
                raise transfer.error
            now = time.monotonic()
            if now >= deadline:
                self.abort(transfer)
                error = DeadlineExceeded(
                    f"{self.name}: {transfer.count} writes ({transfer.nbytes} B) to "
                    f"{transfer.peer.peer_id!r} not done after {now - transfer.started:.3f}s"
                )
                transfer.fail(error)
                raise error
            time.sleep(min(pause, deadline - now))
            pause = min(pause * 2, 1e-3)

    @abstractmethod
    def close(self) -> None:
        """Release every engine resource; idempotent."""

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
