"""ZMQ control plumbing, like sglang: every agent binds one PULL socket on its explicit host, and
pushes to its peers' PULL sockets.

Only raw multipart bytes cross these sockets; decoding is the codec's job (sglang frames and our
tagged msgspec messages) — nothing here or above ever unpickles. Receives poll with a timeout and
sends never block (``NOBLOCK`` against a bounded high-water mark), so a dead or frozen peer can only
cost dropped messages, which the heartbeat and room deadlines then turn into failures.

ZMQ sockets are not thread-safe: each thread owns its own ``Pushers``; the context is shared.
Between two of our agents the same frames travel on a direct TCP lane once one is up (``lanes``):
``Inbox`` reads the lanes beside its ZMQ socket and ``Pushers`` prefers a peer's lane to its socket.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import select
import threading
import time
from collections import deque
from collections.abc import Callable

import zmq

from .lanes import Lanes

log = logging.getLogger(__name__)

MAX_MESSAGE = 64 * 1024 * 1024
"""Ceiling of any agent's message budget (``message_budget``): no schema asks for more."""
MIN_MESSAGE = (1 << 20) + (64 << 10)
"""Floor of the budget: a ``Staged`` control message (``codec.control.MAX_CONTROL_BYTES``) and framing."""
REGISTRATION_BASE = 64 << 10
"""A registration's frames besides its per-region parts (guard, endpoint, ids, manifest), generously."""
REGION_BYTES = 1024
"""A registration's bytes per registered region: its descriptor blob (19 B with UCX), its share of
the engine descriptor (44 B with UCX over TCP/shared memory; an RDMA key per device is ~100 B more)
and of the per-layer lists, with room to spare."""
INDEX_BYTES = 8
"""Per item index in a room's metadata (int32 on the wire: twice that, for the decimal lists)."""
CONNECTION_BUDGET = 64 << 20
"""Bytes one connection may have queued in the inbox: ZMQ's receive high-water mark is
``CONNECTION_BUDGET // budget`` messages (a sender is then held back by TCP, its own queue fills)."""
MAX_SOCKETS = 256
"""Most outgoing sockets at once: far above the peers a pairing has (prefill TP x decode TP ranks)."""
STRANGER_SOCKETS = 8
"""Most outgoing sockets to addresses that are not paired peers (a registration's first answer,
a failed room's status): the least recently opened one is closed to make room."""
HWM = 10_000
WAKE = b"PDPAIR-WAKE"
"""One-frame message another thread of this process pushes to ``Inbox.wake_address``: "look again"."""
WAKE_HWM = 64
_EVENTS, _POLLIN, _POLLINOUT = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.POLLIN | zmq.POLLOUT)
"""pyzmq's flag enums as plain ints: an ``IntFlag`` operation costs ~1 µs, several times per message."""
_WAKE_IDS = itertools.count()
FD_SETSIZE = 1024
SPIN_CHECKS = 1_000_000
ZMQ_RUN = 8
"""At most this many ZMQ messages in a row while the lanes have messages waiting: the ZMQ socket is open
to the pod network and a flood of it must not starve a paired peer's lane (its heartbeats, its rooms)."""
"""Most readiness checks in one ``Inbox.spin`` (its deadline normally ends it far sooner)."""


def tcp(host: str, port: int) -> str:
    return f"tcp://{host}:{port}"


def message_budget(regions: int, items: int) -> int:
    """The largest control message an agent accepts: its peer's registration (``regions``
    registered regions, two per one of ours for a peer of another TP layout) or a room's metadata
    naming every one of the agent's ``items`` (pages and slots of all pools: a room cannot use
    more), whichever is larger, between ``MIN_MESSAGE`` and ``MAX_MESSAGE``."""
    registration = REGISTRATION_BASE + 2 * regions * REGION_BYTES
    metadata = REGISTRATION_BASE + items * INDEX_BYTES
    return min(MAX_MESSAGE, max(MIN_MESSAGE, registration, metadata))


class Inbox:
    """The agent's bound PULL socket. ``port`` is the bound port (config 0 picks a free one).

    The same socket also binds ``wake_address`` (``inproc://``), so a helper thread's hand-off wakes
    the worker blocked in ``recv`` or ``wait`` at once instead of waiting for its next poll. Only a
    blocked worker is sent the ``WAKE`` frame (``Waker``): one that is awake sees the hand-off in its
    next turn, and a frame would cost the helper a send and the GIL back after it, and the worker a
    receive — per room, when the posting thread hands back each copy. ``lanes``: the direct lanes to
    read beside the socket (their messages come out of ``recv`` and ``drain`` alike)."""

    def __init__(
        self, ctx: zmq.Context, host: str, port: int = 0, lanes: Lanes | None = None,
        max_message: int = MAX_MESSAGE,
    ):
        self._ctx = ctx
        self._sock = ctx.socket(zmq.PULL)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.RCVHWM, max(16, min(HWM, CONNECTION_BUDGET // max_message)))
        self._sock.setsockopt(zmq.MAXMSGSIZE, max_message)
        self.max_message = max_message
        if port:
            self._sock.bind(tcp(host, port))
            self.port = port
        else:
            self.port = self._sock.bind_to_random_port(f"tcp://{host}")
        self.host = host
        self.wake_address = f"inproc://pdpair-wake-{next(_WAKE_IDS)}"
        self._sock.bind(self.wake_address)
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        self._fd = self._sock.getsockopt(zmq.FD)
        self.lanes = lanes
        self._queued: deque[list[bytes]] = deque()
        self._zmq_run = 0
        """ZMQ messages returned since the lanes were last looked at (``ZMQ_RUN`` at most)."""
        self._polled: dict[int, int] = {}
        self.sleeping = False
        """The worker is in (or about to enter) a blocking wait: a hand-off must send ``WAKE``."""
        self.handed_over = False
        """A helper handed work over since the worker's turn began (``recv`` clears it)."""
        self._watched: list[int] = []
        self._hits: set[int] = set()
        self.spin_checks = 0
        """Readiness checks made while spinning: how much the worker polled without sleeping."""

    def watch(self, fd: int) -> None:
        """Also end waits when ``fd`` turns readable: a transport's ``wake_fd`` (the worker clears it),
        an engine's local-API socket (the worker reads it once ``readable`` says so)."""
        if fd not in self._watched:
            self._watched.append(fd)
            self._poller.register(fd, zmq.POLLIN)

    def unwatch(self, fd: int) -> None:
        """Stop watching ``fd`` (before it is closed: a closed descriptor in ``select`` is an error)."""
        if fd in self._watched:
            self._watched.remove(fd)
            self._poller.unregister(fd)
        self._hits.discard(fd)

    def readable(self, fd: int) -> bool:
        """Whether a wait since the last call found the watched ``fd`` readable."""
        if fd in self._hits:
            self._hits.discard(fd)
            return True
        return False

    def recv(self, timeout: float) -> list[bytes] | None:
        """One multipart message, or None after ``timeout`` seconds (rounded up to whole ms: zmq
        polls in ms, and rounding down would turn a short wait into a busy spin). The worker's turn
        begins when it returns: hand-offs before then are the turn's to pick up."""
        try:
            return self._recv(self._asleep(timeout))
        finally:
            self.sleeping = self.handed_over = False

    def _asleep(self, timeout: float) -> float:
        """Mark the worker blocked, then look once more: a hand-off made before the mark sent no
        frame (``Waker``), so it cuts the wait to nothing; one made after it sends one."""
        if timeout <= 0:
            return 0.0
        self.sleeping = True
        return 0.0 if self.handed_over else timeout

    def _recv(self, timeout: float) -> list[bytes] | None:
        """ZMQ's descriptor is edge-triggered: ``EVENTS`` is read before each wait (which re-arms
        it), and the descriptors are waited on with ``select`` — pyzmq's ``Poller`` costs a few µs
        more per turn in Python, and a turn of a busy worker waits once per message."""
        deadline = time.monotonic() + timeout
        lanes, sock = self.lanes, self._sock
        waited, woken = False, False
        for _ in range(1000):  # lane traffic that is not yet a whole message (a hello, a partial read)
            if self._queued:
                self._zmq_run = 0
                return self._queued.popleft()
            if sock.getsockopt(_EVENTS) & _POLLIN:
                if lanes is not None and self._zmq_run >= ZMQ_RUN:
                    self._zmq_run = 0  # a ZMQ flood must not starve the lanes: look at them now
                    ready = self._ready(0.0)
                    ready.discard(self._fd)
                    self._queued.extend(lanes.service(ready))
                    if self._queued:
                        return self._queued.popleft()
                with contextlib.suppress(zmq.Again):
                    msg = sock.recv_multipart(flags=zmq.NOBLOCK)
                    self._zmq_run += 1
                    return msg
            if waited and (woken or time.monotonic() >= deadline):
                return None
            ready = self._ready(max(0.0, deadline - time.monotonic()))
            waited = True
            ready.discard(self._fd)
            for fd in self._watched:
                if fd in ready:
                    woken = True
                    ready.discard(fd)
            if lanes is not None and (ready or lanes.waiting()):
                self._queued.extend(lanes.service(ready))  # connects and hellos time out here too
        return None

    def _sync_lanes(self, lanes: Lanes) -> None:
        """Keep the poller's lane descriptors in step with the lanes (they come and go)."""
        want: dict[int, int] = dict.fromkeys(lanes.fds(), _POLLIN)
        for fd in lanes.wants_write():
            want[fd] = _POLLINOUT
        if want == self._polled:
            return
        for fd in self._polled.keys() - want.keys():
            self._poller.unregister(fd)
        for fd, flags in want.items():
            if self._polled.get(fd) != flags:
                self._poller.register(fd, flags)
        self._polled = want

    def wait(self, timeout: float) -> None:
        """Block until a message may have arrived or ``timeout`` seconds passed, at microsecond
        resolution (``recv`` counts whole milliseconds): the worker's pause between polls of running
        transfers, which a new room's message must cut short. ZMQ's descriptor is edge-triggered;
        reading ``EVENTS`` first re-arms it, so a message arriving during the wait ends it."""
        if self._queued or self._sock.getsockopt(_EVENTS) & _POLLIN:
            return
        try:
            timeout = self._asleep(timeout)
            if timeout > 0:
                self._ready(timeout)
        finally:
            self.sleeping = False

    def spin(self, deadline: float) -> bool:
        """Poll without sleeping until a descriptor turns ready (a message, or ZMQ's own traffic:
        the caller's ``recv`` then finds out which) or ``time.monotonic()`` reaches ``deadline``: one
        ``select`` of zero timeout per check (~1 µs), where a turn of the worker's loop costs tens.
        A helper's hand-off ends it too (a spinning worker is not ``sleeping``: no ``WAKE`` frame comes).
        A thread that is not asleep needs no wake-up, and its peer's send wakes no one: on the
        16-core host a round trip over a lane takes 22-25 µs with both ends spinning, 71-73 with both
        asleep (``bench/control_floor.py``). True: something turned ready."""
        sock = self._sock
        checks = 0
        try:
            while checks < SPIN_CHECKS:
                checks += 1
                if self.handed_over or self._queued or sock.getsockopt(_EVENTS) & _POLLIN or self._ready(0.0):
                    return True
                if time.monotonic() >= deadline:
                    return False
            return False
        finally:
            self.spin_checks += checks

    def _ready(self, timeout: float) -> set[int]:
        """Wait up to ``timeout`` for descriptors to turn ready (readable, or writable for a lane
        with output pending); the ready ones."""
        watched = self._watched
        reads = [self._fd, *self.lanes.fds(), *watched] if self.lanes is not None else [self._fd, *watched]
        writes = self.lanes.wants_write() if self.lanes is not None else []
        if max(reads) < FD_SETSIZE:
            r, w, _ = select.select(reads, writes, [], timeout)
            ready = {*r, *w}
        else:  # select() cannot watch descriptors this high; the millisecond poll can
            if self.lanes is not None:
                self._sync_lanes(self.lanes)
            events = self._poller.poll(math.ceil(timeout * 1000))
            ready = {fd if isinstance(fd, int) else self._fd for fd, _ in events}
        for fd in watched:
            if fd in ready:
                self._hits.add(fd)
        return ready

    def waker(self, frame: bytes = WAKE) -> Waker:
        """What another thread calls to end this inbox's wait (``frame``: what the reader sees)."""
        return Waker(self._ctx, self.wake_address, frame, self)

    def drain(self, limit: int) -> list[list[bytes]]:
        """Up to ``limit`` messages already queued, without waiting (lanes are read by ``recv``)."""
        out: list[list[bytes]] = []
        while self._queued and len(out) < limit:
            out.append(self._queued.popleft())
        sock = self._sock
        for _ in range(limit - len(out)):
            if not sock.getsockopt(_EVENTS) & _POLLIN:  # cheaper than the ``zmq.Again`` raised
                break
            try:
                out.append(sock.recv_multipart(flags=zmq.NOBLOCK))
            except zmq.Again:
                break
        return out

    def close(self) -> None:
        self._sock.close(linger=0)
        if self.lanes is not None:
            self.lanes.close()


class Waker:
    """Ends a reader's wait from any thread: ``frame`` through the calling thread's own PUSH socket
    to the reader's ``inproc://`` address, made on first use (zmq sockets are not thread-safe; the
    context's ``destroy`` closes them). A full queue drops the frame: the reader is awake anyway.

    With the reader's ``Inbox`` (``inbox``), the frame goes only to a reader that sleeps: the call
    first records the hand-off, then reads ``sleeping``; the reader sets ``sleeping``, then reads the
    record (``Inbox._asleep``) — in that order on both sides (the GIL orders them), one of the two
    always sees the other, so no hand-off is left waiting for a wake-up that never comes."""

    def __init__(self, ctx: zmq.Context, address: str, frame: bytes = WAKE, inbox: Inbox | None = None):
        self._ctx, self._address, self._frame = ctx, address, frame
        self._local = threading.local()
        self._inbox = inbox

    def __call__(self) -> None:
        inbox = self._inbox
        if inbox is not None:
            inbox.handed_over = True
            if not inbox.sleeping:
                return
        with contextlib.suppress(zmq.ZMQError):  # also a context already destroyed (shutting down)
            sock = getattr(self._local, "sock", None)
            if sock is None:
                sock = self._ctx.socket(zmq.PUSH)
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.SNDHWM, WAKE_HWM)
                sock.connect(self._address)
                self._local.sock = sock
            sock.send(self._frame, flags=zmq.NOBLOCK)


class Pushers:
    """PUSH sockets to peers' inboxes, one per address, created on first use; a peer's direct lane
    instead, while it has one.

    The sockets are bounded by the peers: ``keep`` says which addresses are paired peers (the role
    sets it), at most ``STRANGER_SOCKETS`` others are open at once (the oldest is closed for a new
    one) and at most ``MAX_SOCKETS`` in all, so messages naming a thousand addresses cannot exhaust
    the process's descriptors or ZMQ's sockets. A send never raises: a ZMQ error (a full queue, no
    socket to be had) is a dropped message, counted by reason."""

    def __init__(self, ctx: zmq.Context, lanes: Lanes | None = None):
        self._ctx = ctx
        self._socks: dict[str, zmq.Socket] = {}
        self.lanes = lanes
        if lanes is not None:
            lanes.fallback = self._zmq_send
        self._dropped = 0
        self.seal: Callable[[str, list[bytes]], list[bytes]] | None = None
        """Adds the seal of the peer's pairing to each message (``peerauth.PeerAuth.seal``)."""
        self.drops: dict[str, int] = {}
        """Dropped messages by reason (``queue_full``, ``no_socket``, ``send_error``)."""
        self.evicted = 0
        """Sockets to non-peers closed to make room for another."""
        self._throttle = LogThrottle()
        self.keep: Callable[[str], bool] = _nobody
        """Whether an address is a paired peer, whose socket is never closed to make room."""
        self.last_send = 0.0
        """``time.monotonic()`` of the latest send (the role worker spins a while after one)."""

    @property
    def dropped(self) -> int:
        return self._dropped + (self.lanes.dropped if self.lanes is not None else 0)

    @property
    def open_sockets(self) -> int:
        return len(self._socks)

    def send(self, address: str, frames: list[bytes], unsealed: bool = False) -> bool:
        """Queue ``frames`` for ``address`` without blocking; False (and counted) when the queue is full.
        ``unsealed``: without the pairing's seal (a registration attempt, which proves itself).

        Frames are copied (pyzmq's default): control frames are small, and zero-copy sends hand each
        buffer's release to pyzmq's garbage-collector thread, which then contends for the GIL with
        this worker — measured at up to 2.7 ms (median) per status frame on a 2-core host."""
        self.last_send = time.monotonic()
        if self.seal is not None and not unsealed:
            frames = self.seal(address, frames)
        if self.lanes is not None:
            on_lane = self.lanes.send(address, frames)
            if on_lane is not None:
                return on_lane
        return self._zmq_send(address, frames)

    def corked(self) -> _Corked:
        """Messages sent inside go out together at the end, one write per lane (ZMQ batches its own);
        nested use is the outermost's."""
        return _Corked(self.lanes)

    def _zmq_send(self, address: str, frames: list[bytes]) -> bool:
        sock = self._socks.get(address)
        if sock is None:
            sock = self._open(address)
            if sock is None:
                return self._drop("no_socket", address)
        try:
            sock.send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.Again:
            return self._drop("queue_full", address)
        except zmq.ZMQError:
            return self._drop("send_error", address)
        return True

    def _open(self, address: str) -> zmq.Socket | None:
        """A new socket to ``address`` within the bounds, or None (no room, or ZMQ refused one)."""
        if not self.keep(address):
            strangers = [a for a in self._socks if not self.keep(a)]
            excess = len(strangers) - STRANGER_SOCKETS + 1
            for old in strangers[:excess] if excess > 0 else []:
                self.evicted += 1
                self._socks.pop(old).close(linger=0)
        if len(self._socks) >= MAX_SOCKETS:
            return None
        try:
            sock = self._ctx.socket(zmq.PUSH)
        except zmq.ZMQError:
            return None
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, HWM)
            sock.connect(address)
        except zmq.ZMQError:
            sock.close(linger=0)
            return None
        self._socks[address] = sock
        return sock

    def _drop(self, reason: str, address: str) -> bool:
        self._dropped += 1
        self.drops[reason] = self.drops.get(reason, 0) + 1
        held = self._throttle.allow(f"{reason} {address}")
        if held >= 0:
            log.warning("control: message to %s dropped (%s; %d more held back)", address, reason, held)
        return False

    def forget(self, address: str) -> None:
        """Drop the socket and lane (a replaced peer): queued messages for the old process are discarded."""
        if self.lanes is not None:
            self.lanes.forget(address)
        sock = self._socks.pop(address, None)
        if sock is not None:
            sock.close(linger=0)

    def close(self) -> None:
        """Close every socket and drop the worker's hooks: whatever outlives the sockets (the runtime,
        a lane's fallback) must not keep the worker, and with it an engine's mapped pools, alive."""
        for address in list(self._socks):
            self.forget(address)
        self.seal = None
        self.keep = _nobody


class LogThrottle:
    """Repeated warnings of one kind from one source: the first is logged, then at most one per
    ``interval`` seconds saying how many were held back; every one is still counted by the caller.
    At most ``max_keys`` sources are tracked (then forgotten all at once: a flood of new sources
    logs again, at most ``max_keys`` lines per ``interval``)."""

    def __init__(self, interval: float = 10.0, max_keys: int = 1024):
        self.interval, self.max_keys = interval, max_keys
        self._seen: dict[str, tuple[float, int]] = {}

    def allow(self, key: str) -> int:
        """-1: hold this one back; else log it, adding that this many were held back before it."""
        now = time.monotonic()
        last = self._seen.get(key)
        if last is not None and now - last[0] < self.interval:
            self._seen[key] = (last[0], last[1] + 1)
            return -1
        if last is None and len(self._seen) >= self.max_keys:
            self._seen.clear()
        self._seen[key] = (now, 0)
        return last[1] if last is not None else 0


def _nobody(address: str) -> bool:
    return False


class _Corked:
    """``Pushers.corked``'s context: a plain class, cheaper per turn than a generator's."""

    __slots__ = ("lanes", "mine")

    def __init__(self, lanes: Lanes | None):
        self.lanes = lanes
        self.mine = False

    def __enter__(self) -> None:
        lanes = self.lanes
        if lanes is not None and not lanes.corked:
            lanes.corked = self.mine = True

    def __exit__(self, *exc: object) -> None:
        if self.mine and self.lanes is not None:
            self.mine = False
            self.lanes.uncork()
