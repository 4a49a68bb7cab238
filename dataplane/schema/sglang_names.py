"""sglang's state-type names → PDPair's send rules.

sglang 0.5.23 names each state component of ``KVArgs.state_types`` by a ``StateType`` value
(``sglang/srt/disaggregation/base/conn.py``); older sglang called DSA's index-key state ``nsa``. An
engine, a manifest or a config may use any of these names: ``canonical_state_type`` turns an older name
into the current one, and ``sglang_state_type`` gives the rule of every ``StateType`` value, or refuses
one PDPair does not move with a ``BadInput`` that names it and says why.

The rules follow how sglang's own backends send each type: ``mamba`` one TP-sliceable slot per
request; ``swa``, ``dsa`` and the block-scale sub-pools pages paired by index (a one-page drift is
truncated); ring rows, compressed state, request rows and QSA/MiniMax state by position, lengths equal.
"""

from __future__ import annotations

from ..errors import UnknownStateType
from .registry import STATE_TYPE_ALIASES, StateTypeInfo, canonical_state_type, state_type

__all__ = [
    "SGLANG_STATE_TYPES",
    "SGLANG_STATE_TYPES_REFUSED",
    "STATE_TYPE_ALIASES",
    "canonical_state_type",
    "sglang_state_type",
]

SGLANG_STATE_TYPES: dict[str, str] = {
    "mamba": "mamba",
    "qsa_pending": "qsa_pending",
    "qsa_compressed": "qsa_compressed",
    "swa": "swa",
    "dsa": "dsa",
    "minimax_index_k": "minimax_index_k",
    "minimax_dense_kv": "minimax_dense_kv",
    "swa_ring": "swa_ring",
    "c128_state": "c128_state",
    "request_row": "request_row",
    "block_scale": "block_scale",
    "block_scale_swa": "block_scale_swa",
}
"""sglang 0.5.23 ``StateType`` value → PDPair state type (a ``registry`` entry)."""

SGLANG_STATE_TYPES_REFUSED: dict[str, str] = {
    "dsa_tail": (
        "its indices are a ring segment (row, start, count, 0, count, ring size), not items, and "
        "sglang's MoRI backend refuses it too; it exists only when the model config compresses the "
        "DSA index-key pool (index_kpool > 1 with index_kpool_compress): serve without that"
    ),
}
"""sglang 0.5.23 ``StateType`` values PDPair does not move → why."""


def sglang_state_type(name: str) -> StateTypeInfo:
    """The PDPair rule for one of sglang's ``StateType`` values (or an older name of one).

    Raises ``UnknownStateType`` (a ``BadInput``) naming the state type when PDPair refuses it or
    sglang 0.5.23 has no such type."""
    current = canonical_state_type(name)
    if current in SGLANG_STATE_TYPES_REFUSED:
        raise UnknownStateType(
            f"sglang state type {name!r} is not supported by PDPair: {SGLANG_STATE_TYPES_REFUSED[current]}"
        )
    pdpair = SGLANG_STATE_TYPES.get(current)
    if pdpair is None:
        known = ", ".join(sorted({*SGLANG_STATE_TYPES, *STATE_TYPE_ALIASES}))
        raise UnknownStateType(
            f"unknown sglang state type {name!r}; sglang 0.5.23's types PDPair moves: {known}"
        )
    return state_type(pdpair)
