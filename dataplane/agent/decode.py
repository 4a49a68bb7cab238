"""The decode role worker: finds prefill through its bootstrap endpoint, registers, originates rooms
(like sglang's decode allocating destination pages), and verifies what arrives.

Prefill pods (``prefills``): the configured bootstrap address, and in sidecar mode every address the
engine names for a room (sglang's router picks a prefill per request); each pod's ranks are paired as
below, once per prefill rank however many addresses name it.

Peer lifecycle per prefill rank: ``registering`` (registration sent, resent until answered) →
``paired`` (``Hello``, manifest checked here too) or ``refused`` (``Refused``: the prefill's exact
reason lands in our logs, metrics and ``/status``). A paired rank that misses ``heartbeat_misses``
heartbeats is ``down``: its rooms fail at once, and it is sent our registration again until it answers
(prefill drops a decode it stops hearing from, so a decode that was frozen must pair again). We
heartbeat every paired rank in turn (``liveness``). A new ``instance`` behind the bootstrap address (a
replaced prefill, sglang PR #34289) fails the old rooms and re-registers with the new process.

Authentication (``peerauth``): each registration attempt carries a fresh nonce and a proof of the
PDPair key for the prefill instance the topology names; only a ``Hello`` or ``Refused`` sealed with
the pairing key derived from it counts, and from then on only messages sealed by that pairing (a
spoofed ``Refused``, status or heartbeat changes nothing: it is counted and dropped).

Rooms: the source (``agent.sources``: the synthetic engine's rate; ``localapi.sources``: the serving
engine's ``Expect``) gives destination items → ``open_room``: metadata to each prefill rank this rank
needs (TP fan-in/out) → each status is an event of the room's state machine (``room.lifecycle``) →
Success from all of them → verify (or account) every component → free. Failed rooms send ``Abort``
and quarantine their items for one timeout, so a late write from a frozen prefill cannot corrupt a
later room. The worker performs the machine's actions (``perform``).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any

import numpy as np
from mypy_extensions import mypyc_attr

from ..codec import (
    Abort,
    Heartbeat,
    Hello,
    Refused,
    Registration,
    TransferMetadata,
    check_compatible,
    decode_control,
    decode_manifest,
    decode_status,
    encode_control,
    encode_metadata,
    encode_registration,
)
from ..codec.auth import lane_token, new_nonce, offer_digest, pair_id, prove_registration
from ..codec.control import Staged
from ..errors import IncompatiblePeer, PDPairError
from ..room import SENT, Act, Actions, DecodeRecord, Items, Room, Status
from .bootstrap import Topology
from .control_sockets import tcp
from .liveness import Heartbeats
from .peerauth import Pending
from .prefills import PrefillPeer, PrefillPod, PrefillTable, plan_ranks
from .roles import IDLE_WAIT, RoleWorker, refusal_reason_label
from .sources import DecodeSource, SyntheticDecodeSource
from .staged_roles import DecodeStaging

log = logging.getLogger(__name__)

REGISTER_RETRY = 2.0
WATCH_SOON = 0.1
"""Of a heartbeat interval: how soon decode reads the bootstrap topology again after it could not."""
PROOF_REFRESH = 60.0
"""Seconds an unanswered registration attempt is resent as it is before a new one replaces it
(prefill accepts a proof for ``codec.auth.PROOF_WINDOW_NS``)."""


DecodeRoom = Room[DecodeRecord[PrefillPeer]]


@mypyc_attr(allow_interpreted_subclasses=True)
class DecodeWorker(RoleWorker):
    role = "decode"

    def setup(self) -> None:
        self.http_key = self.cfg.auth.read_key()
        """Signs the bootstrap queries (the full ``/topology`` is for key holders)."""
        peer = self.cfg.peer
        self.prefills = PrefillTable(
            peer.bootstrap_host, peer.bootstrap_port, peer.max_prefills, self.http_key, self.timeout
        )
        self.pushers.keep = self.is_peer  # the prefill ranks' sockets are never evicted
        base = self.cfg.synthetic.room_base
        self.room_base = random.getrandbits(40) << 20 if base is None else base
        self.made = self.completed = self.succeeded = self.verify_failures = 0
        self._last_tick = 0.0
        self._quarantine: list[tuple[float, Items]] = []
        self._reg_frames = self.registration_frames()
        tr = self.cfg.transfer
        self.me = me = tcp(self.cfg.listen.host, self.inbox.port)
        self.beats = Heartbeats(me, tr.heartbeat_interval_seconds, tr.heartbeat_misses)
        self.staged = (
            DecodeStaging(self.staging, self.blobs, me, self.pushers.send)
            if self.staging is not None
            else None
        )
        self.source: DecodeSource = self.given_source or SyntheticDecodeSource()
        self.source.attach(self)

    def registration_frames(self) -> list[bytes]:
        sch, blobs = self.schema, self.blobs
        n_kv, n_aux = len(sch.kv.layer_ids), len(sch.aux.item_lens)
        state, at = [], n_kv + n_aux
        for comp in sch.components:
            state.append(tuple(blobs[at : at + len(comp.tensors)]))
            at += len(comp.tensors)
        reg = Registration(
            endpoint=self.cfg.listen.host,
            dst_port=self.inbox.port,
            engine_desc=self.transport.endpoint(),
            dst_kv_mem_descs=tuple(blobs[:n_kv]),
            dst_aux_mem_descs=tuple(blobs[n_kv : n_kv + n_aux]),
            dst_state_mem_descs=tuple(state),
            gpu_id=self.cfg.transfer.gpu_id,
            decode_tp_size=sch.tp_size,
            decode_tp_rank=self.cfg.tp_rank,  # the engine rank, as sglang sends it (DP attention: >= size)
            dst_kv_item_len=sch.kv.item_len,
            dst_state_item_lens=tuple(tuple(x) for x in sch.state_item_lens),
            dst_state_dim_per_tensor=tuple(tuple(x) for x in sch.state_dim_per_tensor),
            dst_state_layer_ids=tuple(tuple(x) for x in sch.state_layer_ids),
            dst_kv_layer_ids=tuple(sch.kv.layer_ids),
            manifest=self.manifest,
        )
        return encode_registration(reg)

    # ---- bootstrap watching (own thread: an unreachable or frozen prefill must not stall us) ----
    def start(self, stop: threading.Event) -> None:
        super().start(stop)
        threading.Thread(target=self._watch, args=(stop,), name="pdpair-bootstrap-watch", daemon=True).start()

    def _watch(self, stop: threading.Event) -> None:
        """Read each prefill pod's topology once a heartbeat interval — ``WATCH_SOON`` as often while
        it cannot be read (prefill between two instances): a replacement is found soon after it is up,
        and a pod the engine just named is read within ``WATCH_SOON`` of an interval."""
        interval = self.cfg.transfer.heartbeat_interval_seconds
        while not stop.is_set():
            self.prefills.refresh(time.monotonic(), interval, interval * WATCH_SOON)
            stop.wait(interval * WATCH_SOON)

    @property
    def peers(self) -> dict[int, PrefillPeer]:
        """The configured prefill's ranks this decode rank needs, by rank."""
        return self.prefills.configured.ranks

    @property
    def required(self) -> list[int]:
        return self.prefills.configured.required

    def on_topologies(self, now: float) -> None:
        """Apply the watch thread's reads; a pod that could not be read before it ever paired fails
        (``PrefillPod.failed``: its waiting rooms fail with the reason) and is forgotten. Drop the
        peers no pod names any more."""
        for pod, topo, error in self.prefills.results():
            if topo is not None:
                self.on_topology(pod, topo, now)
            elif not pod.configured and pod.applied is None:
                pod.failed = f"prefill {pod.address} cannot be paired: {error}"
                log.warning("%s", pod.failed)
                self.prefills.forget(pod)
        for peer, reason in self.prefills.take_released():
            self.drop_peer(peer, reason)

    def on_topology(self, pod: PrefillPod, topo: Topology, now: float) -> None:
        if not topo.complete:
            return
        required, pod.info_num = plan_ranks(topo.tp_size, self.schema.tp_size, self.schema.tp_rank)
        for peer, reason in self.prefills.place(pod, topo, required):
            self.drop_peer(peer, reason)

    def drop_peer(self, peer: PrefillPeer, reason: str) -> None:
        self.lose(peer, reason)
        self.pushers.forget(peer.address)
        self.auth.remove(peer.address)

    def is_peer(self, address: str) -> bool:
        """``address`` is one of the prefill ranks this decode pairs with (from the topologies)."""
        return address in self.prefills.peers

    def lose(self, peer: PrefillPeer, reason: str) -> None:
        """The peer is gone: fail its rooms now, mark it down."""
        log.warning("%s", reason)
        peer.state, peer.attempt = "down", None
        for room, actions in self.rooms.fail_peer(peer.label, reason, time.monotonic()):
            self.perform(room, actions)
        self.metrics.peer_down(peer.label)
        self.status.peer_down(peer.label, reason)

    # ---- control messages ---------------------------------------------------------------------
    def _peer_of(self, agent: str) -> PrefillPeer | None:
        return next((p for p in self.prefills.peers.values() if p.agent == agent), None)

    def _status_peer(self, room: Any, rank: int) -> PrefillPeer | None:
        """Who a status of ``room`` from prefill ``rank`` must come from: the room's peer of that rank;
        for a room not (or no longer) here, the peer whose pairing sealed it (a plain peer: the
        configured pod's rank)."""
        if room is not None:
            return room.record.prefill.get(rank)
        sender = self.sender
        if sender is not None:
            return self.prefills.peers.get(sender.address)
        return self.peers.get(rank)

    def on_control(self, frames: list[bytes]) -> None:
        msg = decode_control(frames[0])
        peer = self._peer_of(getattr(msg, "agent_id", ""))
        sender = self.sender
        if sender is not None and sender.fresh:  # the answer to a registration attempt
            if peer is None or sender.address != peer.address or not isinstance(msg, Hello | Refused):
                why = f"answer to the registration sent to {sender.address} names another peer"
                self.auth.refused("bad_mac", why)
                return
        elif not self.auth.admit(sender, peer.auth if peer else None, peer is not None, type(msg).__name__):
            return
        assert peer is not None
        now = time.monotonic()
        if isinstance(msg, Hello):
            self.on_hello(peer, msg, now)
        elif isinstance(msg, Refused):
            if sender is not None:
                self.auth.pending.pop(sender.pid, None)
            peer.state = "refused"
            log.error("prefill %s refused us: %s", peer.label, msg.reason)
            self.metrics.record_refusal(peer.label, refusal_reason_label(msg.reason))
            self.status.peer_refused(peer.label, msg.reason, by="peer")
        elif isinstance(msg, Staged) and self.staged is not None:
            self.on_staged(peer, msg)
        elif isinstance(msg, Heartbeat) and peer.state == "paired":
            # A lost pairing comes back only through a new registration's Hello: beats prefill queued
            # before it dropped this decode (a frozen decode reads them late) prove nothing now.
            peer.last_seen = now

    def on_hello(self, peer: PrefillPeer, msg: Hello, now: float) -> None:
        try:
            if msg.manifest is not None:
                check_compatible(decode_manifest(msg.manifest), self.manifest)
        except (IncompatiblePeer, PDPairError) as exc:
            reason = exc.reason if isinstance(exc, IncompatiblePeer) else str(exc)
            peer.state = "refused"
            self.metrics.record_refusal(peer.label, refusal_reason_label(reason))
            self.status.peer_refused(peer.label, reason, by="self")
            return
        sender = self.sender
        if sender is not None and sender.fresh:
            if peer.auth is not None:  # prefill re-paired: what the old pairing had under way is void there
                why = f"prefill {peer.label} re-paired"
                for room, actions in self.rooms.fail_peer(peer.label, why, now, notify=False):
                    self.perform(room, actions)
            self.auth.add(sender)
            peer.auth = sender
        peer.state, peer.last_seen, peer.attempt = "paired", now, None
        token = lane_token(peer.auth.key) if peer.auth is not None else msg.lane_token
        if self.lanes is not None and msg.lane_port:
            self.lanes.dial(peer.address, peer.host, msg.lane_port, token, self.me)
        self.paired(peer.label, peer.instance)

    def on_status(self, frames: list[bytes]) -> None:
        st = decode_status(frames)
        room = self.rooms.get(st.room)
        peer = self._status_peer(room, st.prefill_rank)
        what = f"status of room {st.room} from prefill rank {st.prefill_rank}"
        if not self.auth.admit(self.sender, peer.auth if peer else None, peer is not None, what):
            return
        assert peer is not None
        if peer.state == "paired":
            peer.last_seen = time.monotonic()
        if room is None:
            return
        got = time.perf_counter() if self.tracing else 0.0
        event = Status(st.prefill_rank, st.status, st.failure_reason or "")
        room, actions = self.rooms.handle(st.room, event, time.monotonic())
        self.perform(room, actions)
        if self.tracing:
            self.tracer.mark(st.room, "D1", got)
            self.tracer.mark(st.room, "D2")

    # ---- periodic work ------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        self.on_topologies(now)
        beat = self.beats.due(now)
        stalled, self._last_tick = (now - self._last_tick if self._last_tick else 0.0), now
        for peer in list(self.prefills.peers.values()):
            if peer.state == "paired" and stalled > self.beats.limit:
                # This worker sent no beat for longer than prefill waits for one (the process was frozen):
                # prefill has dropped the pairing and ignores it, whatever beats it left queued here say.
                self.lose(peer, f"decode stalled {stalled:.1f}s: pairing with {peer.label} presumed lost")
                peer.last_register = now - REGISTER_RETRY  # register again on the next turn
            elif peer.state == "paired" and self.beats.lost(peer.last_seen, now):
                self.lose(peer, f"prefill {peer.label} heartbeat lost: none for {now - peer.last_seen:.1f}s")
                peer.last_register = now
            elif peer.state == "paired" and beat is not None:
                self.pushers.send(peer.address, [beat])
            elif peer.state in ("registering", "down") and now - peer.last_register > REGISTER_RETRY:
                peer.last_register = now
                offer = self.offer_landing(peer)
                self.pushers.send(peer.address, self.attempt(peer, offer, now), unsealed=True)
        while self._quarantine and self._quarantine[0][0] <= now:
            self.release(self._quarantine.pop(0)[1])
        self.source.generate(now)
        self.source.flush(now)

    def idle_wait(self) -> float:
        return self.source.idle_wait(IDLE_WAIT)

    def attempt(self, peer: PrefillPeer, offer: bytes | None, now: float) -> list[bytes]:
        """The registration to send ``peer``: the same frames while an attempt is unanswered (prefill
        takes a resend as a retry), a new attempt with a fresh nonce after a pairing was lost or
        when the proof nears the end of its validity (``PROOF_REFRESH``)."""
        key = self.auth.key
        if key is None:
            return list(self._reg_frames)
        if peer.attempt is None or now - peer.attempt_time > PROOF_REFRESH:
            nonce = new_nonce()
            for pid in [p for p, pend in self.auth.pending.items() if pend.address == peer.address]:
                del self.auth.pending[pid]
            self.auth.pending[pair_id(nonce)] = Pending(nonce, self.me, peer.instance, peer.address)
            proof = prove_registration(
                key, self._reg_frames, peer.instance, time.time_ns(), nonce, offer_digest(offer)
            )
            peer.attempt, peer.attempt_time = [*self._reg_frames, proof], now
        return list(peer.attempt)

    # ---- the staged path (agent/staged.py) ------------------------------------------------------
    def offer_landing(self, peer: PrefillPeer) -> bytes | None:
        """Just before the registration, on the same socket: the landing buffer for ``peer``'s rank
        (the frame sent, which the registration's proof names)."""
        if self.staged is not None and self.peers.get(peer.rank) is peer:  # the configured pod's only
            frame = self.staged.offer(self.required.index(peer.rank), peer.address)
            if frame is not None:
                self.pushers.send(peer.address, [frame], unsealed=True)
            return frame
        return None

    def on_staged(self, peer: PrefillPeer, msg: Staged) -> None:
        """A staged piece landed: scatter it (its ack follows from ``poll_transfers``); a notice this
        side refuses fails its room, and decode's Abort tells prefill."""
        assert self.staged is not None
        j = self.required.index(peer.rank) if self.peers.get(peer.rank) is peer else -1
        refused = self.staged.on_message(j, msg, self.rooms.__contains__, peer.address)
        if refused is not None:
            self.fail(refused[0], refused[1])

    def poll_transfers(self) -> int:
        """Finished scatters are acknowledged; returns how many still run (the loop polls them)."""
        return self.staged.step() if self.staged is not None else 0

    def ready_to_send(self) -> bool:
        return self.prefills.configured.ready()

    def open_room(
        self, room_id: int, items: Items, prefix_len: int | None = None, pod: PrefillPod | None = None
    ) -> None:
        """A room of ``items`` (from the source): its metadata to every rank of ``pod``, the prefill pod
        the engine named (None: the configured one) that it needs."""
        started = time.perf_counter() if self.tracing else 0.0
        pod = pod or self.prefills.configured
        first = pod.ranks[pod.required[0]]
        record = DecodeRecord(items, set(pod.required), prefill=dict(pod.ranks))
        self.rooms.open(room_id, room_id, first.label, record, now=time.monotonic(), timeout=self.timeout)
        kv, aux, state = items
        md = TransferMetadata(
            room=room_id,
            endpoint=self.cfg.listen.host,
            dst_port=self.inbox.port,
            engine_key=self.agent_id,
            dst_kv_indices=kv,
            dst_aux_index=-1 if aux is None else aux,
            dst_state_indices=tuple(np.empty(0, np.int32) if s is None else s for s in state),
            required_dst_info_num=pod.info_num,
            decode_prefix_len=prefix_len,
        )
        frames = encode_metadata(md)
        record.sent = time.perf_counter()
        for r in pod.required:
            self.pushers.send(pod.ranks[r].address, list(frames))
        room, actions = self.rooms.handle(room_id, SENT, time.monotonic())
        self.perform(room, actions)
        if self.tracing:
            self.tracer.mark(room_id, "D0a", started)
            self.tracer.mark(room_id, "D0b")

    def perform(self, room: DecodeRoom | None, actions: Actions) -> None:
        if room is None:
            return
        rec = room.record
        for act in actions:
            match act:
                case Act.SEND_ABORT:
                    abort = [encode_control(Abort(room=room.room, reason=room.reason[:512]))]
                    for r in rec.ranks:
                        if r in rec.prefill:
                            self.pushers.send(rec.prefill[r].address, list(abort))
                case Act.QUARANTINE:
                    self._quarantine.append((time.monotonic() + self.timeout, rec.items))
                case Act.COUNT:
                    try:
                        self.count_outcome(room)
                    finally:
                        self.completed += 1
                case Act.COMPLETE:
                    try:
                        self.complete(room)
                    finally:
                        self.completed += 1
                case Act.REPORT:
                    self.source.report(room)

    def complete(self, room: DecodeRoom) -> None:
        """Every prefill rank said Success: account (and verify) the room, free its items."""
        rec = room.record
        end = time.perf_counter()
        ok = self.check(room.room, rec, room.peer, end - rec.sent, end)
        self.release(rec.items)
        if ok:
            self.succeeded += 1
            self.count_outcome(room)
        else:
            self.verify_failures += 1
            self.metrics.record_outcome(room.peer, "failed", "verification")

    def check(
        self, room_id: int, dr: DecodeRecord[PrefillPeer], peer: str, seconds: float, end: float
    ) -> bool:
        """Account every component of the finished room; verify its bytes when configured. The first
        ``synthetic.warmup`` rooms reach the metrics but not the statistics (``/status``)."""
        kv, aux, state = dr.items
        stats = self.stats if room_id - self.room_base >= self.cfg.synthetic.warmup else None
        if not self.cfg.synthetic.verify:
            for name, stype, nbytes in self.engine.sizes(kv, aux, state):
                self.metrics.record_component(name, stype, peer, nbytes, 0, seconds)
                if stats is not None:
                    stats.record(name, stype, nbytes, 0, seconds)
            if stats is not None:
                stats.window(dr.sent, end)
            return True
        ok = True
        for c in self.engine.verify(room_id, kv, aux, state):
            self.metrics.record_component(c.component, c.state_type, peer, c.bytes, 0, seconds)
            self.metrics.record_verified(c.component, c.state_type, c.bytes, c.ok)
            if stats is not None:
                stats.record(c.component, c.state_type, c.bytes, 0, seconds)
                stats.verified(c.component, c.state_type, c.bytes, c.ok)
            if not c.ok:
                log.error(
                    "room %d: component %s failed verification (crc %08x, expected %08x)",
                    room_id,
                    c.component,
                    c.checksum,
                    c.expected_checksum,
                )
            ok = ok and c.ok
        if stats is not None:
            stats.window(dr.sent, end)
        return ok

    def snapshot(self) -> dict[str, Any]:
        out = super().snapshot()
        error = self.prefills.configured.error
        out["requests"] = {
            "made": self.made,
            "completed": self.completed,
            "succeeded": self.succeeded,
            "verification_failures": self.verify_failures,
            "target": self.cfg.synthetic.requests,
        }
        out["prefill"] = {
            str(r): {"label": p.label, "state": p.state, "instance": p.instance}
            for r, p in self.peers.items()
        }
        out["bootstrap_error"] = error
        out["prefill_pods"] = self.prefills.snapshot()
        if self.staged is not None:
            out["staged"] = self.staged.snapshot()
        return out
