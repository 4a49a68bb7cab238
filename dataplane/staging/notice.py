"""The staged path's two wire messages: ``StagedNotice`` (sender → receiver) and ``StagedAck`` back.

Protocol, per staged piece (one staging slot's worth of rows):

1. The receiver owns ``count`` landing slots of ``slot_bytes`` in one registered buffer and
   advertises it (region id, count, slot size) when it registers; slot ``i`` of the sender's
   staging buffer always writes to landing slot ``i``, so one credit pool on the sender covers both.
2. The sender gathers the piece's rows into its slot (one kernel), writes the slot's used bytes to
   the receiver's landing slot (one engine write), and when the write is complete sends a
   ``StagedNotice``: the room, the piece's sequence number and total, the slot, the row size and the
   piece's *receiver-side* runs (region, first row, row count) — not arena rows, so the receiver adds
   its own region bases and checks every run against its own regions (the runs are peer input).
   The notice follows the completed write on an ordered channel (the agent's control channel; a
   pipe in the benchmark). NIXL's ``notif_msg`` on the write itself (delivered after the data, read
   with ``get_new_notifs``) would save that hop; ``NixlTransport`` does not expose it yet.
3. The receiver scatters the landing slot into its pools on its staging stream and, once that
   kernel has finished, answers ``StagedAck(room, seq, slot)``; the sender releases the slot credit.

Encoded with msgspec (tagged structs); index arrays travel as little-endian bytes, validated here.
"""

from __future__ import annotations

import msgspec
import numpy as np

from ..errors import WireFormatError
from .rows import Runs

__all__ = ["StagedAck", "StagedNotice", "decode_staged", "encode_staged"]


class StagedNotice(msgspec.Struct, frozen=True, tag="staged"):
    room: int
    seq: int
    pieces: int
    slot: int
    chunk: int
    nbytes: int
    region: bytes
    """int32 little-endian, one per run."""
    start: bytes
    """int64 little-endian, one per run."""
    count: bytes
    """int64 little-endian, one per run."""

    @classmethod
    def of(cls, room: int, seq: int, pieces: int, slot: int, chunk: int, runs: Runs) -> StagedNotice:
        return cls(
            room,
            seq,
            pieces,
            slot,
            chunk,
            runs.rows * chunk,
            runs.region.astype("<i4").tobytes(),
            runs.start.astype("<i8").tobytes(),
            runs.count.astype("<i8").tobytes(),
        )

    def runs(self) -> Runs:
        """The runs, checked for consistent lengths and totals (raises ``WireFormatError``)."""
        if len(self.region) % 4 or len(self.start) % 8 or len(self.count) % 8:
            raise WireFormatError("staged notice: run arrays are not whole int32/int64 items")
        region = np.frombuffer(self.region, dtype="<i4").astype(np.int32)
        start = np.frombuffer(self.start, dtype="<i8").astype(np.int64)
        count = np.frombuffer(self.count, dtype="<i8").astype(np.int64)
        if not len(region) == len(start) == len(count):
            raise WireFormatError("staged notice: run arrays differ in length")
        if self.chunk <= 0 or int(count.sum()) * self.chunk != self.nbytes:
            raise WireFormatError(
                f"staged notice: runs cover {int(count.sum())} rows of {self.chunk} B, "
                f"not the {self.nbytes} bytes announced"
            )
        if not 0 <= self.seq < self.pieces:
            raise WireFormatError(f"staged notice: piece {self.seq} of {self.pieces}")
        return Runs(region, start, count)


class StagedAck(msgspec.Struct, frozen=True, tag="staged_ack"):
    room: int
    seq: int
    slot: int


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(StagedNotice | StagedAck)


def encode_staged(msg: StagedNotice | StagedAck) -> bytes:
    return _encoder.encode(msg)


def decode_staged(data: bytes) -> StagedNotice | StagedAck:
    try:
        return _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise WireFormatError(f"staged message: {exc}") from exc
