"""The hand-off between the local-API connection thread and the agent's role-worker thread.

The connection thread validates an engine request and ``submit``s it; the worker thread (the only one
allowed to touch the transport) ``drain``s commands on its loop and ``report``s room states back,
which are pushed to the engine and kept for ``Poll``. ``submit`` wakes the worker at once by pushing a
one-frame ``WAKE`` message into its ZMQ inbox, so a request never waits out the worker's idle sleep.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import zmq

from .messages import RoomState

WAKE = b"PDPAIR-LOCALAPI-WAKE"
KEEP_STATES = 65536


@dataclass(frozen=True)
class SendCmd:
    room: int
    kv: np.ndarray
    aux: int | None
    state: tuple[np.ndarray | None, ...]


@dataclass(frozen=True)
class ExpectCmd:
    room: int
    kv: np.ndarray
    aux: int | None
    state: tuple[np.ndarray | None, ...]
    prefix_len: int = 0


@dataclass(frozen=True)
class AbortCmd:
    room: int
    reason: str


@dataclass(frozen=True)
class DetachCmd:
    """The engine went away: fail every room with ``reason``, then set ``done``."""

    reason: str
    done: threading.Event = field(default_factory=threading.Event)


Command = SendCmd | ExpectCmd | AbortCmd | DetachCmd


class EngineLink:
    """Commands in (any thread → worker), room states out (worker → engine)."""

    def __init__(self, push: Callable[[RoomState], None] | None = None):
        self._commands: deque[Command] = deque()
        self._states: OrderedDict[int, RoomState] = OrderedDict()
        self._lock = threading.Lock()
        self._push = push
        self._wake_address = ""
        self._ctx: zmq.Context | None = None
        self._local = threading.local()

    def attach(self, ctx: zmq.Context, inbox_address: str) -> None:
        """Called by the worker: where ``submit`` sends its wake-up frame."""
        self._ctx, self._wake_address = ctx, inbox_address

    def set_push(self, push: Callable[[RoomState], None] | None) -> None:
        self._push = push

    def submit(self, cmd: Command) -> None:
        self._commands.append(cmd)
        self._wake()

    def _wake(self) -> None:
        if self._ctx is None:
            return
        sock = getattr(self._local, "sock", None)
        if sock is None or self._local.address != self._wake_address:
            sock = self._ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 16)
            sock.connect(self._wake_address)
            self._local.sock, self._local.address = sock, self._wake_address
        with contextlib.suppress(zmq.ZMQError):  # a full wake queue: the worker has work queued already
            sock.send(WAKE, flags=zmq.NOBLOCK)

    def drain(self) -> list[Command]:
        out = []
        while self._commands:
            out.append(self._commands.popleft())
        return out

    def report(self, room: int, state: int, reason: str = "", **counts: object) -> None:
        st = RoomState(room=room, state=int(state), reason=reason[:4096], **counts)  # type: ignore[arg-type]
        with self._lock:
            self._states[room] = st
            self._states.move_to_end(room)
            while len(self._states) > KEEP_STATES:
                self._states.popitem(last=False)
        push = self._push
        if push is not None:
            push(st)

    def state(self, room: int) -> RoomState:
        with self._lock:
            st = self._states.get(room)
        return st if st is not None else RoomState(room=room, state=1)

    def close_thread_socket(self) -> None:
        """Close this thread's wake socket (a connection thread ending)."""
        sock = getattr(self._local, "sock", None)
        if sock is not None:
            sock.close(linger=0)
            self._local.sock = None
