"""Registration, metadata and status beyond the vectors: our manifest frame, plain sglang peers, the old
flat state layout, shape checks and bad frames."""

from __future__ import annotations

import struct

import msgspec
import numpy as np
import pytest
from codec_vectors import VECTORS, frames_of, registration_from_inputs

from dataplane.codec import (
    GUARD,
    REGISTRATION_FRAMES,
    KVPoll,
    StatusMessage,
    advance,
    decode_metadata,
    decode_registration,
    decode_status,
    encode_manifest,
    encode_registration,
    encode_status,
    engine_key_of,
    manifest_from_schema,
)
from dataplane.errors import UnknownStateType, WireFormatError
from dataplane.schema import Component, KVSpec, RoleSchema, TensorSpec

HYBRID = next(c for c in VECTORS["registration"] if c["name"] == "hybrid-mamba")
DP_RANK = next(c for c in VECTORS["registration"] if c["name"] == "dp-attention-rank-5-of-attn-tp-2")
TRIPLE = next(c for c in VECTORS["registration"] if c["name"] == "mamba+swa+dsa")
META = next(c for c in VECTORS["transfer_metadata"] if c["name"] == "mamba+swa+dsa-with-none")


def hybrid_schema() -> RoleSchema:
    """The decode rank the hybrid-mamba vector describes."""
    tensors = tuple(
        TensorSpec(item_len=n, layer_id=layer, tp_dim=d)
        for n, d, layer in ((6144, 3072, 0), (1048576, 16, 0), (6144, 3072, 2), (1048576, 16, 2))
    )
    return RoleSchema(
        model="qwen3-next",
        tp_size=2,
        tp_rank=1,
        kv=KVSpec(item_len=4096, num_pages=1024, layer_ids=(1, 3)),
        components=(Component("mamba", "mamba", tensors, num_items=16),),
    )


def with_manifest(case=HYBRID, schema=None):
    reg = registration_from_inputs(case["inputs"])
    manifest = manifest_from_schema(schema or hybrid_schema(), role="decode", generation="abc123")
    return msgspec.structs.replace(reg, manifest=manifest)


def test_manifest_rides_as_trailing_frame_after_sglang_frames() -> None:
    frames = encode_registration(with_manifest())
    assert len(frames) == REGISTRATION_FRAMES + 1
    assert [f.hex() for f in frames[:REGISTRATION_FRAMES]] == HYBRID["frames_hex"]
    assert frames[-1].startswith(b"PDPM\x01")
    reg = decode_registration(frames)
    assert not reg.plain_sglang_peer
    assert reg.manifest == manifest_from_schema(hybrid_schema(), role="decode", generation="abc123")


def test_plain_sglang_peer_and_unknown_trailing_frames_are_tolerated() -> None:
    reg = decode_registration([*frames_of(HYBRID), b"something newer sglang added"])
    assert reg.plain_sglang_peer and reg.manifest is None


def test_manifest_that_contradicts_the_frames_is_rejected() -> None:
    frames = encode_registration(with_manifest())
    bad = manifest_from_schema(hybrid_schema(), role="decode")
    bad = msgspec.structs.replace(bad, kv=msgspec.structs.replace(bad.kv, item_len=8192))
    with pytest.raises(WireFormatError, match="manifest kv item_len 8192"):
        decode_registration([*frames[:-1], encode_manifest(bad)])


def test_a_dp_attention_rank_is_its_rank_in_the_attention_group() -> None:
    """sglang registers a DP-attention decode rank by its engine rank (5) with its attention-TP size (2)
    and uses it modulo the size: the manifest of attention rank 1 describes it, one of rank 0 does not."""
    reg = decode_registration(frames_of(DP_RANK))
    assert (reg.decode_tp_rank, reg.decode_tp_size, reg.decode_attn_tp_rank) == (5, 2, 1)
    frames = encode_registration(with_manifest(DP_RANK))
    assert decode_registration(frames).manifest is not None
    other = manifest_from_schema(msgspec.structs.replace(hybrid_schema(), tp_rank=0), role="decode")
    with pytest.raises(WireFormatError, match=r"tp rank/size 0/2 but frames say 5/2 \(attention rank 1\)"):
        decode_registration([*frames[:-1], encode_manifest(other)])


def test_manifest_with_unknown_state_type_raises_unknown_state_type() -> None:
    frames = encode_registration(with_manifest())
    m = manifest_from_schema(hybrid_schema(), role="decode")
    comp = msgspec.structs.replace(m.components[0], state_type="warp_drive")
    body = msgspec.msgpack.encode(msgspec.structs.replace(m, components=(comp,)))
    with pytest.raises(UnknownStateType, match="warp_drive"):
        decode_registration([*frames[:-1], b"PDPM\x01" + body])


def old_flat_frames() -> list[bytes]:
    """What sglang's MoRI backend sent before the per-component schema (PR #24932)."""
    i = HYBRID["inputs"]
    descs = [bytes.fromhex(x) for x in i["state_mem_descs"][0]]
    frames = frames_of(HYBRID)[:12]
    frames[7] = msgspec.msgpack.encode(descs)
    lens, dims = i["state_item_lens"][0], i["state_dim_per_tensor"][0]
    return [*frames, b"".join(struct.pack("I", x) for x in lens), b"".join(struct.pack("I", x) for x in dims)]


def test_old_flat_state_layout_is_converted_to_one_component() -> None:
    reg = decode_registration(old_flat_frames())
    assert reg.legacy_flat_state
    assert [len(c) for c in reg.dst_state_mem_descs] == [4]
    assert reg.dst_state_item_lens == ((6144, 1048576, 6144, 1048576),)
    assert reg.dst_state_dim_per_tensor == ((3072, 16, 3072, 16),)
    assert (reg.dcp_size, reg.dcp_rank, reg.dst_kv_layer_ids) == (1, 0, ())
    with pytest.raises(WireFormatError, match="only decoded"):
        encode_registration(reg)


def test_old_flat_metadata_state_is_one_raw_array() -> None:
    frames = frames_of(META)[:9]
    frames[7] = np.array([3, 10, 11], dtype="<i4").tobytes()
    meta = decode_metadata(frames, legacy_flat_state=True)
    assert [a.tolist() for a in meta.dst_state_indices] == [[3, 10, 11]]
    assert meta.decode_prefix_len is None


@pytest.mark.parametrize(
    ("index", "value", "needle"),
    [
        (
            12,
            struct.pack("<3I", 2, 4, 4) + b"\x00" * 8,
            "dst_state_item_lens has 2 components but dst_state_mem_descs has 3",
        ),
        (13, struct.pack("<3I", 2, 0, 0), "dst_state_dim_per_tensor has 2 components"),
        (
            16,
            struct.pack("<4I", 3, 4, 0, 0) + b"\x00" * 4,
            "dst_state_layer_ids: component 0 has 1 entries but 2",
        ),
        (7, b"\x93\x01\x02\x03", "dst_state_mem_descs: not a msgpack list of lists"),
        (5, b"\xc1garbage", "dst_kv_mem_descs: not a msgpack list"),
        (9, b"0", "decode_tp_size: 0 out of range"),
        (10, b"-1", "decode_tp_rank: -1 out of range 0.."),
        (3, b"+1", "dst_port: expected an ASCII decimal"),
        (3, "\uff13\uff16".encode(), "dst_port: expected an ASCII decimal"),
        (3, b"99999", "dst_port: 99999 out of range"),
        (11, b"1" * 30, "dst_kv_item_len: expected an ASCII decimal"),
        (2, b"\xff\xfe", "endpoint: expected printable ASCII"),
        (1, b"42", "frame 1 must be b'None'"),
        (0, b"NotTheGuard", "guard"),
        (4, b"", "engine_desc"),
    ],
)
def test_registration_rejects_bad_frames(index: int, value: bytes, needle: str) -> None:
    frames = frames_of(TRIPLE)
    frames[index] = value
    with pytest.raises(WireFormatError, match=needle):
        decode_registration(frames)


def test_registration_needs_the_frames_sglang_reads() -> None:
    with pytest.raises(WireFormatError, match="at least 12 frames, got 11"):
        decode_registration(frames_of(TRIPLE)[:11])
    with pytest.raises(WireFormatError, match="sequence of frames"):
        decode_registration(GUARD)
    with pytest.raises(WireFormatError, match="frame 1 is a str"):
        decode_registration([GUARD, "None"])  # type: ignore[list-item]
    with pytest.raises(WireFormatError, match="frame 1 is a int"):
        decode_registration([GUARD, 1])  # type: ignore[list-item]
    zero_copy = [memoryview(f) for f in frames_of(TRIPLE)]
    assert decode_registration(zero_copy) == decode_registration(frames_of(TRIPLE))  # type: ignore[arg-type]


def test_encode_registration_validates_component_shapes() -> None:
    reg = registration_from_inputs(TRIPLE["inputs"])
    bad = msgspec.structs.replace(reg, dst_state_item_lens=reg.dst_state_item_lens[:2])
    with pytest.raises(WireFormatError, match="2 components but dst_state_mem_descs has 3"):
        encode_registration(bad)
    with pytest.raises(WireFormatError, match="endpoint"):
        encode_registration(msgspec.structs.replace(reg, endpoint="hôst"))


@pytest.mark.parametrize(
    ("index", "value", "needle"),
    [
        (1, b"None", "registration message"),
        (1, b"-5", "room: -5 out of range"),
        (5, b"\x00" * 6, "dst_kv_indices: 6 bytes"),
        (6, b"x", "dst_aux_index"),
        (7, b"\x01\x00\x00", "dst_state_indices: truncated header"),
        (8, b"", "required_dst_info_num"),
        (9, b"12a", "decode_prefix_len"),
    ],
)
def test_metadata_rejects_bad_frames(index: int, value: bytes, needle: str) -> None:
    frames = frames_of(META)
    frames[index] = value
    with pytest.raises(WireFormatError, match=needle):
        decode_metadata(frames)


def test_metadata_tolerates_the_older_shorter_layouts_like_sglang() -> None:
    meta = decode_metadata(frames_of(META)[:7])
    assert meta.dst_state_indices == () and meta.required_dst_info_num == 1 and meta.decode_prefix_len is None
    with pytest.raises(WireFormatError, match="at least 7 frames"):
        decode_metadata(frames_of(META)[:6])


def test_engine_key_is_read_from_the_engine_desc_blob() -> None:
    assert engine_key_of(bytes.fromhex(HYBRID["inputs"]["engine_desc"])) == "decode-0-engine"
    with pytest.raises(WireFormatError, match="engine key"):
        engine_key_of(b"\x91\x01")


def test_status_round_trip_and_sglang_layout() -> None:
    msg = StatusMessage(room=7, status=KVPoll.Failed, prefill_rank=3, failure_reason="boom ✗")
    frames = encode_status(msg)
    assert frames == [GUARD, b"7", b"0", b"3", "boom ✗".encode()]
    assert decode_status(frames) == msg
    ok = decode_status([GUARD, b"9", b"4", b"0"])
    assert ok.status is KVPoll.Success and ok.failure_reason is None


@pytest.mark.parametrize(
    ("frames", "needle"),
    [
        ([GUARD, b"7", b"5", b"0", b""], "status: 5 out of range"),
        ([GUARD, b"7", b"4"], "at least 4 frames"),
        ([GUARD, b"7", b"4", b"0", b"\xff"], "not UTF-8"),
    ],
)
def test_status_rejects_bad_frames(frames: list[bytes], needle: str) -> None:
    with pytest.raises(WireFormatError, match=needle):
        decode_status(frames)


def test_advance_is_monotonic_and_failed_is_terminal() -> None:
    assert advance(KVPoll.Bootstrapping, KVPoll.WaitingForInput) is KVPoll.WaitingForInput
    assert advance(KVPoll.Transferring, KVPoll.Bootstrapping) is KVPoll.Transferring
    assert advance(KVPoll.Transferring, KVPoll.Failed) is KVPoll.Failed
    assert advance(KVPoll.Failed, KVPoll.Success) is KVPoll.Failed
    assert advance(KVPoll.Success, KVPoll.Failed) is KVPoll.Failed
