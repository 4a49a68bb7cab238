"""The staged path bound to a ``Transport`` and to the agent's control channel.

``dataplane.staging`` knows no transport; this module is the glue. ``StagedWriter`` (prefill, one per
decode peer) and ``StagedLanding`` (decode, one per prefill rank it pulls from) move one peer's
pieces; ``StagingMemory`` is the staging memory a role registers right after its pools' regions
(prefill: one staging buffer; decode: one landing buffer per prefill rank it pulls from, so two
prefill ranks never write one slot), and ``PrefillStaging`` / ``DecodeStaging`` are what the role
workers hold: thin hooks in ``prefill.py`` / ``decode.py`` call them.

The protocol over the existing ZMQ control channel (``codec.control``):

1. Decode sends ``StagedOffer`` (its landing region's descriptor blob, slot count and size) to each
   prefill rank just before its registration, on the same socket, so prefill has it when the
   registration arrives. Prefill connects with the blob appended to the registration's regions and,
   if the slots fit its own, routes that peer's rooms through ``choose_paths``. A decode that sends
   no offer (plain sglang) or whose slots do not fit gets direct writes only.
2. Per room, prefill writes the direct part per component as before, and the staged part piece by
   piece: gather into a slot of its staging buffer → one write into the same slot of decode's
   landing buffer → ``Staged`` notice → decode scatters, then acknowledges → the slot is free again.
3. Prefill sends Success only when the direct writes are done and every staged piece was
   acknowledged, so decode's room reaches Success only after its last scatter.

Failures: a failed gather, post or write fails its room on prefill (decode hears Failed); a notice
decode refuses (memory outside its regions or slots) fails the room on decode (prefill hears Abort)
and is still acknowledged, so the slot comes back; a notice for a room decode no longer has is
acknowledged without a scatter; a dead peer (heartbeats) releases every slot its writer held.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import WireFormatError
from ..planner import WritePlan
from ..staging import (
    DEFAULT_THRESHOLD,
    SlotPool,
    StagedAck,
    StagedNotice,
    StagedReceiver,
    StagedSender,
    choose_paths,
    decode_staged,
    encode_staged,
    pieces_of,
)
from ..transports import Peer, Transfer, TransferState, Transport, Writes

__all__ = ["StagedLanding", "StagedWriter"]

log = logging.getLogger(__name__)
ROW_ALIGN = 1 << 20
"""Largest staging row; region bases in an arena are 2 MiB-aligned, so it divides every base."""


def _align(slot_bytes: int) -> int:
    """The largest power of two dividing ``slot_bytes``, capped at ``ROW_ALIGN``: every slot offset is
    a multiple of it, so rows up to it fit slots exactly."""
    return min(slot_bytes & -slot_bytes, ROW_ALIGN)


def _padded(nbytes: int, align: int) -> int:
    """The byte count actually written for a piece: rounded up to a power of two (small pieces) or a
    multiple of ``align``, so the engine sees few distinct block sizes and caches its prepared lists
    (a piece's exact size varies per request). The padding is landing-slot bytes nobody reads."""
    pad = min(align, 1 << max(0, nbytes - 1).bit_length())
    return -(-nbytes // pad) * pad


class StagedWriter:
    """Prefill's side for one decode peer. ``staging_region`` / ``landing_region`` are the region ids
    of this side's staging buffer and of the peer's landing buffer; ``bases`` / ``sizes`` locate this
    side's regions in the arena the stager views. Several writers may share ``stager`` and ``pool``
    (one staging buffer for every peer: slot ``i`` always lands in the peer's slot ``i``)."""

    def __init__(
        self,
        transport: Transport,
        peer: Peer,
        stager: Any,
        pool: SlotPool,
        *,
        staging_region: int,
        landing_region: int,
        bases: np.ndarray,
        sizes: np.ndarray,
        send: Callable[[bytes], None],
        threshold: float = DEFAULT_THRESHOLD,
        min_writes: int = 1,
    ):
        self.transport, self.peer, self.threshold, self.min_writes = transport, peer, threshold, min_writes
        self.bases, self.sizes = bases, sizes
        self.align = _align(pool.slot_bytes)
        self._ids = (np.array([staging_region], np.int32), np.array([landing_region], np.int32))
        self._pending: dict[int, int] = {}
        self.sender = StagedSender(stager, pool, self._post, self._done, lambda n: send(encode_staged(n)))

    def route(self, room: int, plan: WritePlan, *, force: Any = None) -> WritePlan:
        """Queue the staged part of ``plan`` for ``room``; returns the part to write directly."""
        return self.route_choice(room, plan, force=force)[0]

    def route_choice(self, room: int, plan: WritePlan, *, force: Any = None) -> tuple[WritePlan, WritePlan]:
        """Like ``route``, and also returns the staged part (for accounting)."""
        choice = choose_paths(plan, self.threshold, force=force, min_writes=self.min_writes)
        if len(choice.staged):
            pieces = pieces_of(
                room, choice.staged, self.bases, self.sizes, self.sender.pool.slot_bytes, align=self.align
            )
            self._pending[room] = self._pending.get(room, 0) + len(pieces)
            self.sender.submit(pieces)
        return choice.direct, choice.staged

    def step(self) -> list[tuple[int, Exception]]:
        """Advance every piece; returns the rooms whose staged part failed (room, error)."""
        self.sender.step()
        failed = self.sender.take_failed()
        for room, _ in failed:
            self._pending.pop(room, None)
        return failed

    def on_message(self, data: bytes) -> int | None:
        """Handle an ack from the peer; returns its room (None: the room was dropped meanwhile)."""
        msg = decode_staged(data)
        if not isinstance(msg, StagedAck):
            raise WireFormatError("prefill expects staged acks, got a notice")
        piece = self.sender.on_ack(msg)
        if piece is None:
            return None
        if piece.room in self._pending:
            self._pending[piece.room] -= 1
        return piece.room

    def done(self, room: int) -> bool:
        """Every staged piece of ``room`` has been scattered by the peer (vacuously, if none)."""
        if self._pending.get(room, 0):
            return False
        self._pending.pop(room, None)
        return True

    def drop(self, room: int) -> None:
        self._pending.pop(room, None)
        self.sender.drop(room)

    def close(self) -> None:
        self._pending.clear()
        self.sender.close()

    def _post(self, slot: int, nbytes: int, notice: StagedNotice) -> Transfer:
        off = np.array([self.sender.pool.offset(slot)], np.int64)
        size = np.array([_padded(nbytes, self.align)], np.int64)
        return self.transport.write(self.peer, Writes(self._ids[0], off, self._ids[1], off, size))

    def _done(self, transfer: Transfer) -> bool:
        state = self.transport.poll(transfer)
        if state is TransferState.FAILED:
            assert transfer.error is not None
            raise transfer.error
        return state is TransferState.DONE


class StagedLanding:
    """Decode's side for one prefill rank: scatters its pieces from the landing slots into the arena."""

    def __init__(
        self,
        stager: Any,
        pool: SlotPool,
        *,
        bases: np.ndarray,
        sizes: np.ndarray,
        send: Callable[[bytes], None],
        track: bool = True,
    ):
        self.receiver = StagedReceiver(
            stager, pool, bases, sizes, lambda a: send(encode_staged(a)), track=track
        )

    def on_message(self, data: bytes) -> None:
        msg = decode_staged(data)
        if not isinstance(msg, StagedNotice):
            raise WireFormatError("decode expects staged notices, got an ack")
        self.receiver.on_notice(msg)

    def step(self) -> None:
        self.receiver.step()

    def completed(self) -> list[int]:
        return self.receiver.completed()
