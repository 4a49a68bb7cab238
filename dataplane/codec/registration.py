"""The registration message (decode → prefill), byte-compatible with sglang 0.5.23 MoRI, plus our
trailing manifest frame.

Frames (index: content): 0 guard, 1 ``b"None"``, 2 ip, 3 rank_port, 4 EngineDesc blob, 5 KV MemoryDesc
list, 6 aux MemoryDesc list, 7 state MemoryDesc lists (per component), 8 gpu_id, 9 decode_tp_size,
10 decode_tp_rank, 11 kv_item_len, 12 ``pack_int_lists(state_item_lens, "I")``, 13
``pack_int_lists(state_dim_per_tensor, "I")``, 14 dcp_size, 15 dcp_rank, 16
``pack_int_lists(state_layer_ids, "I")``, 17 kv_layer_ids as raw ``<I``, 18 (ours) the manifest.
sglang reads fixed positions and ignores frame 18.

``decode_tp_rank`` is the decode scheduler's engine rank and ``decode_tp_size`` its attention-TP size;
with DP attention the rank is at or above the size and sglang uses it modulo the size, so any
non-negative rank is accepted here and ``Registration.decode_attn_tp_rank`` gives the rank in the group.

Old flat layout (sglang before the per-component schema, PR #24932): frame 7 was one msgpack list of
bin for all state tensors and frames 12/13 raw ``<I`` arrays. ``decode_registration`` CONVERTS it to a
single-component layout (old sglang had exactly one state type per model) and sets
``legacy_flat_state``; the matching metadata must then be decoded with ``legacy_flat_state=True``.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from ..errors import WireFormatError
from .frames import (
    GUARD,
    blob_list_frame,
    blob_lists_frame,
    check_frames,
    int_frame,
    parse_blob_list,
    parse_blob_lists,
    parse_int,
    parse_str,
    str_frame,
)
from .ints import pack_array, pack_int_lists, unpack_int_tuples, unpack_tuple
from .manifest import Manifest, decode_manifest, encode_manifest, is_manifest_frame

REGISTRATION_FRAMES = 18
"""sglang 0.5.23's frame count, guard included; our manifest is frame 18."""
MIN_REGISTRATION_FRAMES = 12
"""The oldest layout sglang still parses: up to kv_item_len."""
I32_MAX = 2**31 - 1

IntLists = tuple[tuple[int, ...], ...]


class Registration(msgspec.Struct, frozen=True, kw_only=True):
    """sglang's ``KVArgsRegisterInfo`` with descriptor blobs kept opaque, plus our manifest."""

    endpoint: str
    dst_port: int
    engine_desc: bytes
    dst_kv_mem_descs: tuple[bytes, ...] = ()
    dst_aux_mem_descs: tuple[bytes, ...] = ()
    dst_state_mem_descs: tuple[tuple[bytes, ...], ...] = ()
    gpu_id: int = 0
    decode_tp_size: int = 1
    """The decode engine's attention-TP size."""
    decode_tp_rank: int = 0
    """The decode scheduler's engine rank, as sglang sends it: with DP attention its global rank, at or
    above ``decode_tp_size``; its rank in the attention-TP group is ``decode_attn_tp_rank``."""
    dst_kv_item_len: int
    dst_state_item_lens: IntLists = ()
    dst_state_dim_per_tensor: IntLists = ()
    dcp_size: int = 1
    dcp_rank: int = 0
    dst_state_layer_ids: IntLists = ()
    dst_kv_layer_ids: tuple[int, ...] = ()
    manifest: Manifest | None = None
    legacy_flat_state: bool = False
    """Decoded from the old flat state layout (only ever set by the decoder)."""

    @property
    def decode_attn_tp_rank(self) -> int:
        """The rank within the attention-TP group: ``decode_tp_rank % decode_tp_size``, as sglang's
        MoRI sender computes it (``_send_mamba_state``, ``compute_head_slice_params``)."""
        return self.decode_tp_rank % self.decode_tp_size

    @property
    def plain_sglang_peer(self) -> bool:
        """No manifest frame: an sglang decode rank (or an older agent); use the sglang layout as is."""
        return self.manifest is None


def _check_shape(reg: Registration) -> None:
    """Per-component lists must agree: one entry per component, one value per tensor."""
    n = len(reg.dst_state_mem_descs)
    tensors = [len(c) for c in reg.dst_state_mem_descs]
    if len(reg.dst_state_item_lens) != n:
        raise WireFormatError(
            f"dst_state_item_lens has {len(reg.dst_state_item_lens)} components "
            f"but dst_state_mem_descs has {n}"
        )
    named = (
        ("dst_state_item_lens", reg.dst_state_item_lens, False),
        ("dst_state_dim_per_tensor", reg.dst_state_dim_per_tensor, True),
        ("dst_state_layer_ids", reg.dst_state_layer_ids, True),
    )
    for name, lists, optional in named:
        if optional and not lists:
            continue
        if len(lists) != n:
            raise WireFormatError(f"{name} has {len(lists)} components but dst_state_mem_descs has {n}")
        for c, (values, count) in enumerate(zip(lists, tensors, strict=True)):
            if len(values) != count and not (optional and not values):
                raise WireFormatError(
                    f"{name}: component {c} has {len(values)} entries but {count} state descriptors"
                )
    if reg.decode_tp_rank < 0 or reg.decode_tp_size < 1:
        raise WireFormatError(
            f"decode_tp_rank {reg.decode_tp_rank} / tp size {reg.decode_tp_size} out of range"
        )
    if not 0 <= reg.dcp_rank < reg.dcp_size:
        raise WireFormatError(f"dcp_rank {reg.dcp_rank} out of range for dcp size {reg.dcp_size}")


def _check_manifest(reg: Registration, m: Manifest) -> None:
    """The manifest describes the same memory the sglang frames do, or the peer is lying/broken."""
    if (m.tp_size, m.tp_rank) != (reg.decode_tp_size, reg.decode_attn_tp_rank):
        raise WireFormatError(
            f"manifest says tp rank/size {m.tp_rank}/{m.tp_size} but frames say "
            f"{reg.decode_tp_rank}/{reg.decode_tp_size} (attention rank {reg.decode_attn_tp_rank})"
        )
    if m.kv.item_len != reg.dst_kv_item_len:
        raise WireFormatError(
            f"manifest kv item_len {m.kv.item_len} ≠ frame kv_item_len {reg.dst_kv_item_len}"
        )
    frame_lens = [list(x) for x in reg.dst_state_item_lens]
    manifest_lens = [list(c.item_lens) for c in m.components]
    if frame_lens != manifest_lens:
        raise WireFormatError(
            f"manifest state item lens {manifest_lens} ≠ frame state item lens {frame_lens}"
        )


def encode_registration(msg: Registration) -> list[bytes]:
    """Frames as sglang 0.5.23 sends them, then the manifest frame when ``msg.manifest`` is set."""
    if msg.legacy_flat_state:
        raise WireFormatError("the old flat state layout is only decoded, never sent")
    _check_shape(msg)
    if msg.manifest is not None:
        _check_manifest(msg, msg.manifest)
    frames = [
        GUARD,
        b"None",
        str_frame(msg.endpoint, field="endpoint"),
        int_frame(msg.dst_port, field="dst_port", hi=65535),
        bytes(msg.engine_desc),
        blob_list_frame(msg.dst_kv_mem_descs),
        blob_list_frame(msg.dst_aux_mem_descs),
        blob_lists_frame(msg.dst_state_mem_descs),
        int_frame(msg.gpu_id, field="gpu_id", lo=-1, hi=I32_MAX),
        int_frame(msg.decode_tp_size, field="decode_tp_size", lo=1, hi=I32_MAX),
        int_frame(msg.decode_tp_rank, field="decode_tp_rank", hi=I32_MAX),
        int_frame(msg.dst_kv_item_len, field="dst_kv_item_len"),
        pack_int_lists(msg.dst_state_item_lens, "I", what="dst_state_item_lens"),
        pack_int_lists(msg.dst_state_dim_per_tensor, "I", what="dst_state_dim_per_tensor"),
        int_frame(msg.dcp_size, field="dcp_size", lo=1, hi=I32_MAX),
        int_frame(msg.dcp_rank, field="dcp_rank", hi=I32_MAX),
        pack_int_lists(msg.dst_state_layer_ids, "I", what="dst_state_layer_ids"),
        pack_array(msg.dst_kv_layer_ids, "I", what="dst_kv_layer_ids"),
    ]
    if msg.manifest is not None:
        frames.append(encode_manifest(msg.manifest))
    return frames


def _opt(frames: list[bytes], i: int) -> bytes:
    return frames[i] if len(frames) > i else b""


def _int_lists(frame: bytes, *, field: str, flat: bool) -> IntLists:
    if flat:
        values = unpack_tuple(frame, "I", what=field)
        return (values,) if values else ()
    return unpack_int_tuples(frame, "I", what=field)


def decode_registration(frames: Sequence[bytes]) -> Registration:
    """Parse untrusted frames; raises ``WireFormatError`` (or ``UnknownStateType`` from the manifest)."""
    f = check_frames(frames, kind="registration", min_frames=MIN_REGISTRATION_FRAMES)
    if f[1] != b"None":
        raise WireFormatError(
            f"registration: frame 1 must be b'None', got {f[1][:32]!r} (a metadata message?)"
        )
    if not f[4]:
        raise WireFormatError("registration: frame 4 (engine_desc) is empty")
    state_descs, flat = parse_blob_lists(f[7], field="dst_state_mem_descs")
    opt_size = _opt(f, 14)
    reg = Registration(
        endpoint=parse_str(f[2], field="endpoint"),
        dst_port=parse_int(f[3], field="dst_port", hi=65535),
        engine_desc=f[4],
        dst_kv_mem_descs=parse_blob_list(f[5], field="dst_kv_mem_descs"),
        dst_aux_mem_descs=parse_blob_list(f[6], field="dst_aux_mem_descs"),
        dst_state_mem_descs=state_descs,
        gpu_id=parse_int(f[8], field="gpu_id", lo=-1, hi=I32_MAX),
        decode_tp_size=parse_int(f[9], field="decode_tp_size", lo=1, hi=I32_MAX),
        decode_tp_rank=parse_int(f[10], field="decode_tp_rank", hi=I32_MAX),
        dst_kv_item_len=parse_int(f[11], field="dst_kv_item_len"),
        dst_state_item_lens=_int_lists(_opt(f, 12), field="dst_state_item_lens", flat=flat),
        dst_state_dim_per_tensor=_int_lists(_opt(f, 13), field="dst_state_dim_per_tensor", flat=flat),
        dcp_size=parse_int(opt_size, field="dcp_size", lo=1, hi=I32_MAX) if opt_size else 1,
        dcp_rank=parse_int(_opt(f, 15), field="dcp_rank", hi=I32_MAX) if _opt(f, 15) else 0,
        dst_state_layer_ids=_int_lists(_opt(f, 16), field="dst_state_layer_ids", flat=False),
        dst_kv_layer_ids=unpack_tuple(_opt(f, 17), "I", what="dst_kv_layer_ids"),
        legacy_flat_state=flat,
    )
    _check_shape(reg)
    if len(f) > REGISTRATION_FRAMES and is_manifest_frame(f[REGISTRATION_FRAMES]):
        manifest = decode_manifest(f[REGISTRATION_FRAMES])
        _check_manifest(reg, manifest)
        reg = msgspec.structs.replace(reg, manifest=manifest)
    return reg


def engine_key_of(engine_desc: bytes) -> str:
    """The engine key inside a MoRI ``EngineDesc`` blob (its first msgpack field in mori 1.2.4), which
    the metadata messages name as ``engine_key``. Only this field is read; the blob stays opaque."""
    try:
        fields = msgspec.msgpack.decode(engine_desc, type=list[msgspec.Raw])
        if not fields:
            raise WireFormatError("engine_desc: empty msgpack array, no engine key")
        return msgspec.msgpack.decode(fields[0], type=str)
    except msgspec.MsgspecError as exc:
        raise WireFormatError(f"engine_desc: cannot read the engine key ({exc})") from None
