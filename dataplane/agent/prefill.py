"""The prefill role worker: accepts decode registrations, and per room plans and writes its state.

One thread drives everything (the transport is not thread-safe): it drains the control inbox, starts
writes, polls in-flight transfers, sends status frames and heartbeats, and fails rooms past their
deadline — aborting their transfers, so a frozen decode can never pin the worker (sglang #32579).
A decode that stops heartbeating (``liveness``) is dropped: its rooms fail, its transport peer is
disconnected, ``peer_up`` goes to 0 and, with no decode left, ``/readyz`` goes false.

Per registration: its proof of the PDPair key (``codec.auth``; a registration without one is refused
unless ``auth.allowPlainPeers``, and never displaces an authenticated pairing) → decode
``Registration`` → ``check_compatible`` (refusal: ``Refused`` with the exact reason back to decode,
and the same reason in logs, metrics and ``/status``) → ``transport.connect`` → ``PeerLayout`` +
prepared pairing → ``Hello`` back as the acceptance, sealed with the pairing's key (``peerauth``).
A message that fails authentication, or names a decode that is not registered, gets no answer.
Per room (``TransferMetadata``): the room opens in the state machine (``room.lifecycle``) → its
source gives the source items (``agent.sources``: the synthetic engine fills them, on the forward
thread when verifying; ``localapi.sources``: the serving engine's ``Send``) → ``Begin`` →
``plan_request`` → one write per component (``requests.transfer_requests``: one engine request for a
small room; the small rooms that start in one turn of the loop share one, ``begin_coalescing``) →
``WritesDone`` or ``Fail`` → the machine's actions: status Success / Failed to decode, items freed,
the source told. The worker performs the actions (``perform``); no room state lives outside the
table's records. A large write's copy goes to the transport's posting thread when other rooms wait
(``busy``). With the staged
path on (``agent/staged.py``), a decode that offered a landing buffer gets its small-write components
gathered, written per slot and scattered, and Success waits for decode's last acknowledgement.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from mypy_extensions import mypyc_attr

from ..codec import (
    Abort,
    Heartbeat,
    Hello,
    KVPoll,
    Refused,
    Registration,
    StatusMessage,
    TransferMetadata,
    check_compatible,
    decode_control,
    decode_metadata,
    decode_registration,
    encode_control,
    encode_manifest,
    encode_status,
)
from ..codec.auth import (
    AuthFailure,
    RegistrationProof,
    check_registration,
    new_nonce,
    offer_digest,
    pair_id,
    pairing_key,
    seal,
    split_proof,
)
from ..codec.auth import lane_token as derive_lane_token
from ..codec.control import Staged, StagedOffer
from ..errors import BadInput, IncompatiblePeer, PDPairError, PeerGone, TransferFailed
from ..planner import PeerLayout, RequestIndices, WritePlan, pairing_for, plan_request
from ..room import (
    WRITES_DONE,
    Act,
    Actions,
    Begin,
    Event,
    InFlight,
    Items,
    Part,
    PrefillRecord,
    Room,
    StagedPart,
)
from ..transports import Peer, Transfer, TransferState, Writes
from .control_sockets import tcp
from .liveness import Heartbeats
from .peerauth import Pairing
from .requests import transfer_requests
from .roles import IDLE_WAIT, RoleWorker, refusal_reason_label
from .sources import PrefillSource, SyntheticPrefillSource
from .staged_roles import PrefillStaging

log = logging.getLogger(__name__)


@dataclass(eq=False)
class DecodePeer:
    label: str
    address: str
    peer: Peer
    layout: PeerLayout
    pairing: Any
    legacy_flat_state: bool
    beats: bool = False
    """The decode heartbeats us (one of our agents; a plain sglang decode does not)."""
    last_seen: float = field(default_factory=time.monotonic)
    registration: tuple[bytes, ...] = ()
    """The registration's frames: the same frames again are a retry (``on_registration``)."""
    auth: Pairing | None = None
    """The authenticated pairing (None: a plain sglang peer, admitted by ``auth.allowPlainPeers``)."""


PrefillRoom = Room[PrefillRecord[DecodePeer, TransferMetadata, Transfer]]


class Waiting(NamedTuple):
    """A small room waiting to share an engine request with the other rooms of its turn."""

    room: PrefillRoom
    parts: list[Part]
    writes: Writes
    start: float


@mypyc_attr(allow_interpreted_subclasses=True)
class PrefillWorker(RoleWorker):
    role = "prefill"
    turn_messages = 4
    """A turn handles at most four messages; their rooms' statuses leave at its end. Handling decode's
    whole burst of metadata in one turn sent one burst of statuses back, to which decode answered with
    the next burst: the two workers took turns instead of overlapping (4 KiB rooms, eight in flight: a
    room every ~200 µs = prefill's CPU per room + decode's). Smaller turns let decode refill while
    prefill works on, at the price of fewer small rooms per shared engine request."""

    def setup(self) -> None:
        self.peers: dict[str, DecodePeer] = {}
        self.pushers.keep = self.peers.__contains__  # paired decodes' sockets are never evicted
        tr = self.cfg.transfer
        self.beats = Heartbeats(self.agent_id, tr.heartbeat_interval_seconds, tr.heartbeat_misses)
        self.coalesce_bytes = tr.coalesce_bytes
        self._coalescing: dict[str, list[Waiting]] | None = None
        """While coalescing (``begin_coalescing``): rooms waiting to be posted together, by decode address."""
        self.coalesced_requests = self.coalesced_rooms = 0
        self.staged = (
            PrefillStaging(self.staging, self.transport, self.agent_id, self.pushers.send)
            if self.staging is not None
            else None
        )
        self.source: PrefillSource = self.given_source or SyntheticPrefillSource()
        self.source.attach(self)

    def start(self, stop: threading.Event) -> None:
        super().start(stop)
        self.source.start(stop)

    # ---- registration -------------------------------------------------------------------
    def on_registration(self, frames: list[bytes]) -> None:
        body, proof_frame = split_proof(frames)
        try:
            reg = decode_registration(body)
        except BadInput as exc:
            self.refuse("unknown", "", f"malformed registration: {exc}")
            return
        address = tcp(reg.endpoint, reg.dst_port)
        label = f"decode-{reg.decode_tp_rank}@{reg.endpoint}"
        current = self.peers.get(address)
        if current is not None and current.registration == tuple(frames):
            # decode resends its registration until it hears Hello: a retry that crossed our Hello.
            # Pairing again would fail its rooms under way (decode may have started them already).
            self.pushers.send(address, [encode_control(self.hello(current, reg, again=True))])
            return
        admitted, proof = self.check_proof(address, body, proof_frame, current)
        if not admitted:
            return
        try:
            if reg.manifest is not None:
                check_compatible(self.manifest, reg.manifest)
            else:
                log.warning(
                    "decode %s sent no manifest (plain sglang peer): pairing without schema check", label
                )
            self.accept(label, address, reg, tuple(frames), proof)
        except IncompatiblePeer as exc:
            self.refuse(label, address, exc.reason, proof)
        except PDPairError as exc:
            self.refuse(label, address, f"cannot pair: {exc}", proof)

    def check_proof(
        self, address: str, body: list[bytes], frame: bytes | None, current: DecodePeer | None
    ) -> tuple[bool, RegistrationProof | None]:
        """(admitted, its proof of the PDPair key). A plain registration (``frame`` None) is admitted
        only when plain peers are allowed and no authenticated pairing holds the address; a refused
        one is counted and never answered."""
        if frame is None:
            if self.auth.allow_plain and (current is None or current.auth is None):
                return True, None
            self.auth.refused("unauthenticated", f"registration from {address} proves no PDPair key")
            return False, None
        if self.auth.key is None:
            self.auth.refused("unauthenticated", f"registration from {address}: no auth.keyFile here")
            return False, None
        try:
            proof = check_registration(self.auth.key, body, frame, self.instance, time.time_ns())
        except AuthFailure as exc:
            self.auth.refused(exc.reason, f"registration from {address}: {exc}")
            return False, None
        if not self.auth.fresh_nonce(proof.nonce):
            self.auth.refused("replay", f"registration from {address}: its nonce was used before")
            return False, None
        return True, proof

    def pairing(self, address: str, proof: RegistrationProof) -> Pairing:
        assert self.auth.key is not None
        nonce = new_nonce()
        key = pairing_key(self.auth.key, proof.nonce, nonce, address, self.instance)
        return Pairing(pair_id(proof.nonce), address, key, nonce)

    def accept(
        self, label: str, address: str, reg: Registration, frames: tuple[bytes, ...],
        proof: RegistrationProof | None = None,
    ) -> None:
        old = self.peers.pop(address, None)
        if old is not None:
            self.drop_peer(old, "decode re-registered", notify=True)
        if self.staged is not None and proof is not None:
            self.bind_offer(address, proof)
        blobs = [
            *reg.dst_kv_mem_descs,
            *reg.dst_aux_mem_descs,
            *(b for c in reg.dst_state_mem_descs for b in c),
        ]
        landing = self.staged.landing_blobs(address) if self.staged is not None else []
        peer = self.transport.connect(label, reg.engine_desc, blobs + landing)
        sizes = [int(s) for s in peer.remote_sizes]
        n_kv, n_aux = len(reg.dst_kv_mem_descs), len(reg.dst_aux_mem_descs)
        state_sizes, at = [], n_kv + n_aux
        for comp in reg.dst_state_mem_descs:
            state_sizes.append(sizes[at : at + len(comp)])
            at += len(comp)
        try:
            layout = PeerLayout.from_registration(
                tp_size=reg.decode_tp_size,
                tp_rank=reg.decode_tp_rank,
                kv_item_len=reg.dst_kv_item_len,
                kv_region_sizes=sizes[:n_kv],
                kv_layer_ids=reg.dst_kv_layer_ids,
                aux_item_lens=[s // self.schema.aux.num_items for s in sizes[n_kv : n_kv + n_aux]],
                aux_region_sizes=sizes[n_kv : n_kv + n_aux],
                state_item_lens=reg.dst_state_item_lens,
                state_region_sizes=state_sizes,
                state_dim_per_tensor=reg.dst_state_dim_per_tensor,
                state_layer_ids=reg.dst_state_layer_ids,
                state_types=[c.state_type for c in reg.manifest.components] if reg.manifest else None,
            )
            pairing = pairing_for(self.schema, layout)
        except PDPairError:
            self.transport.disconnect(peer)
            raise
        if self.staged is not None and landing:
            self.staged.attach(address, peer, landing_region=len(blobs))
        dp = DecodePeer(
            label, address, peer, layout, pairing, reg.legacy_flat_state, beats=reg.manifest is not None,
            registration=frames, auth=self.pairing(address, proof) if proof is not None else None,
        )
        self.peers[address] = dp
        if dp.auth is not None:
            self.auth.add(dp.auth)
        self.pushers.send(address, [encode_control(self.hello(dp, reg))])
        self.paired(label)

    def bind_offer(self, address: str, proof: RegistrationProof) -> None:
        """Keep ``address``'s landing offer only if its registration proof names it: the offer
        travels unsealed before the pairing exists."""
        assert self.staged is not None
        offer = self.staged.offers.get(address)
        if offer is not None and offer_digest(encode_control(offer)) != proof.offer:
            self.staged.offers.pop(address, None)
            self.auth.refused("bad_mac", f"landing offer for {address} is not the one its registration names")

    def hello(self, dp: DecodePeer, reg: Registration, again: bool = False) -> Hello:
        """The acceptance, with a lane invitation for one of our agents (a plain sglang decode stays
        on ZMQ). ``again`` (a retried registration): the invitation already sent stands, and none at
        all once its lane is up — decode re-dials for every invitation, dropping the lane it has.
        With an authenticated pairing the lane token is derived on both sides, never sent."""
        address, auth = dp.address, dp.auth
        lanes = self.lanes if reg.manifest is not None else None
        derived = derive_lane_token(auth.key) if auth is not None else b""
        token = b""
        if lanes is not None and not again:
            token = lanes.invite(address, derived)
        elif lanes is not None and address not in lanes.by_address:
            token = lanes.invites.get(address) or lanes.invite(address, derived)
        return Hello(
            agent_id=self.agent_id,
            generation=self.generation,
            role="prefill",
            manifest=encode_manifest(self.manifest),
            lane_port=lanes.port if lanes is not None and token else 0,
            lane_token=b"" if auth is not None else token,
            nonce=auth.nonce if auth is not None else b"",
        )

    def refuse(self, label: str, address: str, reason: str, proof: RegistrationProof | None = None) -> None:
        """Refuse a registration: a proven decode is told why (sealed for the pairing it asked
        for), a plain one too when plain peers are allowed; nobody else hears anything."""
        log.warning("refusing %s: %s", label, reason)
        self.metrics.record_refusal(label, refusal_reason_label(reason))
        self.status.peer_refused(label, reason, by="self")
        if not address:
            return
        if proof is not None:
            p = self.pairing(address, proof)
            frames = [encode_control(Refused(reason=reason, agent_id=self.agent_id, nonce=p.nonce))]
            self.pushers.send(address, [*frames, seal(p.key, p.pid, 1, frames)])
        elif self.auth.allow_plain:
            self.pushers.send(address, [encode_control(Refused(reason=reason, agent_id=self.agent_id))])

    def drop_peer(self, dp: DecodePeer, reason: str, notify: bool = False) -> None:
        """Forget a decode; its rooms fail (``notify``: decode is told, e.g. one that re-registered
        with rooms still under way; a lost decode is not).

        Its rooms are those keyed by its control address, not by its label: a restarted decode agent
        (a sidecar's next engine) pairs from a new address under the same label while the old
        address waits out its heartbeats. Its loss must not fail the new rooms untold (decode would
        wait for its deadline) nor mark the paired label down."""
        why = f"{reason}: {dp.label}"
        for room in [r for r in self.rooms.live() if r.key == (dp.address, r.room)]:
            self.fail(room.key, why, notify=notify)
        try:
            self.transport.disconnect(dp.peer)
        except TransferFailed as exc:
            log.warning("disconnect %s: %s", dp.label, exc)
        if self.staged is not None:
            self.staged.detach(dp.address)
        if dp.auth is not None and self.auth.by_address.get(dp.address) is dp.auth:
            self.auth.remove(dp.address)
        if any(p.label == dp.label for p in self.peers.values() if p is not dp):
            return  # the label's newer connection is paired
        self.metrics.peer_down(dp.label)
        self.status.peer_down(dp.label, reason)

    # ---- rooms --------------------------------------------------------------------------
    def admitted(self, dp: DecodePeer | None, what: str) -> bool:
        """The message being handled names ``dp`` (None: a decode we do not know) and carries the
        seal of its pairing (or none, from an admitted plain peer)."""
        return self.auth.admit(self.sender, dp.auth if dp is not None else None, dp is not None, what)

    def on_metadata(self, frames: list[bytes]) -> None:
        try:
            md = decode_metadata(frames)
            address = tcp(md.endpoint, md.dst_port)
            dp = self.peers.get(address)
            if dp is not None and dp.legacy_flat_state:
                md = decode_metadata(frames, legacy_flat_state=True)
        except BadInput as exc:
            self.rejected_message("malformed_metadata", f"dropping malformed transfer metadata: {exc}")
            return
        if not self.admitted(dp, f"transfer metadata for {address}"):
            return  # nothing answers a stranger; a decode prefill dropped re-registers when our beats stop
        assert dp is not None
        dp.last_seen = time.monotonic()
        if self.tracing:
            self.tracer.mark(md.room, "Pw", self.woke)
            self.tracer.mark(md.room, "P0")
        try:
            self.open_room(dp, md)
        except PDPairError as exc:
            self.send_status(dp.address, md.room, KVPoll.Failed, str(exc))
            self.metrics.record_outcome(dp.label, "failed", "plan")

    def open_room(self, dp: DecodePeer, md: TransferMetadata) -> None:
        """Open the room (its metadata is in: WaitingForInput); its source gives its items."""
        record: PrefillRecord[DecodePeer, TransferMetadata, Transfer] = PrefillRecord(dp, md)
        room = self.rooms.open(
            (dp.address, md.room), md.room, dp.label, record, now=time.monotonic(), timeout=self.timeout,
            state=KVPoll.WaitingForInput,
        )
        self.source.opened(room, md)

    def begin(self, key: Any, items: Items) -> None:
        """The room's source items are ready: plan and post its writes (items that come after the
        room ended go back)."""
        room, actions = self.rooms.handle(key, Begin(items), time.monotonic())
        if room is None:
            if actions:
                with self.pool_lock:
                    self.release(items)
            return
        try:
            self.perform(room, actions)
        except PDPairError as exc:
            self.fail(key, f"plan: {exc}")

    def settle(self, room: PrefillRoom, event: Event) -> None:
        found, actions = self.rooms.handle(room.key, event, time.monotonic())
        self.perform(found, actions)

    def perform(self, room: PrefillRoom | None, actions: Actions) -> None:
        if room is None:
            return
        rec = room.record
        traced = self.tracing and room.done
        if traced:
            self.tracer.mark(room.room, "P2")
        for act in actions:
            match act:
                case Act.POST:
                    self.post(room)
                case Act.REPORT:
                    self.source.report(room)
                case Act.RELEASE_WRITES:
                    for inflight in rec.pending:
                        self.transport.release(inflight.transfer)  # a shared request runs on for the others
                    rec.pending.clear()
                    if rec.staged is not None and self.staged is not None:
                        self.staged.drop(room.key[0], room.room)  # type: ignore[index]
                case Act.SEND_STATUS:
                    reason = room.reason if room.state == KVPoll.Failed else ""
                    self.send_status(rec.decode.address, room.room, room.state, reason)
                case Act.FREE:
                    if rec.items is not None:
                        with self.pool_lock:
                            self.release(rec.items)
                case Act.COUNT:
                    self.count_outcome(room)
        if traced:
            self.tracer.mark(room.room, "P3")

    def post(self, room: PrefillRoom) -> None:
        """Plan the room from its items and post its writes (or queue them to share a request)."""
        rec = room.record
        dp, md, items = rec.decode, rec.metadata, rec.items
        assert items is not None
        kv, aux, state = items
        req = RequestIndices(
            kv, md.dst_kv_indices, aux, md.dst_aux_index if aux is not None else None, state,
            list(md.dst_state_indices),
        )
        tracing = self.tracing
        if tracing:
            self.tracer.mark(room.room, "Qa")
        plan = plan_request(self.schema, dp.layout, req, pairing=dp.pairing)
        if tracing:
            self.tracer.mark(room.room, "Qb")
        if plan.repeat is not None and (self.staged is not None or not self.transport.takes_strided):
            plan = plan.expanded()  # strided rows only for an engine that takes them, never staged
        if len(plan) == 0:
            self.settle(room, WRITES_DONE)
            return
        if self.staged is not None:
            plan, staged = self.staged.route(dp.address, room.room, plan)
            if len(staged):
                rec.staged = StagedPart(time.perf_counter(), staged)
            if len(plan) == 0:
                return  # every component staged
        if tracing:
            self.tracer.mark(room.room, "Ra")
        requests = transfer_requests(plan, self.transport.one_request_rows)
        if tracing:
            self.tracer.mark(room.room, "Rb")
        small = len(requests) == 1 and requests[0][1].nbytes <= self.coalesce_bytes
        if self._coalescing is not None and small:
            parts, writes = requests[0]
            waiting = Waiting(room, parts, writes, time.perf_counter())
            self._coalescing.setdefault(dp.address, []).append(waiting)
            return  # posted with the other rooms of this turn when ``end_coalescing`` runs
        for parts, writes in requests:
            start = time.perf_counter()
            if tracing:
                self.tracer.mark(room.room, "Wa", start)
            transfer = self.transport.write(dp.peer, writes, overlap=self.busy())
            posted = time.perf_counter()
            if tracing:
                self.tracer.mark(room.room, "Wb", posted)
            rec.pending.append(InFlight(transfer, start, posted, parts))
        self.poll_room(room)  # writes an engine completes while posting: Success goes out now

    def begin_coalescing(self) -> bool:
        """Small rooms started from now wait; ``end_coalescing`` gives each decode's one engine request."""
        if self._coalescing is not None or self.coalesce_bytes <= 0:
            return False
        self._coalescing = {}
        return True

    def end_coalescing(self) -> None:
        waiting_by_decode, self._coalescing = self._coalescing or {}, None
        for waiting in waiting_by_decode.values():
            self.post_together_safely(waiting)

    def post_together_safely(self, waiting: list[Waiting]) -> None:
        """``post_together`` outside ``dispatch``'s guard: a bug fails these rooms, not the worker."""
        try:
            self.post_together(waiting)
        except Exception:
            log.exception("prefill: error posting %d rooms together", len(waiting))
            self.metrics.record_transfer_error("internal")
            for w in waiting:
                if self.rooms.get(w.room.key) is w.room:
                    self.fail(w.room.key, "internal error posting the room")

    def post_together(self, waiting: list[Waiting]) -> None:
        """One engine request for rooms to one decode; a request the engine refuses as a whole is
        retried room by room, so a bad room fails alone and with its own reason."""
        live = [w for w in waiting if self.still_writing(w.room)]
        transfer = None
        if len(live) > 1:
            try:
                writes = Writes.concat([w.writes for w in live])
                transfer = self.transport.write(live[0].room.record.decode.peer, writes, overlap=self.busy())
            except PDPairError:
                transfer = None
        if transfer is None:
            for w in live:
                self.post_one(w)
            return
        posted = time.perf_counter()
        transfer.holders = len(live)
        self.coalesced_requests += 1
        self.coalesced_rooms += len(live)
        for w in live:
            w.room.record.pending.append(InFlight(transfer, w.start, posted, w.parts))
        for w in live:
            self.poll_room(w.room)

    def busy(self) -> bool:
        """Other rooms wait for this worker (more messages this turn, or other rooms in the table):
        a large write's copy should then run beside their work, not before it."""
        return self.turn > 1 or len(self.rooms) > 1

    def still_writing(self, room: PrefillRoom) -> bool:
        """The room is still in the table and not failed meanwhile (aborted, expired, peer lost)."""
        current = self.rooms.get(room.key)
        return current is room and current.state == KVPoll.Transferring

    def post_one(self, w: Waiting) -> None:
        room = w.room
        try:
            transfer = self.transport.write(room.record.decode.peer, w.writes, overlap=self.busy())
        except PDPairError as exc:
            self.fail(room.key, f"plan: {exc}")
            return
        room.record.pending.append(InFlight(transfer, w.start, time.perf_counter(), w.parts))
        self.poll_room(room)

    def poll_transfers(self) -> int:
        """Advance every in-flight room; returns how many transfers are still running."""
        self.source.poll()
        running = self.step_staged() if self.staged is not None else 0
        for room in self.rooms.live():
            running += self.poll_room(room)
        return running

    def poll_room(self, room: PrefillRoom) -> int:
        """Poll one room's transfers; its writes are done when all are. Returns how many still run."""
        rec = room.record
        if not (rec.pending or rec.staged):
            return 0
        done: list[tuple[InFlight[Transfer], float]] = []
        running, left = 0, []
        for i, inflight in enumerate(rec.pending):
            transfer = inflight.transfer
            if transfer.wakes:  # still queued on the engine's thread, which wakes us once it is posted
                left.append(inflight)
                continue
            state = self.transport.poll(transfer)
            if state is TransferState.IN_PROGRESS:
                running += 1
                left.append(inflight)
                continue
            if state is TransferState.FAILED:
                rec.pending = left + rec.pending[i + 1 :]
                self.transfer_failed(room.key, transfer.error)
                break
            done.append((inflight, time.perf_counter()))
        else:
            rec.pending = left
        staged = rec.staged
        if not rec.pending and room.state != KVPoll.Failed and self.staged_done(room.key, staged):
            rec.staged = None
            self.settle(room, WRITES_DONE)
            if staged is not None:
                self.account_staged(room.peer, staged.start, staged.plan)
        for inflight, end in done:  # after the status frame: off decode's path
            start, post = inflight.start, inflight.posted - inflight.start
            for comp, nbytes, writes in inflight.parts:
                self.account(comp, room.peer, nbytes, writes, end - start, start, end, post=post)
        return running

    # ---- the staged path (agent/staged.py) ---------------------------------------------------
    def step_staged(self) -> int:
        """Advance the staged pieces, fail the rooms whose pieces failed; returns pieces to poll."""
        assert self.staged is not None
        for address, room_id, exc in self.staged.step():
            self.metrics.record_transfer_error("peer_gone" if isinstance(exc, PeerGone) else "staged")
            self.fail((address, room_id), f"staged transfer failed: {exc}")
        return self.staged.active

    def staged_done(self, key: Any, staged: StagedPart | None) -> bool:
        """Decode acknowledged every staged piece of the room (true when it had none)."""
        return staged is None or self.staged is None or self.staged.done(key[0], key[1])

    def account_staged(self, peer: str, start: float, plan: WritePlan) -> None:
        end = time.perf_counter()
        for comp, nbytes in plan.bytes_by_component().items():
            writes = int(np.count_nonzero(plan.component == comp))
            self.account(comp, peer, nbytes, writes, end - start, start, end)
            self.metrics.record_staged(*self.component_name(comp), peer, nbytes)

    def transfer_failed(self, key: Any, error: TransferFailed | None) -> None:
        kind = "peer_gone" if isinstance(error, PeerGone) else "transfer"
        self.metrics.record_transfer_error(kind)
        self.fail(key, f"transfer failed: {error}")

    def send_status(self, address: str, room: int, state: KVPoll, reason: str) -> None:
        if self.tracing:
            self.tracer.mark(room, "Ps")  # before the send: on loopback decode may handle it first
        msg = StatusMessage(
            room=room, status=state, prefill_rank=self.schema.tp_rank, failure_reason=reason or None
        )
        self.pushers.send(address, encode_status(msg))

    def snapshot(self) -> dict[str, Any]:
        out = super().snapshot()
        out["coalesced"] = {"requests": self.coalesced_requests, "rooms": self.coalesced_rooms}
        if self.staged is not None:
            out["staged"] = self.staged.snapshot()
        return out

    def on_control(self, frames: list[bytes]) -> None:
        msg = decode_control(frames[0])
        if isinstance(msg, StagedOffer):
            if self.staged is not None:
                self.staged.on_offer(msg)  # kept only if the registration's proof names it (``bind_offer``)
            return
        if isinstance(msg, Abort):
            self.on_abort(msg)
            return
        agent = getattr(msg, "agent_id", "")
        dp = self.peers.get(agent)
        if not self.admitted(dp, f"{type(msg).__name__} from {agent}"):
            return
        assert dp is not None
        if isinstance(msg, Heartbeat):
            dp.last_seen = time.monotonic()
        elif isinstance(msg, Staged) and self.staged is not None:
            self.staged.on_message(msg)

    def on_abort(self, msg: Abort) -> None:
        """Fail the room of the decode whose pairing sealed the abort (a plain peer's: any plain room)."""
        sender = self.sender
        for room in [r for r in self.rooms.live() if r.room == msg.room]:
            key: Any = room.key
            dp = self.peers.get(key[0])
            mine = dp is not None and (dp.auth is sender if sender is not None else dp.auth is None)
            if mine and (sender is not None or self.auth.allow_plain):
                self.fail(room.key, f"aborted by decode: {msg.reason}")
            else:
                reason = "unauthenticated" if sender is None else "bad_mac"
                self.auth.refused(reason, f"abort of room {msg.room}: not its decode's")

    def idle_wait(self) -> float:
        return self.source.idle_wait(IDLE_WAIT)

    def tick(self, now: float) -> None:
        """The source's requests; heartbeats to every paired decode; drop the decodes whose heartbeats
        stopped; then what the source pushes once a turn."""
        self.source.tick(now)
        for dp in [d for d in self.peers.values() if d.beats and self.beats.lost(d.last_seen, now)]:
            del self.peers[dp.address]
            reason = f"decode {dp.label} heartbeat lost: none for {now - dp.last_seen:.1f}s"
            log.warning("%s", reason)
            self.drop_peer(dp, reason)
            self.pushers.forget(dp.address)
        beat = self.beats.due(now)
        if beat is not None:
            for dp in self.peers.values():
                self.pushers.send(dp.address, [beat])
        self.source.flush(now)


__all__ = ["PrefillWorker"]
