"""Length-prefixed frames over a Unix stream socket, with file descriptors passed beside them.

A frame is a 4-byte big-endian length and that many bytes of one msgpack message. A length above
``max_frame`` is refused before a byte of the body is read (``FrameTooLarge``): the stream cannot be
resynchronised after that, so the reader answers with an ``Error`` and closes. Descriptors (memfds of
an engine's pools) ride on the frame's first bytes as ``SCM_RIGHTS`` ancillary data; every descriptor
received is either handed to the caller or closed, never leaked.

Reads take a timeout so no thread can block forever on a frozen peer.
"""

from __future__ import annotations

import array
import os
import socket
import struct
from collections.abc import Sequence

from ..errors import FrameTooLarge, WireFormatError

HEADER = struct.Struct(">I")
DEFAULT_MAX_FRAME = 4 << 20
"""4 MiB: a request with a million one-token pages still fits; anything bigger is a bug or an attack."""
MAX_FDS = 64
_CMSG_SPACE = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)


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

    def read(self) -> bytes:
        """The next frame's payload. Raises ``Closed`` at the end of the stream, ``FrameTooLarge`` for
        an oversized length (mid-frame too: the stream is over either way), ``TimeoutError``."""
        header = self._exactly(HEADER.size, at_boundary=True)
        (length,) = HEADER.unpack(header)
        if length > self.max_frame:
            raise FrameTooLarge(f"local API frame of {length} bytes exceeds the maximum of {self.max_frame}")
        return self._exactly(length, at_boundary=False)

    def take_fds(self) -> list[int]:
        out, self.fds = self.fds, []
        return out

    def close_fds(self) -> None:
        for fd in self.take_fds():
            os.close(fd)

    def _exactly(self, n: int, *, at_boundary: bool) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            data, anc, _flags, _addr = self.sock.recvmsg(n - len(buf), _CMSG_SPACE)
            self._collect(anc)
            if not data:
                if at_boundary and not buf:
                    raise Closed("peer closed the connection")
                raise Closed(f"peer closed the connection inside a frame ({len(buf)} of {n} bytes)")
            buf += data
        return bytes(buf)

    def _collect(self, ancillary: list[tuple[int, int, bytes]]) -> None:
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
                self.fds.extend(fds)
