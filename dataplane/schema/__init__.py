"""Schema layer: what a role holds and how each state type is sent. No I/O, no engine."""

from .registry import (
    STATE_TYPE_ALIASES,
    SendRule,
    StateTypeInfo,
    canonical_state_type,
    known_state_types,
    register_state_type,
    state_type,
)
from .sglang_names import SGLANG_STATE_TYPES, SGLANG_STATE_TYPES_REFUSED, sglang_state_type
from .types import (
    AUX_COMPONENT,
    DTYPE_BYTES,
    KV_COMPONENT,
    AuxSpec,
    Component,
    KVSpec,
    Region,
    RoleSchema,
    TensorSpec,
)

__all__ = [
    "AUX_COMPONENT",
    "DTYPE_BYTES",
    "KV_COMPONENT",
    "SGLANG_STATE_TYPES",
    "SGLANG_STATE_TYPES_REFUSED",
    "STATE_TYPE_ALIASES",
    "AuxSpec",
    "Component",
    "KVSpec",
    "Region",
    "RoleSchema",
    "SendRule",
    "StateTypeInfo",
    "TensorSpec",
    "canonical_state_type",
    "known_state_types",
    "register_state_type",
    "sglang_state_type",
    "state_type",
]
