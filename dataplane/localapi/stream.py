"""Length-prefixed frames over a Unix stream socket, with file descriptors passed beside them.

A frame is a 4-byte big-endian length and that many bytes of one msgpack message. A length above
``max_frame`` is refused before a byte of the body is read (``FrameTooLarge``): the stream cannot be
resynchronised after that, so the reader answers with an ``Error`` and closes. Descriptors (memfds of
an engine's pools) ride on the frame's first bytes as ``SCM_RIGHTS`` ancillary data; every descriptor
received is either handed to the caller or closed, never leaked.

Reads take a timeout so no thread can block forever on a frozen peer. The reader takes whatever the
socket holds (up to ``READ_CHUNK``) and keeps what is past the frame it returns: a burst of pushed room
states costs one ``recvmsg``, not two per frame. ``fill`` reads without blocking and ``next`` takes a
frame already read, for a thread that waits on the socket in its own ``select`` (the agent's worker).
"""

from __future__ import annotations

import array
import os
import socket
import struct
from collections.abc import Sequence

from mypy_extensions import mypyc_attr

from ..errors import FrameTooLarge, WireFormatError

HEADER = struct.Struct(">I")
DEFAULT_MAX_FRAME = 4 << 20
"""4 MiB: a request with a million one-token pages still fits; anything bigger is a bug or an attack."""
MAX_FDS = 64
READ_CHUNK = 256 * 1024
_CMSG_SPACE = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)


@mypyc_attr(native_class=False)
class Closed(ConnectionError):
    """The peer closed the connection (cleanly, between frames)."""


def send_frame(sock: socket.socket, payload: bytes, fds: Sequence[int] = ()) -> None:
    """Write one frame (and ``fds``, if any) completely."""
    data = HEADER.pack(len(payload)) + payload
    if fds:
        if len(fds) > MAX_FDS:
            raise WireFormatError(f"{len(fds)} descriptors in one message; at most {MAX_FDS}")
        sent = socket.send_fds(sock, [data], list(fds))
        data = data[sent:]
    if data:
        sock.sendall(data)


class FrameReader:
    """Reads frames from one socket; descriptors that arrive are queued in ``fds`` in arrival order."""

    def __init__(self, sock: socket.socket, max_frame: int = DEFAULT_MAX_FRAME):
        self.sock = sock
        self.max_frame = max_frame
        self.fds: list[int] = []
        self.buf = bytearray()

    def read(self) -> bytes:
        """The next frame's payload. Raises ``Closed`` at the end of the stream, ``FrameTooLarge`` for
        an oversized length (mid-frame too: the stream is over either way), ``TimeoutError``."""
        while True:
            frame = self.next()
            if frame is not None:
                return frame
            self._fill(0)

    def next(self) -> bytes | None:
        """A whole frame already read, or None; ``FrameTooLarge`` (the frame stays unread) for an
        oversized length, before its body is waited for."""
        buf = self.buf
        if len(buf) < HEADER.size:
            return None
        (length,) = HEADER.unpack_from(buf)
        if length > self.max_frame:
            raise FrameTooLarge(f"local API frame of {length} bytes exceeds the maximum of {self.max_frame}")
        end = HEADER.size + length
        if len(buf) < end:
            return None
        frame = bytes(buf[HEADER.size : end])
        del buf[:end]
        return frame

    def whole(self) -> bool:
        """A whole frame (or an oversized length, which ``next`` raises for) is already read."""
        buf = self.buf
        if len(buf) < HEADER.size:
            return False
        (length,) = HEADER.unpack_from(buf)
        return length > self.max_frame or len(buf) >= HEADER.size + length

    def fill(self) -> bool:
        """Take what the socket holds without waiting (the socket must be in blocking mode, no
        timeout: Python waits before a read on a socket with one); whether anything came. Raises
        ``Closed`` at the end of the stream."""
        return self._fill(socket.MSG_DONTWAIT)

    def _fill(self, flags: int) -> bool:
        try:
            data, anc, _flags, _addr = self.sock.recvmsg(READ_CHUNK, _CMSG_SPACE, flags)
        except BlockingIOError:
            return False
        self._collect(anc)
        if not data:
            if self.buf:
                raise Closed(f"peer closed the connection inside a frame ({len(self.buf)} bytes of it read)")
            raise Closed("peer closed the connection")
        self.buf += data
        return True

    def take_fds(self) -> list[int]:
        out, self.fds = self.fds, []
        return out

    def close_fds(self) -> None:
        for fd in self.take_fds():
            os.close(fd)

    def _collect(self, ancillary: list[tuple[int, int, bytes]]) -> None:
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
                self.fds.extend(fds)
