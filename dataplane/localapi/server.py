"""The agent's side of the local API: a Unix-socket listener for the engine's ranks, one connection each.

The socket lives in a directory the engine's and the agent's containers share (an ``emptyDir``).
A connection must start with ``Hello``; then ``RegisterPools`` (with descriptors), then any number of
``Send`` / ``Expect`` / ``Poll`` / ``Abort``. ``Hello``, ``RegisterPools`` and ``Poll`` are answered;
``Send`` / ``Expect`` / ``Abort`` only when they fail (an ``Error`` naming the room) or ask (``ack``).
Room states are pushed from the worker thread with bounded non-blocking writes, so an engine that
stops reading loses its connection and never stalls the agent's worker. A malformed message gets
``Error(code="malformed")`` and the connection stays usable; an oversized frame gets
``Error(code="frame_too_large")`` and the connection closes (the stream cannot be resynchronised).

An engine with TP N runs N scheduler processes; each connects on its own and names its rank in
``Hello``. An ``EngineRouter`` gives each rank its handler (``sidecar.SidecarPod``: one agent
runtime per rank): a second connection for a rank already connected gets ``Error(code="busy")``
naming the rank, a rank the agent does not serve gets ``Error(code="bad_request")``, and either way
the connection closes. At most ``max_connections`` connections are open at once (``busy`` beyond).

Only the engine may connect: the socket file admits its owner only (mode 0600; 0660 with a configured
group), and each connection's peer credentials (``SO_PEERCRED``) must name an allowed uid (the
agent's own by default, ``localapi.engine.allowedUids`` otherwise); any other process gets
``Error(code="forbidden")`` naming its uid and the setting, and is counted (``refused``).

Index checks happen here, before the worker sees a request: every index must be inside its pool, so
nothing can be written outside the engine's registered regions. What the requests *do* is the
``EngineHandler``'s business (``sidecar.Sidecar``).

Once the pools are registered the connection thread *lends* the connection to the agent's worker
(``Session``): the worker waits on the socket in its own ``select`` and reads the requests itself, so a
request costs no hand-off and wake-up between two threads (28-45 µs each on the H200 host:
``bench/room_trace.py --sidecar``, docs/sidecar.md). The worker gives the connection back at the end of
the stream, at an oversized frame, or at a message only the connection thread handles.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol, cast

from ..agent.prefills import bootstrap_address
from ..errors import BadInput, FrameTooLarge, LocalApiError, PDPairError
from ..schema import RoleSchema
from .link import AbortCmd, Command, ExpectCmd, SendCmd
from .messages import (
    Abort,
    Ack,
    AgentMessage,
    EngineMessage,
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
    decode_engine_message,
    encode_message,
    unpack_indices,
)
from .stream import DEFAULT_MAX_FRAME, HEADER, Closed, FrameReader, send_frame

log = logging.getLogger(__name__)
SEND_DEADLINE = 2.0
PUMP_READS = 2
"""Reads one ``Session.pump`` makes at most (each up to ``frames.READ_CHUNK``): a flood of requests
cannot keep the worker from its other work; what is left is read in its next turn."""
WORKER_REQUESTS = (Send, Expect, Abort, Poll)
MAX_UNIX_PATH = 107
"""Longest path a Unix socket address holds (Linux: 108 bytes with the terminating NUL)."""
_UCRED = struct.Struct("3i")
"""``struct ucred``: pid, uid, gid."""
Submit = Callable[[Command], None]


class EngineHandler(Protocol):
    @property
    def schema(self) -> RoleSchema:
        """What requests are checked against (``LocalApiError`` before the schema is known)."""

    def hello(self, msg: Hello) -> str: ...
    def register(self, regions: Sequence[PoolRegion], fds: list[int]) -> None: ...
    def submit(self, cmd: Command) -> None: ...
    def state(self, room: int) -> RoomState: ...
    def connected(self, push: _Connection) -> None: ...
    def disconnected(self, reason: str) -> None: ...
    def lend(self, session: Session) -> bool:
        """Hand ``session`` to the worker (which sets ``session.returned`` when done with it); False:
        the connection thread keeps reading it."""


class EngineRouter(Protocol):
    """Which handler serves the engine rank a ``Hello`` names."""

    def route(self, msg: Hello, current: EngineHandler | None) -> EngineHandler:
        """Claim ``msg``'s rank for this connection (which held ``current``, None: none yet);
        ``LocalApiError`` (``busy``, ``bad_request``) when it cannot have it."""

    def release(self, handler: EngineHandler) -> None:
        """The connection that claimed ``handler`` is gone."""


class OneEngine:
    """The router of an agent that serves one engine connection, whatever rank it names."""

    def __init__(self, handler: EngineHandler):
        self.handler = handler
        self._lock = threading.Lock()
        self._taken = False

    def route(self, msg: Hello, current: EngineHandler | None) -> EngineHandler:
        with self._lock:
            if current is None and self._taken:
                raise LocalApiError("busy", "another engine is connected")
            self._taken = True
        return self.handler

    def release(self, handler: EngineHandler) -> None:
        with self._lock:
            self._taken = False


def to_command(msg: Send | Expect, schema: RoleSchema) -> SendCmd | ExpectCmd:
    """Unpack and bounds-check a request's indices against the schema's pools."""
    kv = unpack_indices(msg.kv, field="kv", limit=schema.kv.num_pages)
    if len(msg.state) > len(schema.components):
        raise BadInput(f"{len(msg.state)} state components given; the schema has {len(schema.components)}")
    state = []
    for comp, packed in zip(schema.components, msg.state, strict=False):
        idx = unpack_indices(packed, field=comp.name, limit=comp.num_items)
        state.append(idx if idx.size else None)
    aux = None if msg.aux < 0 else msg.aux
    if aux is not None and aux >= schema.aux.num_items:
        raise BadInput(f"aux: item index {aux} outside the pool's 0..{schema.aux.num_items - 1}")
    if isinstance(msg, Send):
        return SendCmd(msg.room, kv, aux, tuple(state))
    bootstrap = bootstrap_address(msg.bootstrap_addr) if msg.bootstrap_addr else ""
    return ExpectCmd(msg.room, kv, aux, tuple(state), msg.prefix_len, bootstrap)


def _framed(msg: AgentMessage) -> bytes:
    payload = encode_message(msg)
    return HEADER.pack(len(payload)) + payload


class _Connection:
    """One engine connection. Replies (connection thread) and room-state pushes (worker thread) are
    written under one lock with non-blocking sends bounded by ``SEND_DEADLINE``: an engine that stops
    reading loses its connection instead of stalling the agent's worker."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.lock = threading.Lock()
        self.closed = False

    def reply(self, msg: AgentMessage) -> None:
        self._write(_framed(msg))

    def __call__(self, states: Sequence[RoomState]) -> None:
        """Push room states (from the worker thread), all in one write."""
        try:
            self._write(b"".join(map(_framed, states)))
        except OSError as exc:
            log.error("cannot push room states to the engine (%s); closing its connection", exc)
            self.close()

    def _write(self, frames: bytes) -> None:
        data = memoryview(frames)
        deadline = time.monotonic() + SEND_DEADLINE
        with self.lock:
            if self.closed:
                raise BrokenPipeError("engine connection closed")
            while data:
                try:
                    sent = self.sock.send(data, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    left = deadline - time.monotonic()
                    if left <= 0 or not select.select([], [self.sock], [], left)[1]:
                        raise TimeoutError(f"engine not reading for {SEND_DEADLINE:.0f}s") from None
                    continue
                data = data[sent:]  # not data[send(...):]: mypyc evaluates such a bound twice

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)


class Session:
    """One engine connection's requests: read by the connection thread until the pools are
    registered, then by the worker it is lent to (``pump``), then by the connection thread again once
    the worker sets ``returned`` — one reader at a time, so they share ``reader`` and its buffer.
    ``pending``: a message the worker read but left to the connection thread."""

    def __init__(self, conn: _Connection, reader: FrameReader, router: EngineRouter):
        self.conn, self.reader, self.router = conn, reader, router
        self.handler: EngineHandler | None = None
        """The rank's handler, from the connection's ``Hello`` on."""
        self.fd = conn.sock.fileno()
        self.greeted = False
        self.refused = False
        """The ``Hello`` named a rank this connection may not have: close it after the answer."""
        self.pending: EngineMessage | None = None
        self.returned = threading.Event()

    def pump(self, submit: Submit) -> bool:
        """On the worker: handle every request the engine has written so far; False when the
        connection must go back to its thread (the end of the stream, an oversized frame, a message
        other than ``Send`` / ``Expect`` / ``Abort`` / ``Poll``)."""
        reader = self.reader
        try:
            for _ in range(PUMP_READS):
                while (frame := reader.next()) is not None:
                    try:
                        msg = decode_engine_message(frame)
                    except PDPairError as exc:
                        reader.close_fds()
                        self.conn.reply(Error(code="malformed", message=str(exc)))
                        continue
                    if not isinstance(msg, WORKER_REQUESTS):
                        self.pending = msg
                        return False
                    self.handle(msg, submit)
                if not reader.fill():
                    return True
        except (Closed, OSError, FrameTooLarge) as exc:
            log.debug("engine connection back to its thread: %r", exc)
            return False
        return True

    def handle(self, msg: EngineMessage, submit: Submit) -> bool:
        """Act on one request and answer it where it asks; whether it succeeded."""
        conn, handler, seq = self.conn, self.handler, msg.seq
        try:
            if isinstance(msg, Hello):
                self.greet(msg)
                return True
            if handler is None or not self.greeted:
                raise LocalApiError("no_hello", "the first message on a connection must be Hello")
            if isinstance(msg, RegisterPools):
                handler.register(msg.regions, self.reader.take_fds())
            elif isinstance(msg, Send | Expect):
                submit(to_command(msg, handler.schema))
                if not msg.ack:
                    return True
            elif isinstance(msg, Abort):
                submit(AbortCmd(msg.room, msg.reason))
                if not msg.ack:
                    return True
            elif isinstance(msg, Poll):
                conn.reply(RoomStates(states=tuple(handler.state(r) for r in msg.rooms), seq=seq))
                return True
            conn.reply(Ack(seq=seq))
            return True
        except PDPairError as exc:
            if isinstance(exc, LocalApiError):
                code, text = exc.code, str(exc).split(": ", 1)[-1]
            else:
                code, text = _code(exc), str(exc)
            conn.reply(Error(code=code, message=text, seq=seq, room=getattr(msg, "room", -1)))
            return False
        finally:
            self.reader.close_fds()

    def greet(self, msg: Hello) -> None:
        """Claim the rank ``msg`` names and hand the handshake to its handler (``LocalApiError`` when
        the rank is taken or refused: the connection then closes, ``Refused``)."""
        try:
            handler = self.router.route(msg, self.handler)  # the same one again for a repeated Hello
        except LocalApiError:
            self.refused = True
            raise
        claimed, self.handler = self.handler is None, handler
        try:
            agent_id = handler.hello(msg)
        except BaseException:
            if claimed:
                self.handler = None
                self.router.release(handler)
            raise
        handler.connected(self.conn)
        self.greeted = True
        max_frame = self.reader.max_frame
        self.conn.reply(Welcome(version=msg.version, agent_id=agent_id, max_frame=max_frame, seq=msg.seq))


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket (Linux ``SO_PEERCRED``)."""
    _, uid, _ = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return int(uid)


class LocalApiServer:
    """``handler``: the one engine's handler, or an ``EngineRouter`` giving each rank its own;
    ``allowed_uids``: who may connect (empty: this process's uid); ``group``: the socket file's
    group, which may then also open it (mode 0660; without one, 0600)."""

    def __init__(
        self, socket_path: str, handler: EngineHandler | EngineRouter, max_frame: int = DEFAULT_MAX_FRAME,
        allowed_uids: Sequence[int] = (), group: int | None = None, max_connections: int = 4,
    ):
        self.socket_path, self.max_frame = socket_path, max_frame
        one = not hasattr(handler, "route")
        self.router = OneEngine(cast(EngineHandler, handler)) if one else cast(EngineRouter, handler)
        self.allowed_uids = frozenset(allowed_uids or (os.getuid(),))
        self.group = group
        self.max_connections = max_connections
        self.refused = 0
        """Connections refused for their peer's uid."""
        self._listener: socket.socket | None = None
        self._active: set[_Connection] = set()
        self._active_lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> LocalApiServer:
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # Bound under a private name, given its mode, then moved into place: never reachable wider
        # (a path too long for a suffix is bound in place; the uid check still admits nobody else).
        fits = len(os.fsencode(self.socket_path)) + len(".new") <= MAX_UNIX_PATH
        staging = f"{self.socket_path}.new" if fits else self.socket_path
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staging)
        sock.bind(staging)
        if self.group is not None:
            os.chown(staging, -1, self.group)
        os.chmod(staging, 0o660 if self.group is not None else 0o600)
        if staging != self.socket_path:
            os.replace(staging, self.socket_path)
        sock.listen(4)
        sock.settimeout(0.2)
        self._listener = sock
        t = threading.Thread(target=self._accept_loop, name="pdpair-localapi", daemon=True)
        t.start()
        self._threads.append(t)
        log.info("local API listening on %s", self.socket_path)
        return self

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            sock.settimeout(None)
            uid = peer_uid(sock)
            if uid not in self.allowed_uids:
                self.refuse(sock, uid)
                continue
            with self._active_lock:
                full = len(self._active) >= self.max_connections
                conn = _Connection(sock)
                if not full:
                    self._active.add(conn)
            if full:
                message = f"{self.max_connections} engine connections are open, the most this agent takes"
                with contextlib.suppress(OSError):
                    sock.settimeout(SEND_DEADLINE)
                    send_frame(sock, encode_message(Error(code="busy", message=message)))
                sock.close()
                continue
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
            t = threading.Thread(target=self._serve, args=(conn,), name="pdpair-engine", daemon=True)
            t.start()

    def refuse(self, sock: socket.socket, uid: int) -> None:
        """A process that is not the engine: one clear line to it and to the log (the first of each uid)."""
        self.refused += 1
        allowed = ", ".join(str(u) for u in sorted(self.allowed_uids))
        message = (
            f"uid {uid} may not use this agent's local API (allowed uids: {allowed}); "
            "run the engine as one of them or list its uid in localapi.engine.allowedUids"
        )
        if self.refused == 1 or self.refused & (self.refused - 1) == 0:  # 1st, 2nd, 4th, 8th...
            log.warning("local API: refused a connection (%d so far): %s", self.refused, message)
        with contextlib.suppress(OSError):
            sock.settimeout(SEND_DEADLINE)
            send_frame(sock, encode_message(Error(code="forbidden", message=message)))
        sock.close()

    def _serve(self, conn: _Connection) -> None:
        session = Session(conn, FrameReader(conn.sock, self.max_frame), self.router)
        reason = "engine disconnected"
        try:
            while True:
                msg, session.pending = session.pending, None
                if msg is None:
                    try:
                        msg = decode_engine_message(session.reader.read())
                    except FrameTooLarge as exc:
                        conn.reply(Error(code="frame_too_large", message=str(exc)))
                        reason = f"engine disconnected: {exc}"
                        return
                    except PDPairError as exc:
                        session.reader.close_fds()
                        conn.reply(Error(code="malformed", message=str(exc)))
                        continue
                handler = session.handler
                done = session.handle(msg, handler.submit if handler is not None else _unrouted)
                if session.refused:
                    return
                handler = session.handler
                if done and isinstance(msg, RegisterPools) and handler is not None and handler.lend(session):
                    session.returned.wait()
                    session.returned.clear()
        except Closed:
            pass
        except OSError as exc:
            reason = f"engine connection failed: {exc}"
        finally:
            session.reader.close_fds()
            conn.close()
            conn.sock.close()
            with self._active_lock:
                self._active.discard(conn)
            if session.handler is not None:  # the rank is free again once its runtime is down
                if session.greeted:
                    session.handler.disconnected(reason)
                self.router.release(session.handler)

    def stop(self) -> None:
        self._stop.set()
        if self._listener is not None:
            self._listener.close()
        with self._active_lock:
            active = list(self._active)
        for conn in active:
            conn.close()
        for t in self._threads:
            t.join(timeout=2)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)


def _unrouted(cmd: Command) -> None:
    raise LocalApiError("no_hello", "the first message on a connection must be Hello")


def _code(exc: PDPairError) -> str:
    from ..errors import IncompatiblePeer, SchemaError

    if isinstance(exc, IncompatiblePeer | SchemaError):
        return "incompatible"
    return "bad_request" if isinstance(exc, BadInput) else "failed"
