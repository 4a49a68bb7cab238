"""Schema layer: what a role holds and how each state type is sent. No I/O, no engine."""

from .registry import SendRule, StateTypeInfo, known_state_types, register_state_type, state_type
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
    "AuxSpec",
    "Component",
    "KVSpec",
    "Region",
    "RoleSchema",
    "SendRule",
    "StateTypeInfo",
    "TensorSpec",
    "known_state_types",
    "register_state_type",
    "state_type",
]
