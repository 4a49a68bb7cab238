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
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from ..codec.control import Staged, StagedOffer, encode_control
from ..config import AgentConfig, StagedConfig
from ..errors import BadInput, WireFormatError
from ..planner import WritePlan
from ..staging import (
    DEFAULT_THRESHOLD,
    HostStager,
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
from ..transports import MemoryRegion, Peer, Transfer, TransferState, Transport, Writes
from .pools import MemoryPools

__all__ = [
    "DecodeStaging",
    "PrefillStaging",
    "StagedLanding",
    "StagedWriter",
    "StagingMemory",
    "staging_enabled",
]

log = logging.getLogger("pdpair.agent.staged")

ROW_ALIGN = 1 << 20
"""Largest staging row; region bases in an arena are 2 MiB-aligned, so it divides every base."""
MAX_OFFERS = 256
"""Offers kept for decodes that have not registered yet (oldest dropped first)."""


def staging_enabled(cfg: AgentConfig) -> bool:
    """``auto`` stages only GPU pools (where per-page engine writes cost most); ``on`` also host."""
    mode = cfg.transfer.staged.mode
    return mode == "on" or (mode == "auto" and cfg.transfer.device == "cuda")


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


class StagingMemory:
    """A role's staging buffers (``sets`` of ``slots`` x ``slot_bytes``) over its pools' arena."""

    def __init__(self, pools: MemoryPools, cfg: StagedConfig, sets: int):
        if pools.arena is None or pools.bases is None:
            raise BadInput("staged path: the pools must be allocated as one arena")
        if cfg.slots < 1 or cfg.slots > 1024:
            raise BadInput(f"transfer.staged.slots must be 1..1024, got {cfg.slots}")
        if cfg.slot_bytes < 4096 or cfg.slot_bytes % 4096:
            raise BadInput(
                f"transfer.staged.slotBytes must be a positive multiple of 4096, got {cfg.slot_bytes}"
            )
        if cfg.min_writes < 1:
            raise BadInput(f"transfer.staged.minWrites must be >= 1, got {cfg.min_writes}")
        if cfg.threshold_bytes < 0:
            raise BadInput(f"transfer.staged.thresholdBytes must be >= 0, got {cfg.threshold_bytes}")
        self.pools, self.cfg = pools, cfg
        self.slots, self.slot_bytes = cfg.slots, cfg.slot_bytes
        self.buffers = [_zeros(cfg.slots * cfg.slot_bytes, pools) for _ in range(sets)]
        self.sizes = np.array([r.size for r in pools.regions], dtype=np.int64)
        self.bases = pools.bases
        self.first_region = len(pools.regions)
        """Region id of the first staging buffer (they follow the pools' regions)."""

    @classmethod
    def for_agent(cls, cfg: AgentConfig, pools: MemoryPools) -> StagingMemory | None:
        """The configured staging memory, or None (staging off, or pools without an arena: adopted
        engine memory, where one kernel cannot index every region)."""
        if not staging_enabled(cfg):
            return None
        if pools.arena is None:
            log.warning("staged path off: the pools are not one arena (adopted engine memory)")
            return None
        sets = 1 if cfg.role == "prefill" else max(1, cfg.prefill.tp_size // cfg.decode.tp_size)
        return cls(pools, cfg.transfer.staged, sets)

    def regions(self) -> list[MemoryRegion]:
        return [
            MemoryRegion(_address(b), self.slots * self.slot_bytes, self.pools.device, self.pools.gpu_id)
            for b in self.buffers
        ]

    def stager(self, index: int) -> Any:
        """Gather / scatter between the arena and buffer ``index`` (torch on CUDA, numpy on host)."""
        if self.pools.device == "cuda":
            from ..staging.gpu import TorchStager

            return TorchStager(self.pools.arena, self.buffers[index], kernel=self.cfg.kernel)
        return HostStager(self.pools.arena, self.buffers[index])

    def pool(self, index: int) -> SlotPool:
        return SlotPool(self.slots, self.slot_bytes, self.buffers[index])


def _zeros(nbytes: int, pools: MemoryPools) -> Any:
    if pools.device == "cuda":
        import torch

        return torch.zeros(nbytes, dtype=torch.uint8, device=torch.device("cuda", pools.gpu_id))
    return np.zeros(nbytes, dtype=np.uint8)


def _address(buf: Any) -> int:
    return int(buf.ctypes.data) if isinstance(buf, np.ndarray) else int(buf.data_ptr())


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
