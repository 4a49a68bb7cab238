"""``codec.frame_kind``: every message the control sockets take is told apart by the codec, from the
real encoders' frames; anything else is a wire-format error."""

import numpy as np
import pytest

from dataplane.codec import (
    GUARD,
    FrameKind,
    Heartbeat,
    KVPoll,
    Registration,
    StatusMessage,
    TransferMetadata,
    encode_control,
    encode_metadata,
    encode_registration,
    encode_status,
    frame_kind,
)
from dataplane.errors import WireFormatError


def registration_frames() -> list[bytes]:
    reg = Registration(
        endpoint="127.0.0.1",
        dst_port=5000,
        engine_desc=b"e",
        dst_kv_mem_descs=(b"k",),
        dst_aux_mem_descs=(b"a",),
        dst_state_mem_descs=(),
        gpu_id=0,
        decode_tp_size=1,
        decode_tp_rank=0,
        dst_kv_item_len=64,
        dst_state_item_lens=(),
        dst_state_dim_per_tensor=(),
        dst_state_layer_ids=(),
        dst_kv_layer_ids=(0,),
    )
    return encode_registration(reg)


def metadata(**kw) -> list[bytes]:
    md = TransferMetadata(
        room=7,
        endpoint="127.0.0.1",
        dst_port=5000,
        engine_key="d@x",
        dst_kv_indices=np.arange(3, dtype=np.int32),
        dst_aux_index=-1,
        dst_state_indices=(),
        required_dst_info_num=1,
        **kw,
    )
    return encode_metadata(md)


def test_each_kind_from_its_encoder():
    assert frame_kind([encode_control(Heartbeat(agent_id="a", seq=1, time_ns=1))]) is FrameKind.CONTROL
    assert frame_kind(metadata()) is FrameKind.METADATA
    assert frame_kind(metadata(decode_prefix_len=64)) is FrameKind.METADATA
    ok = encode_status(StatusMessage(room=7, status=KVPoll.Success, prefill_rank=0))
    failed = encode_status(StatusMessage(room=7, status=KVPoll.Failed, prefill_rank=1, failure_reason="x"))
    assert frame_kind(ok) is FrameKind.STATUS and frame_kind(failed) is FrameKind.STATUS
    assert frame_kind(registration_frames()) is FrameKind.REGISTRATION


@pytest.mark.parametrize("frames", [[], [b"junk", b"more"], [b"x"] * 7, [GUARD[:-1], b"1", b"2", b"3"]])
def test_anything_else_is_refused(frames):
    with pytest.raises(WireFormatError, match="unrecognised control message"):
        frame_kind(frames)
