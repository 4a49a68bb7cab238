"""Helpers for the codec tests: the golden vectors (sglang 0.5.23's own output) and builders that turn a
vector's ``inputs`` into our messages. Not a test module."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from dataplane.codec import Registration, TransferMetadata

VECTORS_PATH = Path(__file__).resolve().parents[1] / "vectors" / "sglang-0.5.23-mori-wire.json"
VECTORS: dict[str, Any] = json.loads(VECTORS_PATH.read_text())


def frames_of(case: dict[str, Any]) -> list[bytes]:
    return [bytes.fromhex(h) for h in case["frames_hex"]]


def registration_from_inputs(i: dict[str, Any]) -> Registration:
    return Registration(
        endpoint=i["local_ip"],
        dst_port=i["rank_port"],
        engine_desc=bytes.fromhex(i["engine_desc"]),
        dst_kv_mem_descs=tuple(bytes.fromhex(x) for x in i["kv_mem_descs"]),
        dst_aux_mem_descs=tuple(bytes.fromhex(x) for x in i["aux_mem_descs"]),
        dst_state_mem_descs=tuple(tuple(bytes.fromhex(x) for x in c) for c in i["state_mem_descs"]),
        gpu_id=i["gpu_id"],
        decode_tp_size=i["attn_tp_size"],
        decode_tp_rank=i["tp_rank"],
        dst_kv_item_len=i["kv_item_len"],
        dst_state_item_lens=tuple(map(tuple, i["state_item_lens"])),
        dst_state_dim_per_tensor=tuple(map(tuple, i["state_dim_per_tensor"])),
        dcp_size=i["dcp_size"],
        dcp_rank=i["dcp_rank"],
        dst_state_layer_ids=tuple(map(tuple, i["state_layer_ids"])),
        dst_kv_layer_ids=tuple(i["kv_layer_ids"]),
    )


def metadata_from_inputs(i: dict[str, Any]) -> TransferMetadata:
    return TransferMetadata(
        room=i["room"],
        endpoint=i["local_ip"],
        dst_port=i["rank_port"],
        engine_key=i["engine_key"],
        dst_kv_indices=np.asarray(i["kv_indices"], dtype=np.int32),
        dst_aux_index=-1 if i["aux_index"] is None else i["aux_index"],
        dst_state_indices=tuple(np.asarray(s or [], dtype=np.int32) for s in i["state_indices"] or ()),
        required_dst_info_num=i["required_dst_info_num"],
        is_dummy=i["is_dummy"],
        decode_prefix_len=i["decode_prefix_len"],
    )


def as_plain(value: Any) -> Any:
    """numpy arrays and tuples → lists, for comparing with the vectors' JSON."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, tuple | list):
        return [as_plain(v) for v in value]
    return value
