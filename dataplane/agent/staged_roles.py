"""What the role workers hold for the staged path (``agent/staged.py`` has the protocol): thin hooks in
``prefill.py`` / ``decode.py`` call ``PrefillStaging`` / ``DecodeStaging``, which keep one
``StagedWriter`` per decode peer / one ``StagedLanding`` per prefill rank.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from ..codec.control import Staged, StagedOffer, encode_control
from ..errors import BadInput, WireFormatError
from ..planner import WritePlan
from ..staging import (
    StagedAck,
    StagedNotice,
    decode_staged,
    encode_staged,
)
from ..transports import Peer, Transport
from .staged import StagedLanding, StagedWriter
from .staging_memory import StagingMemory

__all__ = ["DecodeStaging", "PrefillStaging"]

log = logging.getLogger(__name__)
MAX_OFFERS = 256
"""Offers kept for decodes that have not registered yet (oldest dropped first)."""


class PrefillStaging:
    """Prefill's staged path across its decode peers (keyed by their control address): the offers,
    one shared staging buffer, one writer per decode that offered fitting landing slots."""

    def __init__(
        self,
        memory: StagingMemory,
        transport: Transport,
        agent_id: str,
        send: Callable[[str, list[bytes]], Any],
    ):
        self.memory, self.transport, self.agent_id, self._send = memory, transport, agent_id, send
        self.stager, self.pool = memory.stager(0), memory.pool(0)
        self.offers: OrderedDict[str, StagedOffer] = OrderedDict()
        self.writers: dict[str, StagedWriter] = {}

    def on_offer(self, offer: StagedOffer) -> None:
        self.offers.pop(offer.agent_id, None)
        self.offers[offer.agent_id] = offer
        while len(self.offers) > MAX_OFFERS:
            self.offers.popitem(last=False)

    def landing_blobs(self, address: str) -> list[bytes]:
        """The region blob to append to ``address``'s registration regions: its landing buffer, if it
        offered one whose slots hold ours; else nothing (direct writes only)."""
        offer = self.offers.get(address)
        if offer is None:
            return []
        if offer.slots < self.pool.count or offer.slot_bytes < self.pool.slot_bytes:
            log.warning(
                "decode %s offers %d x %d B landing slots, fewer or smaller than our %d x %d B: direct only",
                address,
                offer.slots,
                offer.slot_bytes,
                self.pool.count,
                self.pool.slot_bytes,
            )
            return []
        return [offer.region]

    def attach(self, address: str, peer: Peer, landing_region: int) -> None:
        """``address`` connected with its landing buffer as region ``landing_region``."""
        self.detach(address)
        self.offers.pop(address, None)

        def send(payload: bytes) -> None:
            self._send(address, [encode_control(Staged(agent_id=self.agent_id, payload=payload))])

        self.writers[address] = StagedWriter(
            self.transport,
            peer,
            self.stager,
            self.pool,
            staging_region=self.memory.first_region,
            landing_region=landing_region,
            bases=self.memory.bases,
            sizes=self.memory.sizes,
            send=send,
            threshold=self.memory.cfg.threshold_bytes,
            min_writes=self.memory.cfg.min_writes,
        )

    def detach(self, address: str) -> None:
        """The peer is gone or re-registered: give back every slot its writer held."""
        writer = self.writers.pop(address, None)
        if writer is not None:
            writer.close()

    def route(self, address: str, room: int, plan: WritePlan) -> tuple[WritePlan, WritePlan]:
        """(direct part, staged part) of ``room``'s plan; the staged part is queued."""
        writer = self.writers.get(address)
        if writer is None:
            return plan, plan.select(np.zeros(len(plan), dtype=bool))
        return writer.route_choice(room, plan)

    def step(self) -> list[tuple[str, int, Exception]]:
        """Advance every writer; returns failed staged rooms (address, room, error)."""
        return [(a, room, exc) for a, w in list(self.writers.items()) for room, exc in w.step()]

    @property
    def active(self) -> int:
        return sum(w.sender.active for w in self.writers.values())

    def on_message(self, msg: Staged) -> int | None:
        """An ack from a decode; returns its room (None when it no longer matters)."""
        writer = self.writers.get(msg.agent_id)
        if writer is None:
            return None
        return writer.on_message(msg.payload)

    def done(self, address: str, room: int) -> bool:
        writer = self.writers.get(address)
        return writer is None or writer.done(room)

    def drop(self, address: str, room: int) -> None:
        writer = self.writers.get(address)
        if writer is not None:
            writer.drop(room)

    def snapshot(self) -> dict[str, Any]:
        """For ``/status`` (read from the HTTP thread: copies before iterating)."""
        writers = list(self.writers.values())
        return {
            "slots": self.pool.count,
            "slot_bytes": self.pool.slot_bytes,
            "slots_free": self.pool.available,
            "threshold_bytes": self.memory.cfg.threshold_bytes,
            "peers": sorted(w.peer.peer_id for w in writers),
            "pieces_waiting": sum(len(w.sender.queue) for w in writers),
        }


class DecodeStaging:
    """Decode's staged path: landing set ``j`` belongs to the ``j``-th prefill rank this rank pulls
    from (``bind``), and its acknowledgements go to that rank's control address."""

    def __init__(
        self,
        memory: StagingMemory,
        blobs: list[bytes],
        agent_id: str,
        send: Callable[[str, list[bytes]], Any],
    ):
        self.memory, self.agent_id, self._send = memory, agent_id, send
        self.blobs = blobs[memory.first_region : memory.first_region + len(memory.buffers)]
        self.addresses: list[str] = [""] * len(memory.buffers)
        self.landings = [
            StagedLanding(
                memory.stager(j),
                memory.pool(j),
                bases=memory.bases,
                sizes=memory.sizes,
                send=self._acker(j),
                track=False,
            )
            for j in range(len(memory.buffers))
        ]

    def _acker(self, j: int) -> Callable[[bytes], None]:
        def send(payload: bytes) -> None:
            if self.addresses[j]:
                self._send(
                    self.addresses[j], [encode_control(Staged(agent_id=self.agent_id, payload=payload))]
                )

        return send

    def offer(self, j: int, address: str) -> bytes | None:
        """Bind landing set ``j`` to the prefill at ``address``; the offer frame to send it first
        (None when this rank has no set ``j``: that prefill gets no offer and writes directly)."""
        if not 0 <= j < len(self.landings):
            return None
        self.addresses[j] = address
        offer = StagedOffer(
            agent_id=self.agent_id,
            region=self.blobs[j],
            slots=self.memory.slots,
            slot_bytes=self.memory.slot_bytes,
        )
        return encode_control(offer)

    def on_message(
        self, j: int, msg: Staged, live: Callable[[int], bool], address: str
    ) -> tuple[int, str] | None:
        """A notice from the prefill at ``address``, bound to set ``j``. Scatters it if its room is
        live here; a room that is gone gets an ack without a scatter; a refused notice is
        acknowledged too (so the sender's slot comes back) and returns (room, reason) to fail."""
        notice = decode_staged(msg.payload)
        if not isinstance(notice, StagedNotice):
            raise WireFormatError("decode expects staged notices, got an ack")
        if not 0 <= j < len(self.landings):
            ack = encode_staged(StagedAck(notice.room, notice.seq, notice.slot))
            self._send(address, [encode_control(Staged(agent_id=self.agent_id, payload=ack))])
            return notice.room, f"bad staged notice: prefill {address} has no landing set here"
        receiver = self.landings[j].receiver
        if not live(notice.room):
            receiver.discard(notice)
            return None
        try:
            receiver.on_notice(notice)
        except (WireFormatError, BadInput) as exc:
            receiver.discard(notice)
            return notice.room, f"bad staged notice: {exc}"
        return None

    def snapshot(self) -> dict[str, Any]:
        return {
            "slots": self.memory.slots,
            "slot_bytes": self.memory.slot_bytes,
            "landing_sets": list(self.addresses),
            "scattering": sum(len(landing.receiver.scattering) for landing in self.landings),
        }

    def step(self) -> int:
        """Acknowledge finished scatters; returns how many are still running."""
        for landing in self.landings:
            landing.step()
        return sum(len(landing.receiver.scattering) for landing in self.landings)
