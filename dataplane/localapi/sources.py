"""Room sources for a serving engine over the local API (``agent.sources`` has the protocol and the
synthetic ones): the engine's requests, not the synthetic engine, make the rooms, composed into the
agent's own role workers (``sidecar.external_worker``).

- prefill (``EnginePrefillSource``): decode's transfer metadata and the engine's ``Send`` may arrive
  in either order. Metadata first: the room waits (WaitingForInput, reported to the engine with
  decode's item counts); ``Send`` first: it waits for the metadata until the deadline. When both are
  in, the room begins with the engine's source items (minus decode's cached prefix).
- decode (``EngineDecodeSource``): the engine's ``Expect`` makes the room; its destination items go
  into the transfer metadata (with ``prefix_len``) sent to the prefill pod its ``bootstrap_addr`` names
  (``agent.prefills``; none: the configured one), and completion is reported instead of verified. A
  room whose pod is not paired yet waits for it until the deadline, and fails at once with the reason
  when the pod cannot be read.

The items belong to the engine: nothing here allocates or frees them (the worker's ``owns_items`` is
off), and the engine must not reuse the destination items of a failed room for one transfer timeout
(a frozen prefill may still write late, as in sglang). Every state change is reported through
``EngineLink``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

from ..agent.decode import DecodeWorker
from ..agent.prefill import PrefillWorker
from ..agent.prefills import PrefillPod
from ..agent.roles import RoleWorker
from ..codec import KVPoll, TransferMetadata
from ..errors import PDPairError
from ..room import Items, Room
from .link import AbortCmd, Command, DetachCmd, EngineLink, ExpectCmd, SendCmd
from .server import Session

log = logging.getLogger(__name__)
KEEP_FAILED = 4096
PUMP_STALE = 0.001
SHOW_WITHIN = 0.001


class EngineSide:
    """What both external workers share (composition, not a mixin: mypyc compiles these classes): the
    link, the engine's connection once lent, the commands' hand-out, detach. ``worker`` is the role
    worker it serves; its ``on_command`` acts on each request."""

    def __init__(
        self, worker: RoleWorker, link: EngineLink, on_command: Callable[[Command, float], None],
        answered: tuple[int, ...] = (int(KVPoll.Success), int(KVPoll.Failed)),
    ):
        self.worker, self.link, self.on_command = worker, link, on_command
        self.lead = worker.role[0].upper()
        """The trace points' letter for this side (``room.trace``)."""
        self.lent: Session | None = None
        self.pumped = 0.0
        self.reply_spin = worker.cfg.localapi.engine.reply_spin_microseconds * 1e-6
        self.answered = frozenset(answered)
        link.attach(worker.inbox.waker())  # its loop drains the link every turn: the frame only wakes it
        worker.owns_items = False  # the engine owns every item; the agent never frees one
        worker.on_shutdown.append(self.shutdown)

    def drain(self, now: float) -> None:
        """Read a lent connection, then act on every request queued since the last turn, together."""
        session = self.link.session
        if session is not None:
            self.serve(session, now)
        commands = self.link.drain()
        if not commands:
            return
        with self.worker.together(len(commands)):
            for cmd in commands:
                if self.worker.tracing and not isinstance(cmd, DetachCmd):
                    self.worker.tracer.mark(cmd.room, f"{self.lead}w0")
                try:
                    self.on_command(cmd, now)
                except PDPairError as exc:
                    room = getattr(cmd, "room", -1)
                    log.warning("engine request for room %s failed: %s", room, exc)
                    self.link.report(room, KVPoll.Failed, str(exc))

    def serve(self, session: Session, now: float) -> None:
        """Read the lent connection's requests: when the inbox's wait found it readable, when a whole
        frame is already buffered, or every ``PUMP_STALE`` (a turn that found ZMQ traffic first did not
        wait)."""
        inbox = self.worker.inbox
        if session is not self.lent:
            self.lent = session
            inbox.watch(session.fd)
        elif not (inbox.readable(session.fd) or session.reader.whole() or now - self.pumped > PUMP_STALE):
            return
        self.pumped = now
        if not session.pump(self.link.queue):
            self.give_back()

    def give_back(self) -> None:
        """Return the engine's connection to its thread (stop watching it first: it may be closed)."""
        session, self.lent = self.lent, None
        if session is None:
            return
        self.worker.inbox.unwatch(session.fd)
        self.link.session = None
        session.returned.set()

    def detach(self, cmd: DetachCmd) -> None:
        """The engine went away: fail every live room (the worker tells the peers), say so, done."""
        w = self.worker
        for room in w.rooms.live():
            w.fail(room.key, cmd.reason)
        self.link.flush()
        cmd.done.set()

    def flush(self, now: float) -> None:
        """Push room states once a turn. A state the engine acts on (``answered``: a room finished;
        prefill: decode asked for one) goes at once, with every other one waiting; a state it only
        shows (WaitingForInput on decode, Transferring) waits up to ``SHOW_WITHIN`` for company — a
        short room's Success overtakes it, which saves a write on this thread and an engine wake-up a
        room. After pushing an ``answered`` state, poll for the engine's answer without sleeping for
        ``localapi.engine.replySpinMicroseconds``."""
        link = self.link
        if not link.pending():
            return
        urgent = any(st.state in self.answered for st in link.unpushed())
        if not urgent and now - link.since < SHOW_WITHIN:
            return
        if self.worker.tracing:
            for st in link.unpushed():
                self.worker.tracer.mark(st.room, f"{self.lead}f{st.state}")
        if link.flush() and urgent and self.reply_spin:
            self.worker.spin_until = time.monotonic() + self.reply_spin

    def idle_wait(self, wait: float) -> float:
        """The worker's idle sleep, cut short to push a waiting state within ``SHOW_WITHIN``."""
        if not self.link.pending():
            return wait
        return min(wait, max(0.0, self.link.since + SHOW_WITHIN - time.monotonic()))

    def shutdown(self) -> None:
        self.give_back()
        self.link.flush()


class EnginePrefillSource:
    """Prefill's rooms get their source items from the engine's ``Send``."""

    def __init__(self, link: EngineLink):
        self.link = link
        self.sends: dict[int, tuple[SendCmd, float]] = {}
        """The engine's ``Send`` per room id, with its deadline for decode's metadata."""
        self.parked: dict[int, list[Any]] = {}
        """Rooms (keys) whose metadata came before the engine's ``Send``, by room id."""
        self.done_keys: dict[int, int] = {}
        self.required_info: dict[int, int] = {}
        self.failed: OrderedDict[int, str] = OrderedDict()
        """Recently failed rooms: a ``Send`` arriving after its room failed fails at once."""
        self.failing = -1
        """The room id whose other decode ranks are being failed with it (reported once)."""

    def attach(self, worker: PrefillWorker) -> None:
        self.worker = worker
        answered = (int(KVPoll.Success), int(KVPoll.Failed), int(KVPoll.WaitingForInput))
        self.side = EngineSide(worker, self.link, self.on_command, answered)

    def start(self, stop: threading.Event) -> None:
        return None

    def opened(self, room: Room[Any], md: TransferMetadata) -> None:
        self.required_info[md.room] = md.required_dst_info_num
        sent = self.sends.get(md.room)
        if sent is not None:
            self.begin(room.key, md, sent[0])
            return
        self.parked.setdefault(md.room, []).append(room.key)
        counts = tuple(len(s) for s in md.dst_state_indices)
        self.link.report(
            md.room, KVPoll.WaitingForInput, kv_items=len(md.dst_kv_indices),
            aux=md.dst_aux_index >= 0, state_items=counts,
        )

    def begin(self, key: Any, md: TransferMetadata, cmd: SendCmd) -> None:
        """The engine's source items for one (decode rank, room), less the KV pages of decode's
        cached prefix."""
        skip = (md.decode_prefix_len or 0) // self.worker.schema.kv.page_size
        aux = cmd.aux if md.dst_aux_index >= 0 else None
        state = list(cmd.state) + [None] * (len(self.worker.schema.components) - len(cmd.state))
        self.worker.begin(key, Items(cmd.kv[skip:], aux, state))

    def on_command(self, cmd: Command, now: float) -> None:
        w = self.worker
        if isinstance(cmd, SendCmd):
            if cmd.room in self.failed:
                self.link.report(cmd.room, KVPoll.Failed, self.failed[cmd.room])
                return
            self.sends[cmd.room] = (cmd, now + w.timeout)
            parked = self.parked.pop(cmd.room, [])
            if not parked:
                self.link.report(cmd.room, KVPoll.Bootstrapping)
            for key in parked:
                room = w.rooms.get(key)
                if room is not None:
                    self.begin(key, room.record.metadata, cmd)
        elif isinstance(cmd, AbortCmd):
            self.abort_room(cmd.room, f"aborted by engine: {cmd.reason}")
        elif isinstance(cmd, DetachCmd):
            self.sends.clear()
            self.parked.clear()
            self.side.detach(cmd)

    def abort_room(self, room_id: int, reason: str) -> None:
        self.forget_room(room_id)
        rooms = [r for r in self.worker.rooms.live() if r.room == room_id]
        for room in rooms:
            self.worker.fail(room.key, reason)
        if not rooms:
            self.link.report(room_id, KVPoll.Failed, reason)

    def forget_room(self, room_id: int) -> None:
        self.sends.pop(room_id, None)
        self.parked.pop(room_id, None)
        self.required_info.pop(room_id, None)
        self.done_keys.pop(room_id, None)

    def report(self, room: Room[Any]) -> None:
        """Once per room id: Failed at the first failed decode rank (the others are failed with it),
        Success when every decode rank that asked for the room has it."""
        state = room.state
        if state == KVPoll.Transferring:
            self.link.report(room.room, KVPoll.Transferring)
        elif state == KVPoll.Failed:
            if room.room == self.failing:
                return
            self.forget_room(room.room)
            self.failed[room.room] = room.reason
            while len(self.failed) > KEEP_FAILED:
                self.failed.popitem(last=False)
            self.failing = room.room
            try:
                for other in [r for r in self.worker.rooms.live() if r.room == room.room]:
                    self.worker.fail(other.key, room.reason, notify=not room.quiet)
            finally:
                self.failing = -1
            self.link.report(room.room, KVPoll.Failed, room.reason)
        elif state == KVPoll.Success:
            done = self.done_keys.get(room.room, 0) + 1
            if done >= self.required_info.get(room.room, 1):
                self.forget_room(room.room)
                self.link.report(room.room, KVPoll.Success)
            else:
                self.done_keys[room.room] = done

    def poll(self) -> None:
        return None

    def tick(self, now: float) -> None:
        """Engine requests first; a ``Send`` whose metadata never came fails at its deadline."""
        self.side.drain(now)
        for room_id, (_, deadline) in list(self.sends.items()):
            if deadline <= now and not any(r.room == room_id for r in self.worker.rooms.live()):
                self.sends.pop(room_id, None)
                self.link.report(room_id, KVPoll.Failed, "no transfer request from decode by the deadline")

    def flush(self, now: float) -> None:
        """The turn's room states go out together, after every other step."""
        self.side.flush(now)

    def idle_wait(self, wait: float) -> float:
        return self.side.idle_wait(wait)


class EngineDecodeSource:
    """Decode's rooms are the engine's ``Expect`` requests, started once the prefill ranks pair."""

    def __init__(self, link: EngineLink):
        self.link = link
        self.waiting: deque[tuple[ExpectCmd, PrefillPod, float]] = deque()

    def attach(self, worker: DecodeWorker) -> None:
        self.worker = worker
        self.side = EngineSide(worker, self.link, self.on_command)

    def generate(self, now: float) -> None:
        """Rooms come from the engine: start those whose prefill pod paired, in order per pod; fail
        those whose pod cannot be paired or did not pair by the deadline."""
        self.side.drain(now)
        if not self.waiting:
            return
        held: set[int] = set()
        keep: deque[tuple[ExpectCmd, PrefillPod, float]] = deque()
        for cmd, pod, deadline in self.waiting:
            if pod.failed:
                self.link.report(cmd.room, KVPoll.Failed, pod.failed)
            elif id(pod) not in held and pod.ready():
                self.start(cmd, pod)
            elif deadline <= now:
                why = f"prefill {pod.address} not paired before the deadline"
                self.link.report(cmd.room, KVPoll.Failed, why)
            else:
                held.add(id(pod))
                keep.append((cmd, pod, deadline))
        self.waiting = keep

    def on_command(self, cmd: Command, now: float) -> None:
        w = self.worker
        if isinstance(cmd, ExpectCmd):
            pod = w.prefills.pod(cmd.bootstrap, now)
            if pod.ready() and not any(x[1] is pod for x in self.waiting):
                self.start(cmd, pod)
            else:
                self.waiting.append((cmd, pod, now + w.timeout))
                self.link.report(cmd.room, KVPoll.Bootstrapping)
        elif isinstance(cmd, AbortCmd):
            reason = f"aborted by engine: {cmd.reason}"
            self.waiting = deque(x for x in self.waiting if x[0].room != cmd.room)
            if cmd.room in w.rooms:
                w.fail(cmd.room, reason)
            else:
                self.link.report(cmd.room, KVPoll.Failed, reason)
        elif isinstance(cmd, DetachCmd):
            self.waiting.clear()
            self.side.detach(cmd)

    def start(self, cmd: ExpectCmd, pod: PrefillPod) -> None:
        state = list(cmd.state) + [None] * (len(self.worker.schema.components) - len(cmd.state))
        self.worker.open_room(cmd.room, Items(cmd.kv, cmd.aux, state), cmd.prefix_len or None, pod)

    def report(self, room: Room[Any]) -> None:
        state = room.state
        if state == KVPoll.WaitingForInput or state == KVPoll.Success:
            self.link.report(room.room, state)
        elif state == KVPoll.Failed:
            self.link.report(room.room, state, room.reason)

    def flush(self, now: float) -> None:
        self.side.flush(now)

    def idle_wait(self, wait: float) -> float:
        return self.side.idle_wait(wait)


__all__ = ["EngineDecodeSource", "EnginePrefillSource", "EngineSide"]
