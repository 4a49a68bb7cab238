"""The staged path's state machines: ``StagedSender`` (prefill) and ``StagedReceiver`` (decode).

Both are driven by the role's one loop thread and never block: ``step()`` advances what the device
and the engine have finished, and the engine and the notice channel are reached through callables,
so this module knows no transport (the agent binds them to its ``Transport``; the benchmark too).

Sender, per piece: wait for a slot credit (``SlotPool``; back-pressure) → gather kernel → when its
event completes, ``post(slot, nbytes, notice)`` one engine write → when ``done(handle)``,
``notify(notice)`` unless the engine delivered it with the write → on ``StagedAck``, release the
credit. Receiver, per notice: validate, expand runs to its own arena rows, scatter kernel from the
landing slot → when its event completes, ``ack(StagedAck)``; a room is complete once all its pieces
have been scattered (``completed()``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import PlanError, WireFormatError
from ..planner import WritePlan
from .notice import StagedAck, StagedNotice
from .pool import SlotPool
from .rows import Runs, expand, pick_chunk, region_rows, runs_of, split

__all__ = ["Piece", "StagedReceiver", "StagedSender", "pieces_of"]


@dataclass(eq=False)
class Piece:
    room: int
    seq: int
    pieces: int
    src_rows: np.ndarray
    dst: Runs
    chunk: int
    slot: int = -1
    event: Any = None
    handle: Any = None
    notice: StagedNotice | None = None
    marks: dict[str, float] = field(default_factory=dict)
    """``time.perf_counter`` when each stage was seen done (gathered, posted, written, acked)."""


MAX_RUNS = 32 << 10
"""Most runs one piece's notice may carry (20 bytes each: the notice stays well under the 1 MiB a
control message may be), so a slot full of scattered 4 KiB pages is cut into several pieces."""


def pieces_of(
    room: int,
    plan: WritePlan,
    bases: Any,
    sizes: Any,
    slot_bytes: int,
    *,
    align: int = 1 << 20,
    max_runs: int = MAX_RUNS,
) -> list[Piece]:
    """Cut one request's staged writes into slot-sized pieces, numbered across the room.

    Each component gets its own row size (``pick_chunk`` of its offsets, sizes and this side's
    region ``bases``, capped at ``align``, which must divide the receiver's region bases and the
    slot size) and so its own gather / scatter kernel: a 64-byte aux slot never forces 64-byte rows
    on 64 KiB KV pages. ``bases`` / ``sizes`` are each local region's byte offset in the arena and
    its size. A piece holds at most ``max_runs`` runs."""
    groups = []
    comps = np.unique(plan.component).tolist()
    for comp in comps:
        part = plan if len(comps) == 1 else plan.select(plan.component == comp)
        abs_off = np.asarray(bases, dtype=np.int64)[part.local_region] + part.local_offset
        chunk = pick_chunk(abs_off, part.remote_offset, part.size, limit=align)
        src = runs_of(part.local_region, part.local_offset, part.size, chunk)
        rows = expand(src, *region_rows(bases, sizes, chunk))
        per = max(1, slot_bytes // chunk)
        at = 0
        for whole in split(runs_of(part.remote_region, part.remote_offset, part.size, chunk), per):
            for d in _cap(whole, max_runs):
                groups.append((rows[at : at + d.rows], d, chunk))
                at += d.rows
    return [Piece(room, i, len(groups), r, d, c) for i, (r, d, c) in enumerate(groups)]


def _cap(runs: Runs, max_runs: int) -> list[Runs]:
    if len(runs) <= max_runs:
        return [runs]
    return [
        Runs(runs.region[i : i + max_runs], runs.start[i : i + max_runs], runs.count[i : i + max_runs])
        for i in range(0, len(runs), max_runs)
    ]


@dataclass(eq=False)
class StagedSender:
    """Moves queued pieces through ``pool``'s slots. ``post(slot, nbytes, notice) -> handle`` starts
    the write (the notice may ride it), ``done(handle) -> bool`` polls it (raising on failure),
    ``notify(notice)`` sends the notice when the engine did not carry it (``None`` if it did).

    A piece whose post or write fails gives its slot back and its room lands in ``failed`` (room,
    error) for the caller to fail; ``drop(room)`` stops a room's pieces without failing anything.
    Several senders (one per peer) may share one ``pool`` and one stager."""

    stager: Any
    pool: SlotPool
    post: Callable[[int, int, StagedNotice], Any]
    done: Callable[[Any], bool]
    notify: Callable[[StagedNotice], None] | None = None
    queue: deque[Piece] = field(default_factory=deque)
    gathering: list[Piece] = field(default_factory=list)
    writing: list[Piece] = field(default_factory=list)
    landed: dict[tuple[int, int], Piece] = field(default_factory=dict)
    finished: deque[Piece] = field(default_factory=lambda: deque(maxlen=1024))
    """The latest acknowledged pieces, with their stage times (for metrics and benchmarks)."""
    failed: list[tuple[int, Exception]] = field(default_factory=list)
    dropped: set[int] = field(default_factory=set)
    """Rooms stopped by ``drop`` that still have a piece gathering or writing (bounded by those)."""

    def submit(self, pieces: list[Piece]) -> None:
        self.queue.extend(pieces)

    @property
    def idle(self) -> bool:
        return not (self.queue or self.gathering or self.writing or self.landed)

    @property
    def active(self) -> int:
        """Pieces that need polling (queued, gathering, writing); landed ones wait for a message."""
        return len(self.queue) + len(self.gathering) + len(self.writing)

    def step(self) -> None:
        while self.queue and (slot := self.pool.try_acquire()) is not None:
            piece = self.queue.popleft()
            piece.slot = slot
            piece.marks["start"] = time.perf_counter()
            piece.notice = StagedNotice.of(piece.room, piece.seq, piece.pieces, slot, piece.chunk, piece.dst)
            try:
                piece.event = self.stager.gather(piece.src_rows, self.pool.offset(slot), piece.chunk)
            except Exception as exc:
                self._fail(piece, exc)
                continue
            self.gathering.append(piece)
        for piece in [p for p in self.gathering if p.event.query()]:
            self.gathering.remove(piece)
            if piece.room in self.dropped:
                self.pool.release(piece.slot)
                continue
            assert piece.notice is not None
            piece.marks["gathered"] = time.perf_counter()
            try:
                piece.handle = self.post(piece.slot, piece.notice.nbytes, piece.notice)
            except Exception as exc:
                self._fail(piece, exc)
                continue
            piece.marks["posted"] = time.perf_counter()
            self.writing.append(piece)
        for piece in list(self.writing):
            try:
                if not self.done(piece.handle):
                    continue
            except Exception as exc:
                self.writing.remove(piece)
                self._fail(piece, exc)
                continue
            self.writing.remove(piece)
            if piece.room in self.dropped:
                self.pool.release(piece.slot)  # written, never noticed: nothing reads that landing slot
                continue
            assert piece.notice is not None
            piece.marks["written"] = time.perf_counter()
            if self.notify is not None:
                self.notify(piece.notice)
            self.landed[piece.room, piece.seq] = piece
        if self.dropped:
            busy = {p.room for p in self.gathering} | {p.room for p in self.writing}
            self.dropped &= busy

    def _fail(self, piece: Piece, exc: Exception) -> None:
        self.pool.release(piece.slot)
        if piece.room not in self.dropped:
            self.failed.append((piece.room, exc))
            self.drop(piece.room)

    def take_failed(self) -> list[tuple[int, Exception]]:
        """Rooms whose staged pieces failed since the last call (each room once)."""
        out, self.failed = self.failed, []
        return out

    def on_ack(self, ack: StagedAck) -> Piece | None:
        """Release the acknowledged piece's slot; None for a piece this sender no longer tracks (its
        room or peer was dropped meanwhile). An ack naming another slot than the piece's is refused."""
        piece = self.landed.get((ack.room, ack.seq))
        if piece is None:
            return None
        if piece.slot != ack.slot:
            raise WireFormatError(
                f"staged ack for piece {ack.seq} of room {ack.room} names slot {ack.slot}, not {piece.slot}"
            )
        del self.landed[ack.room, ack.seq]
        self.pool.release(piece.slot)
        piece.marks["acked"] = time.perf_counter()
        self.finished.append(piece)
        return piece

    def drop(self, room: int) -> None:
        """Stop a failed room: forget its queued pieces; a gathering or writing one gives its slot back
        when its kernel / write is over (a write may still land in that slot until then). Noticed
        pieces keep their slots until acknowledged, since the receiver may be scattering from them."""
        self.queue = deque(p for p in self.queue if p.room != room)
        if any(p.room == room for p in self.gathering) or any(p.room == room for p in self.writing):
            self.dropped.add(room)

    def close(self) -> None:
        """The peer is gone: give back every slot this sender holds (its writes were aborted with the
        peer, and no landing slot of it will be written again)."""
        for piece in [*self.gathering, *self.writing, *self.landed.values()]:
            self.pool.release(piece.slot)
        self.queue.clear()
        self.gathering.clear()
        self.writing.clear()
        self.landed.clear()
        self.dropped.clear()


@dataclass(eq=False)
class StagedReceiver:
    """Scatters landed pieces into the arena; ``bases`` / ``sizes`` are each local region's byte offset
    in the arena and its size, in region-id order (the ids the sender's runs name)."""

    stager: Any
    pool: SlotPool
    bases: np.ndarray
    sizes: np.ndarray
    ack: Callable[[StagedAck], None]
    scattering: list[tuple[StagedNotice, Any]] = field(default_factory=list)
    received: dict[int, int] = field(default_factory=dict)
    done_rooms: list[int] = field(default_factory=list)
    track: bool = True
    """Count pieces per room for ``completed()``; the agent turns it off (prefill's Success, sent after
    the last ack, already says the room is complete), so nothing grows with failed rooms."""

    def on_notice(self, notice: StagedNotice) -> None:
        """Validate the notice against the landing slots and this side's regions, then scatter
        (raises ``WireFormatError`` for a notice that names memory outside them)."""
        runs = notice.runs()
        if not 0 <= notice.slot < self.pool.count or notice.nbytes > self.pool.slot_bytes:
            raise WireFormatError(
                f"staged notice: slot {notice.slot} / {notice.nbytes} B outside the landing slots"
            )
        try:
            rows = expand(runs, *region_rows(self.bases, self.sizes, notice.chunk))
        except PlanError as exc:
            raise WireFormatError(f"staged notice for room {notice.room}: {exc}") from exc
        event = self.stager.scatter(rows, self.pool.offset(notice.slot), notice.chunk)
        self.scattering.append((notice, event))

    def discard(self, notice: StagedNotice) -> None:
        """Acknowledge a piece without scattering it (its room is gone or its notice was refused), so
        the sender gets its slot back."""
        self.ack(StagedAck(notice.room, notice.seq, notice.slot))

    def step(self) -> None:
        for notice, event in [s for s in self.scattering if s[1].query()]:
            self.scattering.remove((notice, event))
            self.ack(StagedAck(notice.room, notice.seq, notice.slot))
            if not self.track:
                continue
            got = self.received[notice.room] = self.received.get(notice.room, 0) + 1
            if got == notice.pieces:
                del self.received[notice.room]
                self.done_rooms.append(notice.room)

    def busy(self, room: int) -> bool:
        """A scatter of ``room`` is still running."""
        return any(n.room == room for n, _ in self.scattering)

    def completed(self) -> list[int]:
        """Rooms whose every piece has been scattered since the last call."""
        out, self.done_rooms = self.done_rooms, []
        return out
