"""The local API between a serving engine and its sidecar agent (a Unix socket in a shared volume).

This package's top level is what an engine embeds — ``AgentClient``, ``SharedPools`` and the
messages — and imports only the standard library, msgspec and numpy. The agent's half
(``server``, ``mapping``, ``sources``, ``sidecar``) is imported from its own modules.
"""

from .client import AgentClient
from .messages import LOCALAPI_VERSION, PoolRegion, RoomState, pack_indices, unpack_indices
from .shm import SharedPools

__all__ = [
    "LOCALAPI_VERSION",
    "AgentClient",
    "PoolRegion",
    "RoomState",
    "SharedPools",
    "pack_indices",
    "unpack_indices",
]
