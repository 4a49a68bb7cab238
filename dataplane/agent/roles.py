"""What both role workers share: identity, control sockets, rooms, pools and allocators, accounting,
and the one loop that drives them — drain the inbox, poll transfers, expire rooms, tick.

The loop is event-driven: idle, it blocks in the inbox poll (at most ``IDLE_WAIT``, so deadlines and
heartbeats are checked that often), and a message or another thread's ``WAKE`` frame ends the wait at
once. While transfers are in flight it polls them every ``PAUSE_MIN`` for the first ``TIGHT`` seconds
after a message (most writes finish within it, and a doubling back-off would notice one done at
430 µs only at ~620 µs), then backs off doubling to ``PAUSE_MAX``, so long transfers never keep it
spinning on the GIL. The pauses wait on the inbox (``Inbox.wait``), so a message arriving during one
— the next room's metadata, say — is handled at once rather than after up to ``PAUSE_MAX``.
With ``transfer.spinMicroseconds`` the loop neither blocks nor pauses for that long after each message
received or sent: the reply to a room's metadata, or a small write's completion, is then seen without
a thread wake-up. It spins in ``Inbox.spin`` (a readiness check per µs, not a whole turn), so the next
message is picked up within a microsecond or two of its arrival; running transfers are still polled
every pause, not every check (each poll drives the engine's progress). Off by default: on the 16-core
benchmark hosts spinning took from nothing to 90 µs off a 4 KiB room one at a time and cost throughput
with rooms in flight (1 MiB, eight in flight: 7.2 → 4.2 GB/s with 200 µs; docs/benchmarks.md).
"""

from __future__ import annotations

import abc
import contextlib
import ctypes
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import zmq
from mypy_extensions import mypyc_attr

from ..codec import FrameKind, KVPoll, frame_kind, manifest_from_schema
from ..codec.auth import AuthFailure, is_sealed
from ..compiled import active as compiled_active
from ..config import AgentConfig
from ..errors import BadInput, PDPairError
from ..room import NO_TRACE, Actions, Items, Room, RoomTable, Tracer
from ..schema import AUX_COMPONENT, KV_COMPONENT, RoleSchema
from ..transports import Transport
from .control_sockets import WAKE, Inbox, LogThrottle, Pushers, message_budget
from .health import AgentStatus
from .lanes import Lanes
from .metrics import AgentMetrics, reason_label
from .peerauth import Pairing, PeerAuth
from .pools import IndexAllocator, MemoryPools, give_items
from .stats import StatsBook
from .synthetic import SyntheticEngine

log = logging.getLogger(__name__)

IDLE_WAIT = 0.01
PAUSE_MIN, PAUSE_MAX, TIGHT = 20e-6, 1e-3, 1e-3
"""Polling while transfers run: every ``PAUSE_MIN`` for ``TIGHT`` s after a message, then doubling."""
TURN_MESSAGES = 257
"""Most messages one turn of the loop handles (a role may take fewer: ``turn_messages``)."""
PR_SET_TIMERSLACK = 29

_ALONE = contextlib.nullcontext()
"""``together`` for a single message: a shared no-op context."""

_REFUSAL_KINDS = (
    ("generation", "generation_mismatch"),
    ("unknown state type", "unknown_state_type"),
    ("model", "model_mismatch"),
    ("page size", "page_size_mismatch"),
    ("kv ", "kv_mismatch"),
    ("declares", "component_count_mismatch"),
    ("component", "component_mismatch"),
    ("malformed", "wire_format"),
    ("manifest", "wire_format"),
    ("expected a prefill", "role_mismatch"),
)


def tight_timers() -> None:
    """Let this thread's timed waits end on time: Linux lets a sleep overrun by the thread's timer
    slack (50 µs by default) to batch wake-ups, and the worker's 20 µs pauses between polls of a
    running transfer then last ~70 µs — longer than a small write takes. 1 ns of slack costs no CPU.
    Threads inherit it from the thread that starts them (``pdpair-agent run`` sets it first thing)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)


def refusal_reason_label(reason: str) -> str:
    """A bounded metric label for a refusal; the full reason goes to logs and ``/status``."""
    low = reason.lower()
    for needle, label in _REFUSAL_KINDS:
        if needle in low:
            return label
    return reason_label(reason)


@mypyc_attr(allow_interpreted_subclasses=True)
class RoleWorker(abc.ABC):
    role = "agent"
    turn_messages = TURN_MESSAGES

    def __init__(
        self,
        cfg: AgentConfig,
        schema: RoleSchema,
        pools: MemoryPools,
        transport: Transport,
        metrics: AgentMetrics,
        status: AgentStatus,
        *,
        ctx: zmq.Context,
        name: str,
        instance: str,
        blobs: list[bytes] | None = None,
        staging: Any = None,
        tracer: Tracer = NO_TRACE,
        source: Any = None,
    ):
        """``source``: where the role's rooms come from (``agent.sources``; None: the synthetic engine)."""
        self.cfg, self.schema, self.pools, self.transport = cfg, schema, pools, transport
        self.metrics, self.status, self.stats = metrics, status, StatsBook()
        self.name, self.instance, self.ctx = name, instance, ctx
        self.blobs = list(blobs or [])
        """Descriptor blob of each registered region (canonical order), from ``transport.register``."""
        self.staging = staging
        """The staged path's registered buffers (``staged.StagingMemory``), or None: direct writes only."""
        self.agent_id = f"{name}@{instance}"
        self.generation = cfg.identity.generation
        self.manifest = manifest_from_schema(schema, role=self.role, generation=self.generation)  # type: ignore[arg-type]
        self.timeout = cfg.transfer.timeout_seconds
        items = schema.kv.num_pages + schema.aux.num_items + sum(c.num_items for c in schema.components)
        self.max_message = message_budget(len(self.blobs), items)
        """The largest control message accepted (``control.message_budget``), on ZMQ and lanes alike."""
        lanes = Lanes(cfg.listen.host, cfg.listen.lane_port, self.max_message) if cfg.listen.lanes else None
        self.inbox = Inbox(ctx, cfg.listen.host, cfg.listen.control_port, lanes, self.max_message)
        transport.waker = self.inbox.waker()
        if transport.wake_fd is not None:
            self.inbox.watch(transport.wake_fd)
        self.pushers = Pushers(ctx, lanes)
        self.lanes = lanes
        self.auth = PeerAuth(cfg.auth.read_key(), cfg.auth.allow_plain_peers, metrics, status)
        self.pushers.seal = self.auth.seal
        self.sender: Pairing | None = None
        """The pairing whose seal the message being handled carried (None: unsealed)."""
        if self.auth.key is None:
            log.warning("%s: no auth.keyFile: pairs only with plain peers that allow it", self.role)
        self.rooms: RoomTable[Any] = RoomTable(self.role)
        self.tracer = tracer
        self.tracing = tracer.enabled
        """Marks the room's trace points (``room.trace``); off unless a benchmark turns it on."""
        self.woke = 0.0
        """While tracing: when the loop's last wait for messages returned (``time.perf_counter()``)."""
        self.engine = SyntheticEngine(pools)
        self.kv_pages = IndexAllocator("kv", schema.kv.num_pages)
        self.aux_slots = IndexAllocator("aux", schema.aux.num_items)
        self.state_items = [IndexAllocator(c.name, c.num_items) for c in schema.components]
        self._names = {KV_COMPONENT: ("kv", "kv"), AUX_COMPONENT: ("aux", "aux")}
        self._names.update({i: (c.name, c.state_type) for i, c in enumerate(schema.components)})
        self.thread: threading.Thread | None = None
        self.turn = 1
        """How many messages this turn of the loop handles together (``together``)."""
        self.pool_lock = threading.Lock()
        """Guards the allocators when a role fills sources on another thread (prefill's engine)."""
        self.owns_items = True
        """False when a serving engine owns every item (the sidecar): ``release`` frees nothing."""
        self.on_shutdown: list[Callable[[], None]] = []
        """Run first when the worker's loop ends (the sidecar returns the engine's connection)."""
        self.spin_until = 0.0
        """``time.monotonic()`` until which the loop polls without sleeping, whatever
        ``transfer.spinMicroseconds`` says (the sidecar awaiting its engine's answer)."""
        self.rejected: dict[str, int] = {}
        """Messages dropped as unusable, by kind (``rejected_message``): their warnings are throttled."""
        self._throttle = LogThrottle()
        self.given_source = source
        self.setup()

    def setup(self) -> None:  # noqa: B027 - an optional hook, not abstract
        """Role-specific state (subclasses)."""

    # ---- the loop -------------------------------------------------------------------------
    def start(self, stop: threading.Event) -> None:
        self.thread = threading.Thread(target=self.run, args=(stop,), name=f"pdpair-{self.role}", daemon=True)
        self.thread.start()
        self.metrics.worker_cpu.native_id = self.thread.native_id

    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def run(self, stop: threading.Event) -> None:
        tight_timers()
        running, pause, inflight, active, spinning, until = 0, PAUSE_MIN, -1, 0.0, False, 0.0
        spin = self.cfg.transfer.spin_microseconds * 1e-6
        try:
            while not stop.is_set():
                if spinning and not running:
                    self.inbox.spin(min(until, time.monotonic() + self.idle_wait()))
                first = self.inbox.recv(0 if running or spinning else self.idle_wait())
                if self.tracing and first:
                    self.woke = time.perf_counter()
                batch = [first, *self.inbox.drain(self.turn_messages - 1)] if first else []
                with self.together(len(batch)):
                    for frames in batch:
                        self.dispatch(frames)
                self.transport.collect()
                running = self.poll_transfers()
                now = time.monotonic()
                if first:
                    active = now
                for room, actions in self.rooms.expire(now):
                    self.perform(room, actions)
                self.tick(now)
                self.status.flush_refusals()
                if len(self.rooms) != inflight:
                    inflight = len(self.rooms)
                    self.metrics.set_inflight(inflight)
                until = max(max(active, self.pushers.last_send) + spin if spin > 0 else 0.0, self.spin_until)
                spinning = now < until
                if running:
                    pause = PAUSE_MIN if now - active < TIGHT else min(pause * 2, PAUSE_MAX)
                    end = now + min(pause, self.idle_wait())  # the engine is polled no more often than asleep
                    if not (spinning and self.inbox.spin(min(end, until))):
                        self.inbox.wait(end - time.monotonic())
        finally:
            self.shutdown()  # also when a bug ends the loop: hooks run, sockets close

    def together(self, n: int) -> contextlib.AbstractContextManager[None]:
        """Handling ``n`` messages (or engine requests) that arrived together: the replies leave
        together (one write per lane), and a role may carry their rooms' writes in one engine request
        (``begin_coalescing``). The per-message costs of syscalls and engine requests are what bound a
        worker under many small rooms. One message (every turn of a quiet loop) costs no context at all."""
        return _Turn(self, n) if n > 1 else _ALONE

    def begin_coalescing(self) -> bool:
        """Rooms started from now may share engine requests, posted by ``end_coalescing`` (prefill);
        False: not begun here (the role does not coalesce, or an outer turn already does)."""
        return False

    def end_coalescing(self) -> None:  # noqa: B027 - an optional hook, not abstract
        """Post what waited since ``begin_coalescing``."""

    def idle_wait(self) -> float:
        return IDLE_WAIT

    def dispatch(self, frames: list[bytes]) -> None:
        try:
            if frames == [WAKE]:
                return  # a helper thread handed work over: the loop picks it up below
            self.sender = None
            if is_sealed(frames):
                self.sender = self.auth.open(frames)
                frames = frames[:-1]
            match frame_kind(frames):
                case FrameKind.CONTROL:
                    self.on_control(frames)
                case FrameKind.METADATA:
                    self.on_metadata(frames)
                case FrameKind.STATUS:
                    self.on_status(frames)
                case FrameKind.REGISTRATION:
                    self.on_registration(frames)
        except AuthFailure as exc:
            self.auth.refused(exc.reason, str(exc))
        except PDPairError as exc:
            self.rejected_message(type(exc).__name__, f"{self.role}: dropping message: {exc}")
        except Exception:
            # A bug handling one message must not take the agent down with every other room.
            log.exception("%s: error handling a control message", self.role)
            self.metrics.record_transfer_error("internal")

    def rejected_message(self, kind: str, warning: str) -> None:
        """A message dropped as unusable: counted by ``kind`` (``/status``, metrics); its warning is
        logged at most once per ``LogThrottle.interval`` per kind, so a flood cannot flood the logs."""
        self.rejected[kind] = self.rejected.get(kind, 0) + 1
        self.metrics.record_rejected(kind)
        held = self._throttle.allow(kind)
        if held > 0:
            log.warning("%s (and %d more like it held back)", warning, held)
        elif held == 0:
            log.warning("%s", warning)

    def on_registration(self, frames: list[bytes]) -> None:
        """sglang's registration (prefill takes it)."""
        self.unexpected(FrameKind.REGISTRATION)

    def on_metadata(self, frames: list[bytes]) -> None:
        """sglang's transfer metadata (prefill takes it)."""
        self.unexpected(FrameKind.METADATA)

    def on_status(self, frames: list[bytes]) -> None:
        """sglang's room status (decode takes it)."""
        self.unexpected(FrameKind.STATUS)

    def unexpected(self, kind: FrameKind) -> None:
        self.rejected_message(f"unexpected_{kind.value}", f"{self.role}: dropping a {kind.value} message")

    @abc.abstractmethod
    def on_control(self, frames: list[bytes]) -> None:
        """Handle one of our tagged control messages (hello, refusal, heartbeat, abort)."""

    def poll_transfers(self) -> int:
        return 0

    @abc.abstractmethod
    def perform(self, room: Room[Any] | None, actions: Actions) -> None:
        """Carry out what the room's last transition asked for (``room.lifecycle.Act``)."""

    def fail(self, key: Any, reason: str, notify: bool = True) -> None:
        """Fail the room ``key`` (if still live) and act on it; ``notify``: tell its peer."""
        room, actions = self.rooms.fail(key, reason, time.monotonic(), notify)
        self.perform(room, actions)

    def tick(self, now: float) -> None:  # noqa: B027 - an optional hook, not abstract
        """Periodic work: heartbeats, request generation (subclasses)."""

    def shutdown(self) -> None:
        for hook in self.on_shutdown:
            hook()
        self.pushers.close()
        self.inbox.close()
        self.tracer.close()

    # ---- pools ----------------------------------------------------------------------------
    def allocate(self, kv: list[int], aux: bool, state: list[int]) -> Items | None:
        """Items for one request, or None (nothing taken) when a pool is short."""
        if len(state) > len(self.state_items):
            raise BadInput(
                f"request names {len(state)} state components; the schema has {len(self.state_items)}"
            )
        kv_idx = self.kv_pages.take(sum(kv))
        aux_idx = self.aux_slots.take(1) if aux else np.empty(0, dtype=np.int32)
        st = [
            a.take(n) if n else np.empty(0, dtype=np.int32)
            for a, n in zip(self.state_items, state, strict=False)
        ]
        if kv_idx is None or aux_idx is None or any(s is None for s in st):
            self.give_back(kv_idx, int(aux_idx[0]) if aux_idx is not None and len(aux_idx) else None, st)
            return None
        st += [None] * (len(self.state_items) - len(st))
        return Items(kv_idx, (int(aux_idx[0]) if len(aux_idx) else None), st)

    def release(self, items: Items) -> None:
        """Give a room's items back to the allocators (nothing, when a serving engine owns them)."""
        if self.owns_items:
            self.give_back(*items)

    def give_back(self, kv: np.ndarray | None, aux: int | None, state: list[Any]) -> None:
        give_items(self.kv_pages, self.aux_slots, self.state_items, kv, aux, state)

    # ---- accounting -------------------------------------------------------------------------
    def component_name(self, comp: int) -> tuple[str, str]:
        return self._names.get(comp, (f"component-{comp}", "unknown"))

    def account(
        self, comp: int, peer: str, nbytes: int, writes: int, seconds: float | None, start: float, end: float,
        post: float | None = None,
    ) -> None:
        """``post``: of ``seconds``, how long the engine's ``write`` took to return (host work)."""
        name, stype = self.component_name(comp)
        self.metrics.record_component(name, stype, peer, nbytes, writes, seconds)
        self.stats.record(name, stype, nbytes, writes, seconds, post)
        self.stats.window(start, end)

    def paired(self, label: str, instance: str = "") -> None:
        log.info("%s paired with %s", self.role, label)
        self.metrics.record_handshake(label)
        self.status.peer_paired(label, instance)

    def count_outcome(self, room: Room[Any]) -> None:
        if room.state == KVPoll.Success:
            self.metrics.record_outcome(room.peer, "success")
            return
        aborted = room.reason.startswith("aborted")
        self.metrics.record_outcome(room.peer, "aborted" if aborted else "failed", reason_label(room.reason))
        log.warning("%s room %d (%s) failed: %s", self.role, room.room, room.peer, room.reason)

    def snapshot(self) -> dict[str, Any]:
        out = {"rooms": self.rooms.snapshot(), "dropped_control_messages": self.pushers.dropped}
        out["control"] = {
            "max_message_bytes": self.max_message,
            "rejected": dict(self.rejected),
            "send_drops": dict(self.pushers.drops),
            "open_sockets": self.pushers.open_sockets,
            "evicted_sockets": self.pushers.evicted,
        }
        cpu = self.metrics.worker_cpu.seconds()
        if cpu is not None:
            out["worker_cpu_seconds"] = round(cpu, 6)
        if self.lanes is not None:
            out["lanes"] = {"up": sorted(self.lanes.by_address), "fallbacks": self.lanes.fallbacks}
        out["transport"] = self.transport.describe()
        out["compiled"] = compiled_active()
        out.update(self.stats.snapshot())
        return out


class _Turn:
    """``RoleWorker.together``'s context (a plain class: it runs every busy turn, and a generator's
    context costs more): the turn's size, corked sends, coalesced rooms; undone in reverse order."""

    __slots__ = ("coalescing", "corked", "n", "outer", "worker")

    def __init__(self, worker: RoleWorker, n: int):
        self.worker, self.n, self.outer, self.coalescing = worker, n, 0, False
        self.corked = worker.pushers.corked()

    def __enter__(self) -> None:
        w = self.worker
        self.outer, w.turn = w.turn, max(self.n, w.turn)
        self.corked.__enter__()
        self.coalescing = w.begin_coalescing()

    def __exit__(self, *exc: object) -> None:
        w = self.worker
        try:
            try:
                if self.coalescing:
                    w.end_coalescing()
            finally:
                self.corked.__exit__()
        finally:
            w.turn = self.outer
