"""``pdpair-agent wire``: encode and decode sglang-compatible MoRI messages as JSON, for debugging a
live peer or checking our codec against sglang's own output.

- ``wire encode --kind registration|metadata`` reads one JSON object shaped like a golden vector's
  ``inputs`` (plus an optional ``manifest`` object for registration) and prints ``{"frames_hex": [...]}``.
- ``wire decode --kind registration|metadata`` reads ``{"frames_hex": [...]}`` and prints the decoded
  fields under sglang's names (blobs as hex; the manifest as an object or null).

``engine_key`` and ``state_types`` in registration inputs are accepted and ignored: sglang does not
send them (the key is inside the EngineDesc blob; state types travel only in our manifest).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import msgspec

from ..errors import BadInput

KINDS = ("registration", "metadata")


class RegistrationInputs(msgspec.Struct):
    local_ip: str
    rank_port: int
    engine_desc: str
    kv_item_len: int
    attn_tp_size: int = 1
    tp_rank: int = 0
    gpu_id: int = 0
    kv_mem_descs: list[str] = []
    aux_mem_descs: list[str] = []
    state_mem_descs: list[list[str]] = []
    state_item_lens: list[list[int]] = []
    state_dim_per_tensor: list[list[int]] = []
    state_layer_ids: list[list[int]] = []
    kv_layer_ids: list[int] = []
    dcp_size: int = 1
    dcp_rank: int = 0
    engine_key: str = ""
    state_types: list[str] = []
    manifest: dict[str, Any] | None = None


class MetadataInputs(msgspec.Struct):
    room: int
    local_ip: str
    rank_port: int
    engine_key: str
    kv_indices: list[int] = []
    aux_index: int | None = None
    state_indices: list[list[int] | None] | None = None
    required_dst_info_num: int = 1
    is_dummy: bool = False
    decode_prefix_len: int | None = None


class FramesInput(msgspec.Struct):
    frames_hex: list[str]


def register(subparsers: Any) -> None:
    wire = subparsers.add_parser("wire", help="encode/decode sglang MoRI wire messages as JSON")
    sub = wire.add_subparsers(dest="wire_command", required=True, metavar="ACTION")
    enc = sub.add_parser("encode", help="JSON inputs on stdin -> {\"frames_hex\": [...]}")
    enc.add_argument("--kind", choices=KINDS, required=True)
    enc.set_defaults(handler=_encode)
    dec = sub.add_parser("decode", help="{\"frames_hex\": [...]} on stdin -> decoded fields as JSON")
    dec.add_argument("--kind", choices=KINDS, required=True)
    dec.add_argument("--legacy-flat-state", action="store_true",
                     help="metadata from a peer that registered with the old flat state layout")
    dec.set_defaults(handler=_decode)


def _read(type_: type[Any]) -> Any:
    try:
        return msgspec.json.decode(sys.stdin.read().encode("utf-8", errors="replace"), type=type_)
    except msgspec.MsgspecError as exc:
        raise BadInput(f"stdin: {exc}") from None


def _unhex(text: str, field: str) -> bytes:
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise BadInput(f"{field}: not a hex string: {text[:32]!r}") from None


def _encode(args: argparse.Namespace) -> int:
    from ..codec import encode_metadata, encode_registration

    if args.kind == "registration":
        frames = encode_registration(_registration(_read(RegistrationInputs)))
    else:
        frames = encode_metadata(_metadata(_read(MetadataInputs)))
    print(json.dumps({"frames_hex": [f.hex() for f in frames]}))
    return 0


def _registration(i: RegistrationInputs) -> Any:
    from ..codec import Manifest, Registration

    try:
        manifest = None if i.manifest is None else msgspec.convert(i.manifest, Manifest)
    except msgspec.MsgspecError as exc:
        raise BadInput(f"manifest: {exc}") from None
    return Registration(
        endpoint=i.local_ip, dst_port=i.rank_port, engine_desc=_unhex(i.engine_desc, "engine_desc"),
        dst_kv_mem_descs=tuple(_unhex(x, "kv_mem_descs") for x in i.kv_mem_descs),
        dst_aux_mem_descs=tuple(_unhex(x, "aux_mem_descs") for x in i.aux_mem_descs),
        dst_state_mem_descs=tuple(tuple(_unhex(x, "state_mem_descs") for x in c) for c in i.state_mem_descs),
        gpu_id=i.gpu_id, decode_tp_size=i.attn_tp_size, decode_tp_rank=i.tp_rank,
        dst_kv_item_len=i.kv_item_len,
        dst_state_item_lens=tuple(map(tuple, i.state_item_lens)),
        dst_state_dim_per_tensor=tuple(map(tuple, i.state_dim_per_tensor)),
        dcp_size=i.dcp_size, dcp_rank=i.dcp_rank,
        dst_state_layer_ids=tuple(map(tuple, i.state_layer_ids)), dst_kv_layer_ids=tuple(i.kv_layer_ids),
        manifest=manifest,
    )


def _metadata(i: MetadataInputs) -> Any:
    import numpy as np

    from ..codec import TransferMetadata

    return TransferMetadata(
        room=i.room, endpoint=i.local_ip, dst_port=i.rank_port, engine_key=i.engine_key,
        dst_kv_indices=np.asarray(i.kv_indices),
        dst_aux_index=-1 if i.aux_index is None else i.aux_index,
        dst_state_indices=tuple(np.asarray(s or []) for s in i.state_indices or ()),
        required_dst_info_num=i.required_dst_info_num, is_dummy=i.is_dummy,
        decode_prefix_len=i.decode_prefix_len,
    )


def _decode(args: argparse.Namespace) -> int:
    from ..codec import decode_metadata, decode_registration

    frames = [_unhex(h, f"frames_hex[{n}]") for n, h in enumerate(_read(FramesInput).frames_hex)]
    if args.kind == "registration":
        out = registration_fields(decode_registration(frames))
    else:
        out = metadata_fields(decode_metadata(frames, legacy_flat_state=args.legacy_flat_state))
    print(json.dumps(out))
    return 0


def registration_fields(reg: Any) -> dict[str, Any]:
    """A decoded ``Registration`` as JSON-ready fields under sglang's names."""
    out = msgspec.to_builtins(reg)
    out["engine_desc"] = reg.engine_desc.hex()
    out["dst_kv_mem_descs"] = [b.hex() for b in reg.dst_kv_mem_descs]
    out["dst_aux_mem_descs"] = [b.hex() for b in reg.dst_aux_mem_descs]
    out["dst_state_mem_descs"] = [[b.hex() for b in c] for c in reg.dst_state_mem_descs]
    out["n_state_mem_descs"] = [len(c) for c in reg.dst_state_mem_descs]
    out["plain_sglang_peer"] = reg.plain_sglang_peer
    return dict(out)


def metadata_fields(meta: Any) -> dict[str, Any]:
    """A decoded ``TransferMetadata`` as JSON-ready fields under sglang's names."""
    return {
        "room": meta.room,
        "endpoint": meta.endpoint,
        "dst_port": meta.dst_port,
        "engine_key": meta.engine_key,
        "dst_kv_indices": meta.dst_kv_indices.tolist(),
        "dst_aux_index": meta.dst_aux_index,
        "dst_state_indices": [a.tolist() for a in meta.dst_state_indices],
        "required_dst_info_num": meta.required_dst_info_num,
        "is_dummy": meta.is_dummy,
        "decode_prefix_len": meta.decode_prefix_len,
    }
