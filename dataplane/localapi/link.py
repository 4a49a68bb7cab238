"""The hand-off between the local-API connection thread and the agent's role-worker thread.

The connection thread validates an engine request and ``submit``s it; the worker thread (the only one
allowed to touch the transport) ``drain``s commands on its loop and ``report``s room states back,
which are kept for ``Poll`` and pushed to the engine by ``flush``: one socket write for every state
not yet pushed, the latest per room (states only move forward, so an engine never misses a terminal
state). The worker decides when (``sources.EngineSide.flush``). Bootstrapping is never pushed: it is
what the client assumes of a room it has not heard about. ``submit`` wakes the worker — once per batch
of commands, not per command — through the inbox's ``control.Waker``: a one-frame ``WAKE`` into its
``inproc://`` address when the worker sleeps, so a request never waits out its idle sleep; an awake
worker gets no frame and drains the link in its next turn (prefill's ``tick``, decode's ``generate``
drain every turn).
Once the engine's connection is lent to the worker (``lend``), the worker reads the requests itself
and ``queue``s them: no other thread, no wake-up.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .messages import RoomState

if TYPE_CHECKING:
    from .server import Session

KEEP_STATES = 65536
BOOTSTRAPPING = 1
Push = Callable[[Sequence[RoomState]], None]


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
    bootstrap: str = ""
    """The prefill's bootstrap address, normalised (``agent.prefills.bootstrap_address``); "": the
    configured one."""


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


def _no_worker() -> None:
    """No worker attached yet: its first turn drains whatever was submitted."""


class EngineLink:
    """Commands in (any thread → worker), room states out (worker → engine)."""

    def __init__(self, push: Push | None = None):
        self._commands: deque[Command] = deque()
        self._states: OrderedDict[int, RoomState] = OrderedDict()
        self._outbox: dict[int, RoomState] = {}
        self._lock = threading.Lock()
        self._push = push
        self._wake_pending = False
        self._wake: Callable[[], None] = _no_worker
        self.session: Session | None = None
        """The engine's connection while it is lent to the worker."""
        self.since = 0.0
        """``time.monotonic()`` when the oldest state not yet pushed was reported."""

    def attach(self, wake: Callable[[], None]) -> None:
        """Called by the worker: how ``submit`` wakes it (its ``Inbox.waker()``)."""
        self._wake = wake

    def set_push(self, push: Push | None) -> None:
        self._push = push

    def submit(self, cmd: Command) -> None:
        """Queue ``cmd``; wake the worker unless a wake-up it has not yet acted on is pending
        (``drain`` clears the flag before taking the queue, so no command is left behind)."""
        self._commands.append(cmd)
        if not self._wake_pending:
            self._wake_pending = True
            self._wake()

    def queue(self, cmd: Command) -> None:
        """``submit`` from the worker itself (it reads a lent connection): no wake-up needed."""
        self._commands.append(cmd)

    def lend(self, session: Session) -> None:
        """Give the worker the engine's connection; it sets ``session.returned`` when done with it."""
        self.session = session
        self._wake_pending = True
        self._wake()

    def drain(self) -> list[Command]:
        self._wake_pending = False
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
        if st.state != BOOTSTRAPPING:
            if not self._outbox:
                self.since = time.monotonic()
            self._outbox.pop(room, None)
            self._outbox[room] = st

    def pending(self) -> bool:
        """Whether a state waits to be pushed."""
        return bool(self._outbox)

    def unpushed(self) -> list[RoomState]:
        """The states ``flush`` would push now (the oldest was reported at ``since``)."""
        return list(self._outbox.values())

    def flush(self) -> list[RoomState]:
        """Push the states reported since the last flush (worker thread); the states pushed."""
        if not self._outbox:
            return []
        states = list(self._outbox.values())
        self._outbox.clear()
        push = self._push
        if push is None:
            return []
        push(states)
        return states

    def state(self, room: int) -> RoomState:
        with self._lock:
            st = self._states.get(room)
        return st if st is not None else RoomState(room=room, state=1)
