"""Direct TCP lanes: control frames between two of our agents without ZMQ's I/O threads.

A ZMQ message crosses three threads per hop (the sender's I/O thread, the receiver's I/O thread, the
receiving worker), and each wake-up is a scheduler round trip: on the 16-core benchmark host a PUSH/PULL
round trip is ~0.2 ms, on a plain TCP stream between the two workers themselves a fraction of that
(``bench/control_floor.py``). sglang's protocol needs two hops per request, so this is most of the
agent's per-request latency. ZMQ stays the carrier for plain sglang peers and for everything before
pairing; a lane carries the same multipart frames, once both sides are our agents.

How a lane comes up: prefill's ``Hello`` (sent over ZMQ) carries its lane port and a random token it
remembers for that decode's control address (``invite``). Decode ``dial``s — a non-blocking connect —
and its first frame on the lane is ``[LANE_HELLO, token, its control address]``; prefill adopts the
lane for that address only if the token matches. From then on ``send`` to that address goes over the
lane, in both directions, in order. A lane that breaks is closed and sends fall back to ZMQ (whose
deadlines and heartbeats then do their usual work); the next pairing dials again.

Wire format of one message: ``u32 size`` (bytes after this field), ``u32 n`` frames, ``n`` u32
frame lengths, the frames. Nothing here blocks: reads and writes are non-blocking, output a slow peer
has not taken is kept up to ``MAX_PENDING`` bytes, and whole messages beyond that are dropped and
counted, as ZMQ drops them at its high-water mark.
"""

from __future__ import annotations

import errno
import hmac
import logging
import os
import socket
import struct
import time
from collections.abc import Callable
from typing import TypeVar

log = logging.getLogger(__name__)

LANE_HELLO = b"PDPAIR-LANE-1"
MAX_FRAMES = 64
MAX_PENDING = 8 * 1024 * 1024
CONNECT_TIMEOUT = 1.0
MAX_HELLO = 1024
"""Largest first message an accepted lane may send: its hello (a token and an address)."""
MAX_UNKNOWN = 64
"""Accepted connections still owing their hello; more are closed at once (a flood costs no fds)."""
HELLO_TIMEOUT = 5.0
READ_CHUNK = 256 * 1024
T = TypeVar("T")
_HEAD = struct.Struct("<II")
_LENS = [struct.Struct(f"<{n}I") for n in range(MAX_FRAMES + 1)]
"""The frame-length table of an ``n``-frame message, compiled once per ``n``."""


class LaneError(Exception):
    """The lane is unusable (closed by the peer, reset, or it broke the framing)."""


def pack(frames: list[bytes]) -> bytes:
    n = len(frames)
    lens = [len(f) for f in frames]
    size = 4 + 4 * n + sum(lens)
    return b"".join([struct.pack(f"<II{n}I", size, n, *lens), *frames])


class FrameReader:
    """Reassembles messages from a byte stream; refuses sizes above ``max_message`` (above
    ``first_max`` for the first message: an accepted lane's hello, before anyone knows the peer).

    A read that holds whole messages (the usual case: control messages are small) is parsed as it
    came, each frame one slice of it; the tail of a message still arriving waits in ``buf`` and is
    only parsed again once ``need`` bytes are there, so a large message costs one copy, not one per
    read."""

    def __init__(self, max_message: int, first_max: int | None = None):
        self.buf = bytearray()
        self.need = 0
        """Bytes ``buf`` must hold before it is worth parsing (the pending message's header, or all of it)."""
        self.max_message = max_message
        self.first_max = first_max

    def feed(self, data: bytes) -> list[list[bytes]]:
        buf = self.buf
        if buf:
            buf += data
            if len(buf) < self.need:
                return []
            src = bytes(buf)
            buf.clear()
        else:
            src = bytes(data)
        out: list[list[bytes]] = []
        at, end, need = 0, len(src), _HEAD.size
        while end - at >= _HEAD.size:
            size, n = _HEAD.unpack_from(src, at)
            limit = self.max_message if self.first_max is None else self.first_max
            if size > limit or n > MAX_FRAMES or size < 4 + 4 * n:
                raise LaneError(f"bad lane message: {size} bytes, {n} frames")
            if end - at < 4 + size:
                need = 4 + size
                break
            lens = _LENS[n].unpack_from(src, at + 8)
            if sum(lens) != size - 4 - 4 * n:
                raise LaneError(f"bad lane message: frame lengths {sum(lens)} ≠ {size - 4 - 4 * n}")
            pos = at + 8 + 4 * n
            frames = []
            for ln in lens:
                frames.append(src[pos : pos + ln])
                pos += ln
            out.append(frames)
            self.first_max = None
            at = pos
        if at < end:
            buf += src[at:]
            self.need = need
        return out


class Lane:
    """One TCP stream to a peer agent. ``address`` is the peer's ZMQ control address once known.

    While a dialled lane is still connecting, messages wait unpacked in ``backlog``: if the connection
    fails they go out over ZMQ instead, in order, so a lane that never comes up loses nothing."""

    def __init__(
        self, sock: socket.socket, address: str, max_message: int, *, connecting: bool = False,
        first_max: int | None = None,
    ):
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock, self.address, self.connecting = sock, address, connecting
        self.fd = sock.fileno()
        self.reader = FrameReader(max_message, first_max)
        self.out = bytearray()
        self.backlog: list[list[bytes]] = []
        self.backlog_bytes = 0
        self.since = time.monotonic()

    def send(self, frames: list[bytes], defer: bool = False) -> bool:
        """Queue one message and write what the socket takes now (``defer``: leave it queued for
        ``flush``); False: dropped (too much pending)."""
        if self.connecting:
            size = sum(len(f) for f in frames)
            if self.backlog_bytes + size > MAX_PENDING:
                return False
            self.backlog.append(frames)
            self.backlog_bytes += size
            self.flush()
            return True
        data = pack(frames)
        if len(self.out) + len(data) > MAX_PENDING:
            return False
        if self.out or defer:
            self.out += data
            if not defer:
                self.flush()
            return True
        try:
            sent = self.sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            raise LaneError(f"lane to {self.address}: {exc}") from exc
        if sent < len(data):
            self.out += data[sent:]
        return True

    def flush(self) -> None:
        if self.connecting:
            err = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                raise LaneError(f"lane to {self.address}: connect failed: {os.strerror(err)}")
            try:
                self.sock.getpeername()
            except OSError:
                if time.monotonic() - self.since > CONNECT_TIMEOUT:
                    raise LaneError(f"lane to {self.address}: connect timed out") from None
                return
            self.connecting = False
            self.out += b"".join(pack(f) for f in self.backlog)
            self.backlog, self.backlog_bytes = [], 0
        while self.out:
            try:
                sent = self.sock.send(self.out)
            except BlockingIOError:
                return
            except OSError as exc:
                raise LaneError(f"lane to {self.address}: {exc}") from exc
            del self.out[:sent]

    def read(self) -> list[list[bytes]]:
        """Every whole message the socket has now (non-blocking)."""
        out: list[list[bytes]] = []
        for _ in range(64):  # bounded: a peer that never stops sending cannot pin the caller
            try:
                data = self.sock.recv(READ_CHUNK)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno in (errno.ENOTCONN,) and self.connecting:
                    break
                raise LaneError(f"lane to {self.address}: {exc}") from exc
            if not data:
                raise LaneError(f"lane to {self.address or 'an unknown peer'} closed by the peer")
            out += self.reader.feed(data)
            if len(data) < READ_CHUNK:
                break
        return out

    def close(self) -> None:
        self.sock.close()


class Lanes:
    """This agent's lane listener, its lanes by peer address, and the invitations it has issued.

    Used by one thread only (the role worker), like the ZMQ sockets beside it."""

    def __init__(self, host: str, port: int, max_message: int):
        self.max_message = max_message
        self.listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((host, port))
        self.listener.listen(64)
        self.listener.setblocking(False)
        self.port = int(self.listener.getsockname()[1])
        self.lfd = self.listener.fileno()
        self.by_address: dict[str, Lane] = {}
        self.unknown: dict[int, Lane] = {}
        """Accepted lanes whose hello has not arrived yet (by fd)."""
        self.invites: dict[str, bytes] = {}
        self.dropped = 0
        self.fallbacks = 0
        self.fallback: Callable[[str, list[bytes]], object] = lambda address, frames: None
        """Where the messages of a lane that never connected go (``Pushers`` sets its ZMQ send)."""
        self.corked = False
        """Sends only queue, until ``uncork`` writes each lane's queue at once (one syscall per lane
        for the replies to messages handled together)."""

    # ---- set-up ---------------------------------------------------------------------------------
    def invite(self, address: str, token: bytes = b"") -> bytes:
        """A token for the agent at ``address`` to present when it dials us (``token``: one both
        sides derive; else a random one, sent in the ``Hello``)."""
        token = token or os.urandom(16)
        self.invites[address] = token
        return token

    def dial(self, address: str, host: str, port: int, token: bytes, me: str) -> None:
        """Open a lane to the agent at ``address`` (its lane listener at ``host:port``); messages sent
        to it from now on queue in the lane until the connection is up."""
        self.forget(address)
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        sock.setblocking(False)
        rc = sock.connect_ex((host, port))
        if rc not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
            sock.close()
            self.fallbacks += 1
            log.warning("lane to %s (%s:%d): %s; staying on ZMQ", address, host, port, os.strerror(rc))
            return
        lane = Lane(sock, address, self.max_message, connecting=rc != 0)
        lane.out += pack([LANE_HELLO, token, me.encode()])
        self.by_address[address] = lane
        self._guard(lane, lane.flush)

    def forget(self, address: str) -> None:
        self.invites.pop(address, None)
        lane = self.by_address.pop(address, None)
        if lane is not None:
            lane.close()

    def close(self) -> None:
        for lane in [*self.by_address.values(), *self.unknown.values()]:
            lane.close()
        self.by_address.clear()
        self.unknown.clear()
        self.listener.close()

    # ---- traffic ----------------------------------------------------------------------------------
    def send(self, address: str, frames: list[bytes]) -> bool | None:
        """True sent (or queued), False dropped, None: no lane to ``address`` (use ZMQ)."""
        lane = self.by_address.get(address)
        if lane is None:
            return None
        ok = self._guard(lane, lambda: lane.send(frames, self.corked))
        if ok is None:
            return None
        if not ok:
            self.dropped += 1
            pending = len(lane.out) + lane.backlog_bytes
            log.warning("lane to %s: %d bytes pending, message dropped", address, pending)
        return ok

    def uncork(self) -> None:
        """Stop deferring sends and write what they queued."""
        self.corked = False
        for lane in list(self.by_address.values()):
            if lane.out and not lane.connecting:
                self._guard(lane, lane.flush)

    def fds(self) -> list[int]:
        return [self.lfd, *(ln.fd for ln in self.by_address.values()), *self.unknown]

    def wants_write(self) -> list[int]:
        return [ln.fd for ln in self.by_address.values() if ln.out or ln.connecting]

    def waiting(self) -> bool:
        """Something to finish even without traffic: a connect, or a hello not yet received."""
        return bool(self.unknown) or any(ln.connecting for ln in self.by_address.values())

    def service(self, ready: set[int]) -> list[list[bytes]]:
        """Accept, finish connects, flush output, read the ``ready`` descriptors: every whole message
        received, in order per lane."""
        out: list[list[bytes]] = []
        if self.lfd in ready:
            ready = ready | self._accept()  # a new lane's hello is often there already
        for lane in list(self.by_address.values()):
            if lane.out or lane.connecting:
                self._guard(lane, lane.flush)
            if lane.fd in ready and self.by_address.get(lane.address) is lane:
                out += self._guard(lane, lane.read) or []
        now = time.monotonic()
        for fd, lane in list(self.unknown.items()):
            try:
                msgs = lane.read() if fd in ready else []
            except LaneError as exc:
                log.warning("lane from an unknown peer: %s", exc)
                self._drop_unknown(fd)
                continue
            if msgs:
                if self._greet(fd, lane, msgs[0]):
                    out += msgs[1:]
            elif now - lane.since > HELLO_TIMEOUT:
                log.warning("lane from an unknown peer sent no hello within %.0f s; closed", HELLO_TIMEOUT)
                self._drop_unknown(fd)
        return out

    def _accept(self) -> set[int]:
        new: set[int] = set()
        for _ in range(16):
            try:
                sock, _peer = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                log.warning("lane listener: %s", exc)
                break
            if len(self.unknown) >= MAX_UNKNOWN:
                sock.close()
                continue
            lane = Lane(sock, "", self.max_message, first_max=MAX_HELLO)
            self.unknown[lane.fd] = lane
            new.add(lane.fd)
        return new

    def _greet(self, fd: int, lane: Lane, first: list[bytes]) -> bool:
        ok = len(first) == 3 and first[0] == LANE_HELLO
        address = first[2].decode(errors="replace") if ok else ""
        expected = self.invites.get(address)
        if not ok or expected is None or not hmac.compare_digest(expected, first[1]):
            log.warning("lane refused: %s", "no valid hello" if not ok else f"bad token for {address}")
            self._drop_unknown(fd)
            return False
        del self.unknown[fd]
        old = self.by_address.pop(address, None)
        if old is not None:
            old.close()
        lane.address = address
        self.by_address[address] = lane
        log.info("lane up from %s", address)
        return True

    def _drop_unknown(self, fd: int) -> None:
        lane = self.unknown.pop(fd, None)
        if lane is not None:
            lane.close()

    def _guard(self, lane: Lane, step: Callable[[], T]) -> T | None:
        """``step()``, or None when it broke the lane (closed; its backlog handed to ZMQ)."""
        try:
            return step()
        except LaneError as exc:
            self._broken(lane, exc)
            return None

    def _broken(self, lane: Lane, exc: Exception) -> None:
        log.warning("%s; falling back to ZMQ", exc)
        self.fallbacks += 1
        if self.by_address.get(lane.address) is lane:
            del self.by_address[lane.address]
        lane.close()
        backlog, lane.backlog = lane.backlog, []
        for frames in backlog:
            self.fallback(lane.address, frames)
