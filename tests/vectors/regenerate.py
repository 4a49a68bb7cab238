"""Regenerates ``sglang-0.5.23-mori-wire.json`` from sglang 0.5.23's own functions.

Each case's ``inputs`` (or ``lists`` / ``src`` / ``args``) are the cases' definition and stay as
committed; everything sglang computes from them — frames, packed bytes, parsed fields, groups, byte
blocks, a sender's writes — is produced anew by the functions named in the case's ``source``, cut out
of the sglang wheel by ``dataplane/harness/bench/sglang_ref.py`` (``pip download sglang==0.5.23 --no-deps`` on
first use, cached).
The EngineDesc/MemoryDesc blobs in the registration inputs are mori 1.2.4's msgpack layouts; sglang
passes them through unparsed, so they are inputs here too.

    python tests/vectors/regenerate.py           # rewrite the file
    python tests/vectors/regenerate.py --check   # exit 1 if the committed file differs
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np

VECTORS = Path(__file__).with_name("sglang-0.5.23-mori-wire.json")
_CONN = "python/sglang/srt/disaggregation/mori/conn.py"
_COMMON = "python/sglang/srt/disaggregation/common/utils.py"
_UTILS = "python/sglang/srt/disaggregation/utils.py"
SOURCES = {
    "pack_int_lists": f"sglang 0.5.23 {_COMMON}: pack_int_lists, unpack_int_lists",
    "registration": (
        f"sglang 0.5.23 {_CONN}: MoriKVManager.build_receiver_registration_message, "
        "KVArgsRegisterInfo.from_zmq (frames from frame 1 on)"
    ),
    "transfer_metadata": (
        f"sglang 0.5.23 {_CONN}: MoriKVManager.build_receiver_metadata_message, "
        "TransferInfo.from_zmq (frames from frame 1 on)"
    ),
    "group_concurrent_contiguous": f"sglang 0.5.23 {_COMMON}: group_concurrent_contiguous",
    "mamba_state_slice_byte_blocks": f"sglang 0.5.23 {_UTILS}: compute_mamba_state_slice_byte_blocks",
    "tp_slice_writes": (
        f"sglang 0.5.23 {_CONN}: MoriKVManager._build_tp_slice_config, "
        "MoriKVManager._build_tp_slice_transfer_plan, MoriKVManager._send_mamba_state"
    ),
}
ABOUT = (
    "Golden vectors from sglang 0.5.23's MoRI PD backend, produced by running its own functions "
    "(each case's 'source' names them) with tests/vectors/regenerate.py. Frames are ZMQ multipart "
    "frames, hex-encoded; frame 0 is the guard b'MoriMsgGuard'. MemoryDesc/EngineDesc blobs are "
    "inputs, opaque to sglang and to the codec; they use mori 1.2.4's msgpack field order."
)


def _hex(frames: list[bytes]) -> list[str]:
    return [f.hex() for f in frames]


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def _receiver(ref: ModuleType, i: dict[str, Any]) -> SimpleNamespace:
    """The attributes of ``MoriKVManager`` that its two ``build_receiver_*`` methods read."""
    desc = ref.OpaqueDesc
    return SimpleNamespace(
        engine_desc=desc(bytes.fromhex(i["engine_desc"]), i["engine_key"]),
        kv_mem_descs=[desc(bytes.fromhex(h)) for h in i["kv_mem_descs"]],
        aux_mem_descs=[desc(bytes.fromhex(h)) for h in i["aux_mem_descs"]],
        state_mem_descs=[[desc(bytes.fromhex(h)) for h in c] for c in i["state_mem_descs"]],
        kv_args=SimpleNamespace(
            gpu_id=i["gpu_id"],
            engine_rank=i["tp_rank"],
            kv_item_lens=[i["kv_item_len"]],
            state_item_lens=i["state_item_lens"],
            state_dim_per_tensor=i["state_dim_per_tensor"],
            state_layer_ids=i["state_layer_ids"],
            kv_layer_ids=i["kv_layer_ids"],
        ),
        attn_tp_size=i["attn_tp_size"],
        dcp_size=i["dcp_size"],
        dcp_rank=i["dcp_rank"],
        local_ip=i["local_ip"],
        rank_port=i["rank_port"],
    )


def _metadata_receiver(i: dict[str, Any], ref: ModuleType) -> SimpleNamespace:
    return SimpleNamespace(
        engine_desc=ref.OpaqueDesc(b"", i["engine_key"]), local_ip=i["local_ip"], rank_port=i["rank_port"]
    )


def pack_int_lists(ref: ModuleType, case: dict[str, Any]) -> dict[str, Any]:
    packed = ref.pack_int_lists(case["lists"], case["fmt"])
    return {
        "lists": case["lists"],
        "fmt": case["fmt"],
        "hex": packed.hex(),
        "unpacked_by_sglang": ref.unpack_int_lists(packed, case["fmt"]),
    }


def registration(ref: ModuleType, case: dict[str, Any]) -> dict[str, Any]:
    i = case["inputs"]
    frames = ref.build_receiver_registration_message(_receiver(ref, i))
    info = ref.KVArgsRegisterInfo.from_zmq(frames[1:])
    return {
        "name": case["name"],
        "inputs": i,
        "frames_hex": _hex(frames),
        "parsed_by_sglang": {
            "decode_tp_size": info.decode_tp_size,
            "decode_tp_rank": info.decode_tp_rank,
            "dst_kv_item_len": info.dst_kv_item_len,
            "dst_state_item_lens": _plain(info.dst_state_item_lens),
            "dst_state_dim_per_tensor": _plain(info.dst_state_dim_per_tensor),
            "dst_state_layer_ids": _plain(info.dst_state_layer_ids),
            "dst_kv_layer_ids": _plain(info.dst_kv_layer_ids),
            "n_state_mem_descs": [len(c) for c in info.dst_state_mem_descs],
        },
    }


def transfer_metadata(ref: ModuleType, case: dict[str, Any]) -> dict[str, Any]:
    i = case["inputs"]
    frames = ref.build_receiver_metadata_message(
        _metadata_receiver(i, ref),
        bootstrap_room=i["room"],
        required_dst_info_num=i["required_dst_info_num"],
        kv_indices=np.asarray(i["kv_indices"], dtype=np.int32),
        aux_index=i["aux_index"],
        state_indices=i["state_indices"],
        decode_prefix_len=i["decode_prefix_len"],
        is_dummy=i["is_dummy"],
    )
    info = ref.TransferInfo.from_zmq(frames[1:])
    return {
        "name": case["name"],
        "inputs": i,
        "frames_hex": _hex(frames),
        "parsed_by_sglang": {
            "dst_kv_indices": _plain(info.dst_kv_indices),
            "dst_aux_index": info.dst_aux_index,
            "dst_state_indices": _plain(info.dst_state_indices),
            "required_dst_info_num": info.required_dst_info_num,
            "is_dummy": info.is_dummy,
            "decode_prefix_len": info.decode_prefix_len,
        },
    }


def group_concurrent_contiguous(ref: ModuleType, case: dict[str, Any]) -> dict[str, Any]:
    src_groups, dst_groups = ref.group_concurrent_contiguous(
        np.asarray(case["src"], dtype=np.int32), np.asarray(case["dst"], dtype=np.int32)
    )
    return {"src": case["src"], "dst": case["dst"], "src_groups": src_groups, "dst_groups": dst_groups}


def mamba_state_slice_byte_blocks(ref: ModuleType, case: dict[str, Any]) -> dict[str, Any]:
    blocks = ref.compute_mamba_state_slice_byte_blocks(**case["args"])
    return {"args": case["args"], "blocks": [list(b) for b in blocks]}


class _WriteLog:
    """The two ``MoriEngine`` calls ``_send_mamba_state`` makes; each ``batch_write`` is kept as
    ``[src_desc, dst_desc, src_offset, dst_offset, size]`` (the descs are tensor indices here)."""

    def __init__(self) -> None:
        self.writes: list[list[int]] = []

    def allocate_transfer_uid(self) -> int:
        return len(self.writes)

    def batch_write(self, src, src_offs, dst, dst_offs, sizes, uids) -> list[int]:  # type: ignore[no-untyped-def]
        self.writes += [[src[0], dst[0], src_offs[0][0], dst_offs[0][0], sizes[0][0]]]
        return list(uids)


def _sender(p: dict[str, Any], log: _WriteLog) -> SimpleNamespace:
    """The attributes of ``MoriKVManager`` (prefill side) that the three methods read."""
    return SimpleNamespace(
        kv_args=SimpleNamespace(
            engine_rank=p["engine_rank"],
            page_size=p["page_size"],
            kv_item_lens=[p["kv_item_len"]],
            kv_head_num=p["kv_head_num"],
            total_kv_head_num=p["total_kv_head_num"],
        ),
        attn_tp_size=p["attn_tp_size"],
        state_tp_size=p["attn_tp_size"],
        pp_size=1,
        engine=log,
        _record_submitted_statuses=lambda statuses: None,
    )


def tp_slice_writes(ref: ModuleType, case: dict[str, Any]) -> dict[str, Any]:
    """A prefill rank's KV head-slice writes and mamba slot writes to one decode rank whose registered
    engine rank may lie at or above its attention-TP size (DP attention)."""
    i = case["inputs"]
    p, d, log = i["prefill"], i["decode"], _WriteLog()
    sender = _sender(p, log)
    peer = SimpleNamespace(
        decode_tp_size=d["decode_tp_size"],
        decode_tp_rank=d["decode_tp_rank"],
        dst_kv_item_len=d["dst_kv_item_len"],
    )
    cfg = ref._build_tp_slice_config(sender, peer)
    plan = ref._build_tp_slice_transfer_plan(
        sender,
        np.asarray(i["kv_indices"], dtype=np.int32),
        np.asarray(i["dst_kv_indices"], dtype=np.int32),
        cfg,
    )
    n_src, n_dst = len(p["state_item_lens"]), len(d["dst_state_item_lens"])
    ref._send_mamba_state(
        sender,
        peer,
        np.asarray([i["state_index"]], dtype=np.int32),
        np.asarray([i["dst_state_index"]], dtype=np.int32),
        list(range(n_src)),
        list(range(n_dst)),
        p["state_item_lens"],
        d["dst_state_item_lens"],
        p["state_dim_per_tensor"],
        d["dst_state_dim_per_tensor"],
        p["state_conv_shard_groups"],
        p["state_slice_outer_counts"],
        p["state_layer_ids"],
        d["dst_state_layer_ids"],
    )
    kv = [list(w) for w in zip(plan.local_offsets, plan.remote_offsets, plan.sizes, strict=True)]
    return {"name": case["name"], "inputs": i, "kv_writes": kv, "mamba_writes": log.writes}


BUILDERS = {
    "pack_int_lists": pack_int_lists,
    "registration": registration,
    "transfer_metadata": transfer_metadata,
    "group_concurrent_contiguous": group_concurrent_contiguous,
    "mamba_state_slice_byte_blocks": mamba_state_slice_byte_blocks,
    "tp_slice_writes": tp_slice_writes,
}


def regenerate(ref: ModuleType, committed: dict[str, Any]) -> dict[str, Any]:
    """The vectors recomputed by ``ref`` (``sglang_ref.load()``) from ``committed``'s case definitions."""
    out: dict[str, Any] = {"about": ABOUT}
    for section, build in BUILDERS.items():
        out[section] = [{**build(ref, case), "source": SOURCES[section]} for case in committed[section]]
    return out


def render(vectors: dict[str, Any]) -> str:
    return json.dumps(vectors, indent=1) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed file differs")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from dataplane.harness.bench import sglang_ref

    try:
        ref = sglang_ref.load()
    except sglang_ref.ReferenceUnavailable as exc:
        print(f"regenerate: {exc}", file=sys.stderr)
        return 2
    text = render(regenerate(ref, json.loads(VECTORS.read_text())))
    if args.check:
        same = text == VECTORS.read_text()
        print(f"{VECTORS.name}: {'matches' if same else 'DIFFERS from'} sglang {sglang_ref.SGLANG_VERSION}")
        return 0 if same else 1
    VECTORS.write_text(text)
    print(f"wrote {VECTORS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
