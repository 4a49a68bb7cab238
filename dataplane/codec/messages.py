"""The sglang messages as typed records: the per-room transfer metadata, the status and its states.

Kept apart from their codecs (``metadata``, ``status``) so that those compile with mypyc
(``dataplane.compiled``), which would drop a Struct's class keywords; these classes stay interpreted.
"""

from __future__ import annotations

import enum

import msgspec
import numpy as np
import numpy.typing as npt

IndexArray = npt.NDArray[np.int32]


class KVPoll(enum.IntEnum):
    """sglang's ``KVPoll``; the integer values are on the wire."""

    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


class StatusMessage(msgspec.Struct, frozen=True, kw_only=True):
    room: int
    status: KVPoll
    prefill_rank: int
    failure_reason: str | None = None


class TransferMetadata(msgspec.Struct, frozen=True, kw_only=True, eq=False):
    """sglang's ``TransferInfo``. Index arrays are numpy int32; ``dst_aux_index`` -1 means none.
    Holding arrays, messages compare by identity: compare fields."""

    room: int
    endpoint: str
    dst_port: int
    engine_key: str
    dst_kv_indices: IndexArray
    dst_aux_index: int = -1
    dst_state_indices: tuple[IndexArray, ...] = ()
    """One array per component; sglang's ``None`` entries travel (and come back) as empty arrays."""
    required_dst_info_num: int = 1
    is_dummy: bool = False
    decode_prefix_len: int | None = None
