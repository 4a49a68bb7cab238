"""The in-pod agent: pools, the synthetic source, rooms, ZMQ control, bootstrap/health HTTP, metrics, and
the two role workers, wired together by ``AgentRuntime``.

Importing this package imports numpy and pyzmq but no transport SDK: ``make_transport`` loads the
configured engine's SDK when the runtime starts.
"""

from .bootstrap import BootstrapRegistry, RankInfo, Topology, fetch_topology
from .health import AgentStatus
from .metrics import AgentMetrics
from .pools import IndexAllocator, MemoryPools
from .runtime import AgentRuntime, make_transport
from .synthetic import ComponentCheck, ItemCounts, SyntheticEngine, items_for_tokens

__all__ = [
    "AgentMetrics",
    "AgentRuntime",
    "AgentStatus",
    "BootstrapRegistry",
    "ComponentCheck",
    "IndexAllocator",
    "ItemCounts",
    "MemoryPools",
    "RankInfo",
    "SyntheticEngine",
    "Topology",
    "fetch_topology",
    "items_for_tokens",
    "make_transport",
]
