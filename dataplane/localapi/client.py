"""The engine's side of the local API: ``AgentClient``, the small library a serving engine embeds.

Standard library, msgspec and numpy only (no torch: host pools are plain shared memory). No threads:
the caller's own thread writes requests and reads whatever the agent pushed, so a request costs one
socket write and a poll one ``select`` — no thread hand-offs on the hot path.

- ``send`` / ``expect`` / ``abort`` are one write each; a refusal (an index outside its pool, say)
  comes back as an ``Error`` naming the room, which then reads as Failed with that reason. With
  ``ack=True`` the call waits for the agent's answer and raises ``LocalApiError`` instead.
- ``poll`` reads the room states the agent pushed; ``wait`` blocks on the socket until the room
  finishes; ``wait_change`` is an engine loop's idle.

Every call is bounded by ``timeout``; registration (``Hello`` and the pools) by ``register_timeout``,
as the agent maps every region first (opening a GPU pool's CUDA IPC handles starts its CUDA context,
seconds on a large GPU). When the agent is down a call fails at once with
``AgentUnavailable`` (a ``ConnectionError``), so the engine keeps serving what needs no transfer; the
next call after ``reconnect_interval`` tries again, and reconnecting re-sends ``Hello`` and the pools
registered before, so an agent restart needs nothing from the engine. Rooms in flight when the agent
died read as Failed with reason ``agent disconnected: …``. Calls are serialised by a lock, so one
client may be shared by threads.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import select
import socket
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import AgentUnavailable, DeadlineExceeded, LocalApiError, PDPairError
from .messages import (
    LOCALAPI_VERSION,
    Abort,
    AgentMessage,
    Error,
    Expect,
    Hello,
    Poll,
    PoolRegion,
    RegisterPools,
    RoomState,
    RoomStates,
    Send,
    Welcome,
    decode_agent_message,
    encode_message,
    pack_indices,
)
from .stream import DEFAULT_MAX_FRAME, Closed, FrameReader, send_frame

FAILED, SUCCESS = 0, 4
KEEP_FINISHED = 65536
"""Rooms whose state the client remembers (oldest forgotten first)."""

Indices = Sequence[int] | np.ndarray | None


class AgentClient:
    def __init__(
        self,
        socket_path: str,
        *,
        role: str,
        manifest: bytes,
        engine_id: str = "",
        timeout: float = 5.0,
        register_timeout: float = 60.0,
        reconnect_interval: float = 0.5,
        max_frame: int = DEFAULT_MAX_FRAME,
        tp_rank: int = 0,
        tp_size: int = 1,
        dp_size: int = 1,
    ):
        """``tp_rank`` / ``tp_size`` / ``dp_size``: which scheduler process of the engine this is, as
        sglang counts them (one client per rank, all on the one agent socket of the pod)."""
        self.socket_path, self.role, self.manifest = socket_path, role, manifest
        self.tp_rank, self.tp_size, self.dp_size = tp_rank, tp_size, dp_size
        self.engine_id = engine_id or f"{role}-engine-{os.getpid()}"
        self.timeout, self.reconnect_interval, self.max_frame = timeout, reconnect_interval, max_frame
        self.register_timeout = max(timeout, register_timeout)
        self.agent_id = ""
        self.connections = 0
        """Successful handshakes (each after the first is a reconnect that re-registered the pools)."""
        self.version = 0
        """Bumped by every room state or incoming room that arrives (for ``wait_change``)."""
        self.polls = 0
        """``wait_change``'s looks without sleeping."""
        self.blocking_waits = 0
        """``wait_change``'s waits that slept until something arrived or the time was up."""
        self._sock: socket.socket | None = None
        self._reader: FrameReader | None = None
        self._lock = threading.RLock()
        self._seq = itertools.count(1)
        self._states: OrderedDict[int, RoomState] = OrderedDict()
        self._mine: OrderedDict[int, None] = OrderedDict()
        self._incoming: deque[RoomState] = deque(maxlen=4096)
        self._failed_unsent: OrderedDict[int, str] = OrderedDict()
        self._pools: tuple[tuple[PoolRegion, ...], list[int]] | None = None
        self._last_attempt = -1e9
        self._last_error = "never connected"
        self._closed = False

    # ---- connection ---------------------------------------------------------------------------
    @property
    def connected(self) -> bool:
        return self._sock is not None

    def connect(self) -> AgentClient:
        """Connect now (raises ``AgentUnavailable``); later calls reconnect by themselves."""
        self._last_attempt = -1e9
        self.ensure_connected()
        return self

    def ensure_connected(self) -> None:
        """Reconnect (and re-register) if the agent is reachable again; ``AgentUnavailable`` if not.
        Tries at most once per ``reconnect_interval``."""
        with self._lock:
            if self._sock is not None:
                return
            if self._closed:
                raise AgentUnavailable("client is closed")
            now = time.monotonic()
            if now - self._last_attempt < self.reconnect_interval:
                raise self._unavailable()
            self._last_attempt = now
            self._open()

    def _open(self) -> None:
        """Connect, handshake and re-register the pools (caller holds the lock)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError as exc:
            sock.close()
            self._last_error = f"cannot connect: {exc.strerror or exc}"
            raise self._unavailable() from exc
        self._sock, self._reader = sock, FrameReader(sock, self.max_frame)
        try:
            hello = Hello(
                version=LOCALAPI_VERSION, role=self.role,  # type: ignore[arg-type]
                engine_id=self.engine_id, manifest=self.manifest, pid=os.getpid(),
                tp_rank=self.tp_rank, tp_size=self.tp_size, dp_size=self.dp_size,
            )
            welcome = self._request(hello, bound=self.register_timeout)
            assert isinstance(welcome, Welcome)
            self.agent_id = welcome.agent_id
            if self._pools is not None:
                pools = RegisterPools(regions=self._pools[0])
                self._request(pools, self._pools[1], bound=self.register_timeout)
            self.connections += 1
        except PDPairError as exc:
            self._drop(str(exc))
            raise

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._drop("client closed")

    def __enter__(self) -> AgentClient:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- requests -----------------------------------------------------------------------------
    def register_pools(self, regions: Sequence[PoolRegion], fds: Sequence[int] = ()) -> None:
        """Hand the agent every region of the schema (canonical order); remembered for reconnects."""
        with self._lock:
            self._pools = (tuple(regions), list(fds))
            if self._sock is None:
                self.ensure_connected()  # connecting registers the pools
                return
            self._request(RegisterPools(regions=self._pools[0]), self._pools[1], bound=self.register_timeout)

    def send(
        self, room: int, kv: Indices, aux: int | None = None, state: Sequence[Indices] = (),
        *, ack: bool = False,
    ) -> None:
        """Prefill: room's state is ready in these source items; the agent writes it to decode."""
        msg = Send(room=room, kv=pack_indices(kv), aux=-1 if aux is None else aux,
                   state=tuple(pack_indices(s) for s in state), ack=ack)
        self._submit(room, msg)

    def expect(
        self, room: int, kv: Indices, aux: int | None = None, state: Sequence[Indices] = (),
        prefix_len: int = 0, *, ack: bool = False, bootstrap_addr: str = "",
    ) -> None:
        """Decode: receive room into these destination items; ``prefix_len`` tokens are cached;
        ``bootstrap_addr`` (``host:port``) names the prefill to receive from ("": the agent's own)."""
        msg = Expect(room=room, kv=pack_indices(kv), aux=-1 if aux is None else aux,
                     state=tuple(pack_indices(s) for s in state), prefix_len=prefix_len, ack=ack,
                     bootstrap_addr=bootstrap_addr)
        self._submit(room, msg)

    def abort(self, room: int, reason: str = "", *, ack: bool = False) -> None:
        with self._lock:
            self.ensure_connected()
            self._request(Abort(room=room, reason=reason, ack=ack), reply=ack)

    def poll_remote(self, rooms: Sequence[int]) -> list[RoomState]:
        """Ask the agent (one round trip); ``poll`` is the cheap local read."""
        with self._lock:
            self.ensure_connected()
            reply = self._request(Poll(rooms=tuple(rooms)))
        assert isinstance(reply, RoomStates)
        return list(reply.states)

    def poll(self, room: int) -> tuple[int, str]:
        """(KVPoll value, failure reason); Bootstrapping (1) until the agent says otherwise."""
        return self.poll_many((room,))[0]

    def poll_many(self, rooms: Sequence[int]) -> list[tuple[int, str]]:
        """``poll`` of every room in ``rooms``, reading the socket once."""
        with self._lock:
            self._pump(0.0)
            got = [self._states.get(room) for room in rooms]
        return [(st.state, st.reason) if st is not None else (1, "") for st in got]

    def wait(self, room: int, timeout: float) -> tuple[int, str]:
        """Block until ``room`` is Success or Failed; ``DeadlineExceeded`` after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                self._pump(0.0)
                st = self._states.get(room)
                if st is not None and st.state in (FAILED, SUCCESS):
                    return st.state, st.reason
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DeadlineExceeded(f"room {room} not finished after {timeout:.3f}s")
                if self._sock is None:
                    time.sleep(min(left, 0.01))
                self._pump(left)

    def wait_change(self, since: int, timeout: float, poll: float = 0.0) -> None:
        """Block until ``version`` moved past ``since`` (something arrived) or ``timeout``; for the
        first ``poll`` seconds look without sleeping, as a serving engine's busy scheduler loop does
        (the agent's push then needs no wake-up of this process)."""
        now = time.monotonic()
        deadline, busy = now + timeout, now + min(poll, timeout)
        with self._lock:
            while self.version == since and (left := deadline - (now := time.monotonic())) > 0:
                if self._sock is None:
                    time.sleep(min(left, 0.01))
                    return
                if now < busy:
                    self.polls += 1
                    self._pump(0.0)
                else:
                    self.blocking_waits += 1
                    self._pump(left)

    def forget(self, room: int) -> None:
        with self._lock:
            self._states.pop(room, None)
            self._mine.pop(room, None)
            self._failed_unsent.pop(room, None)

    def failed_unsent(self, room: int) -> str | None:
        """Prefill: the reason the agent failed ``room`` before this engine sent it (decode aborted,
        say), or None."""
        with self._lock:
            self._pump(0.0)
            return self._failed_unsent.get(room)

    def take_incoming(self) -> list[RoomState]:
        """Prefill: rooms decode asked for that this engine has not sent yet (with item counts)."""
        with self._lock:
            self._pump(0.0)
            out = list(self._incoming)
            self._incoming.clear()
        return out

    # ---- plumbing -----------------------------------------------------------------------------
    def _submit(self, room: int, msg: Send | Expect) -> None:
        with self._lock:
            self.ensure_connected()
            self._mine[room] = None
            self._states.pop(room, None)
            while len(self._mine) > KEEP_FINISHED:
                self._states.pop(self._mine.popitem(last=False)[0], None)
            self._request(msg, reply=msg.ack)

    def _unavailable(self) -> AgentUnavailable:
        return AgentUnavailable(f"agent at {self.socket_path} unavailable: {self._last_error}")

    def _request(
        self, msg: Any, fds: Sequence[int] = (), reply: bool = True, bound: float | None = None
    ) -> AgentMessage | None:
        """Write ``msg`` (with a fresh ``seq``) and, if ``reply``, read until its answer, at most
        ``bound`` seconds (default ``timeout``; caller holds the lock and is connected)."""
        sock = self._sock
        if sock is None:
            raise self._unavailable()
        seq = next(self._seq)
        try:
            send_frame(sock, encode_message(_with_seq(msg, seq)), fds)
        except OSError as exc:
            self._drop(f"send failed: {exc}")
            raise self._unavailable() from exc
        if not reply:
            return None
        wait = self.timeout if bound is None else bound
        deadline = time.monotonic() + wait
        while self._sock is sock:
            answer = self._read(deadline - time.monotonic(), wait)
            if answer is None:
                continue
            if getattr(answer, "seq", 0) == seq and not isinstance(answer, RoomState):
                if isinstance(answer, Error):
                    raise LocalApiError(answer.code, answer.message)
                return answer
        raise self._unavailable()

    def _pump(self, timeout: float) -> None:
        """Take in everything the agent has sent (waiting up to ``timeout`` for the first frame)."""
        while self._sock is not None and self._reader is not None:
            if not self._reader.whole() and not select.select([self._sock], [], [], max(0.0, timeout))[0]:
                return
            self._read(self.timeout)
            timeout = 0.0

    def _read(self, timeout: float, bound: float | None = None) -> AgentMessage | None:
        """One frame from the agent, applied; drops the connection on timeout (named as ``bound``),
        EOF or garbage."""
        sock, reader = self._sock, self._reader
        if sock is None or reader is None:
            return None
        bound = self.timeout if bound is None else bound
        if timeout <= 0:
            self._drop(f"no answer within {bound:.1f}s")
            return None
        try:
            sock.settimeout(timeout)
            msg = decode_agent_message(reader.read())
        except (Closed, OSError, PDPairError) as exc:
            no_answer = isinstance(exc, TimeoutError)
            self._drop(f"no answer within {bound:.1f}s" if no_answer else f"connection lost: {exc}")
            return None
        self._apply(msg)
        return msg

    def _apply(self, msg: AgentMessage) -> None:
        if isinstance(msg, Error) and msg.room >= 0 and msg.room in self._mine:
            msg = RoomState(room=msg.room, state=FAILED, reason=f"{msg.code}: {msg.message}")
        if not isinstance(msg, RoomState):
            return
        self.version += 1
        if msg.room in self._mine:
            self._states[msg.room] = msg
        elif self.role == "prefill" and msg.state == 2:
            self._incoming.append(msg)
        elif self.role == "prefill" and msg.state == FAILED:
            self._failed_unsent[msg.room] = msg.reason
            while len(self._failed_unsent) > KEEP_FINISHED:
                self._failed_unsent.popitem(last=False)

    def _drop(self, reason: str) -> None:
        """Forget the connection and fail every room still in flight (caller holds the lock)."""
        sock, self._sock, self._reader = self._sock, None, None
        if sock is None:
            return
        self._last_error = reason
        for room in self._mine:
            st = self._states.get(room)
            if st is None or st.state not in (FAILED, SUCCESS):
                lost = RoomState(room=room, state=FAILED, reason=f"agent disconnected: {reason}")
                self._states[room] = lost
        self.version += 1
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()


def _with_seq(msg: Any, seq: int) -> Any:
    import msgspec

    return msgspec.structs.replace(msg, seq=seq)
