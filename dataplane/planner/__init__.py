"""The transfer planner: schema + peer layout + one request's indices → a ``WritePlan``. Pure, no I/O.

Rules per state type come from the schema registry (``SendRule``) and are dispatched through one table
(``RULES``); the contiguous grouping and TP slicing match sglang 0.5.23 byte for byte. The common request
shape (paged KV, one slot per component) is planned in one pass by ``shape.CommonShape``.
"""

from .layout import PeerComponent, PeerLayout, PeerRegion, RequestIndices
from .pairing import Pairing, TensorGroup, pair_entries
from .plan import AUX_COMPONENT, KV_COMPONENT, WritePlan
from .request import pairing_for, plan_request
from .rules import RULES, plan_group
from .runs import contiguous_runs, group_concurrent_contiguous
from .slicing import should_send_replicated, slice_byte_blocks, target_ranks

__all__ = [
    "AUX_COMPONENT",
    "KV_COMPONENT",
    "RULES",
    "Pairing",
    "PeerComponent",
    "PeerLayout",
    "PeerRegion",
    "RequestIndices",
    "TensorGroup",
    "WritePlan",
    "contiguous_runs",
    "group_concurrent_contiguous",
    "pair_entries",
    "pairing_for",
    "plan_group",
    "plan_request",
    "should_send_replicated",
    "slice_byte_blocks",
    "target_ranks",
]
