"""The far side of the NIXL conformance tests: a child process (multiprocessing 'spawn') that owns
host buffers registered with its own ``NixlTransport`` and answers a few commands over a pipe.

Commands: ``("hello",)`` → (endpoint, descriptor blobs, region sizes); ``("read", i)`` → the bytes of
region ``i``; ``("fill", i, byte)``; ``("connect", endpoint, blobs)`` → lets it write back;
``("exit",)``.
"""

from __future__ import annotations

import os
from multiprocessing.connection import Connection

import numpy as np

from dataplane.config import NixlConfig
from dataplane.transports import MemoryRegion
from dataplane.transports.nixl import NixlTransport, ucx_environment


def serve(conn: Connection, name: str, sizes: list[int], ucx_tls: str | None) -> None:
    buffers = [np.zeros(n, dtype=np.uint8) for n in sizes]
    config = NixlConfig(ucx_tls=ucx_tls, ucx_net_devices="lo")
    os.environ.update(ucx_environment(config))  # this process starts here: its UCX settings
    transport = NixlTransport(name, config)
    blobs = transport.register([MemoryRegion(b.ctypes.data, b.nbytes) for b in buffers])
    for _ in range(10_000):
        msg = conn.recv()
        if msg[0] == "hello":
            conn.send((transport.endpoint(), blobs, sizes))
        elif msg[0] == "read":
            conn.send(buffers[msg[1]].tobytes())
        elif msg[0] == "fill":
            buffers[msg[1]][:] = msg[2]
            conn.send(True)
        elif msg[0] == "exit":
            break
    transport.close()
    conn.send("bye")
