"""The staged path bound to a ``Transport``: ``StagedWriter`` (prefill) and ``StagedLanding`` (decode).

``dataplane.staging`` knows no transport; this module is the glue a role worker holds per peer. Each
side registers one staging buffer as an extra region after its pools' canonical regions (decode's is
the landing buffer, cut into the same ``count`` x ``slot_bytes`` slots), and the two exchange the
staged messages (``StagedNotice`` / ``StagedAck``, bytes from ``staging.encode_staged``) over an
ordered channel given as ``send``: a pipe in ``bench/gpu_transfer.py``, a list in the tests; the
prefill / decode workers do not call this module yet (hook points: prefill's ``start_room`` after
``plan_request`` and its ``poll_transfers``; decode's registration, ``on_control`` and room checks).

Prefill, per request: ``route(room, plan)`` splits the plan by ``choose_paths``; the caller writes the
returned direct part as before, and the staged part goes gather → one write per slot → notice.
``step()`` advances it; ``on_message(ack)`` releases slots; ``done(room)`` says every staged piece of the
room has been scattered by decode, so "Success" can follow. Decode: ``on_message(notice)`` scatters;
``step()`` acknowledges finished scatters; ``completed()`` lists rooms whose staged bytes all landed.
"""

from __future__ import annotations

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


class StagedWriter:
    """Prefill's side for one decode peer. ``staging_region`` / ``landing_region`` are the region ids
    of this side's staging buffer and of the peer's landing buffer; ``bases`` / ``sizes`` locate this
    side's regions in the arena the stager views."""

    def __init__(
        self, transport: Transport, peer: Peer, stager: Any, pool: SlotPool, *, staging_region: int,
        landing_region: int, bases: np.ndarray, sizes: np.ndarray, send: Callable[[bytes], None],
        threshold: float = DEFAULT_THRESHOLD,
    ):
        self.transport, self.peer, self.threshold = transport, peer, threshold
        self.bases, self.sizes = bases, sizes
        self._ids = (np.array([staging_region], np.int32), np.array([landing_region], np.int32))
        self._pending: dict[int, int] = {}
        self.sender = StagedSender(stager, pool, self._post, self._done, lambda n: send(encode_staged(n)))

    def route(self, room: int, plan: WritePlan, *, force: Any = None) -> WritePlan:
        """Queue the staged part of ``plan`` for ``room``; returns the part to write directly."""
        choice = choose_paths(plan, self.threshold, force=force)
        if len(choice.staged):
            pieces = pieces_of(room, choice.staged, self.bases, self.sizes, self.sender.pool.slot_bytes)
            self._pending[room] = self._pending.get(room, 0) + len(pieces)
            self.sender.submit(pieces)
        return choice.direct

    def step(self) -> None:
        self.sender.step()

    def on_message(self, data: bytes) -> int:
        """Handle an ack from the peer; returns its room."""
        msg = decode_staged(data)
        if not isinstance(msg, StagedAck):
            raise WireFormatError("prefill expects staged acks, got a notice")
        piece = self.sender.on_ack(msg)
        self._pending[piece.room] -= 1
        return piece.room

    def done(self, room: int) -> bool:
        """Every staged piece of ``room`` has been scattered by the peer (vacuously, if none)."""
        if self._pending.get(room, 0):
            return False
        self._pending.pop(room, None)
        return True

    def drop(self, room: int) -> None:
        self.sender.drop(room)

    def _post(self, slot: int, nbytes: int, notice: StagedNotice) -> Transfer:
        off = np.array([self.sender.pool.offset(slot)], np.int64)
        writes = Writes(self._ids[0], off, self._ids[1], off, np.array([nbytes], np.int64))
        return self.transport.write(self.peer, writes)

    def _done(self, transfer: Transfer) -> bool:
        state = self.transport.poll(transfer)
        if state is TransferState.FAILED:
            assert transfer.error is not None
            raise transfer.error
        return state is TransferState.DONE


class StagedLanding:
    """Decode's side: scatters notices' pieces from its landing slots into its pools' arena."""

    def __init__(self, stager: Any, pool: SlotPool, *, bases: np.ndarray, sizes: np.ndarray,
                 send: Callable[[bytes], None]):
        self.receiver = StagedReceiver(stager, pool, bases, sizes, lambda a: send(encode_staged(a)))

    def on_message(self, data: bytes) -> None:
        msg = decode_staged(data)
        if not isinstance(msg, StagedNotice):
            raise WireFormatError("decode expects staged notices, got an ack")
        self.receiver.on_notice(msg)

    def step(self) -> None:
        self.receiver.step()

    def completed(self) -> list[int]:
        return self.receiver.completed()
