"""The state-type registry: state type name → send rule.

sglang's wire says nothing about which type a component is; both sides must agree on the order and the
rule. Adding a state type is one ``register_state_type`` call (or one entry below), never a new branch
in the planner: the planner dispatches on ``SendRule`` only.
"""

from __future__ import annotations

import enum

import msgspec

from ..errors import UnknownStateType


class SendRule(enum.Enum):
    """How a component's items move from prefill to decode."""

    SLOT = "slot"
    """One item per request on each side (mamba); TP-sliced when attention-TP sizes differ."""
    PAGED = "paged"
    """Pages paired by index, contiguous runs coalesced; a 1-page length drift is truncated."""
    POSITIONAL = "positional"
    """Items paired by position; lengths must match exactly."""


class StateTypeInfo(msgspec.Struct, frozen=True):
    name: str
    rule: SendRule
    tp_sliceable: bool = False
    """Items may be split along a TP dimension (only mamba in sglang 0.5.23)."""
    description: str = ""


_REGISTRY: dict[str, StateTypeInfo] = {}
STATE_TYPE_ALIASES: dict[str, str] = {"nsa": "dsa"}
"""Older names → current ones: sglang called DSA's index-key state ``nsa`` before it became ``dsa``."""


def canonical_state_type(name: str) -> str:
    """``name`` with an older name replaced by the current one (``nsa`` → ``dsa``)."""
    return STATE_TYPE_ALIASES.get(name, name)


def register_state_type(info: StateTypeInfo) -> StateTypeInfo:
    """Add (or replace) a state type. Returns ``info`` so modules can keep a handle."""
    _REGISTRY[info.name] = info
    return info


def state_type(name: str) -> StateTypeInfo:
    """The registered type ``name`` (or the type an older name now has)."""
    try:
        return _REGISTRY[canonical_state_type(name)]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise UnknownStateType(f"unknown state type {name!r}; known types: {known}") from None


def known_state_types() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


for _info in (
    StateTypeInfo("mamba", SendRule.SLOT, tp_sliceable=True, description="Mamba/GDN conv + temporal slot"),
    StateTypeInfo("swa", SendRule.PAGED, description="sliding-window attention pages of the last window"),
    StateTypeInfo("dsa", SendRule.PAGED, description="DSA index-key pages of the whole sequence"),
    StateTypeInfo("swa_ring", SendRule.POSITIONAL, description="SWA ring buffer, by position"),
    StateTypeInfo("c128_state", SendRule.POSITIONAL, description="compressed 128-token state"),
    StateTypeInfo("qsa_pending", SendRule.POSITIONAL, description="QSA pending tokens"),
    StateTypeInfo("qsa_compressed", SendRule.POSITIONAL, description="QSA compressed blocks"),
    StateTypeInfo("minimax_index_k", SendRule.POSITIONAL, description="MiniMax index keys"),
    StateTypeInfo("minimax_dense_kv", SendRule.POSITIONAL, description="MiniMax dense KV"),
    StateTypeInfo("request_row", SendRule.POSITIONAL, description="one row per request, row to row"),
    StateTypeInfo("block_scale", SendRule.PAGED, description="per-block KV scales of the full KV pages"),
    StateTypeInfo("block_scale_swa", SendRule.PAGED, description="per-block KV scales of the SWA pages"),
):
    register_state_type(_info)
