"""Transport layer: one ``Transport`` interface and one thin adapter per transport SDK.

``NixlTransport`` (UCX; host memory and VRAM; runs anywhere) and ``MoriTransport`` (AMD MoRI-IO over
RDMA) translate calls and map engine errors to ``dataplane.errors``; each imports its SDK lazily, so
importing this package costs nothing. ``cuda_ipc.CudaIpcTransport`` (GPU memory of a peer on the same
node, one copy kernel per batch; needs torch and Triton) is imported by its users only.
``mori_double`` is the MoRI hardware TEST DOUBLE, for tests only.
"""

from .base import (
    Device,
    MemoryRegion,
    Peer,
    Transfer,
    TransferState,
    Transport,
    Writes,
    WriteSpec,
    check_bounds,
)
from .mori import MoriTransport
from .nixl import NixlTransport

__all__ = [
    "Device",
    "MemoryRegion",
    "MoriTransport",
    "NixlTransport",
    "Peer",
    "Transfer",
    "TransferState",
    "Transport",
    "WriteSpec",
    "Writes",
    "check_bounds",
]
