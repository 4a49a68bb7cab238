"""Local API messages and frames: round trips, index packing, and clear errors for bad input."""

from __future__ import annotations

import os
import socket

import msgspec
import numpy as np
import pytest

from dataplane.errors import FrameTooLarge, WireFormatError
from dataplane.localapi.messages import (
    LOCALAPI_VERSION,
    Abort,
    Ack,
    Error,
    Expect,
    Hello,
    Poll,
    PoolRegion,
    RegisterPools,
    RoomState,
    RoomStates,
    Send,
    Welcome,
    decode_agent_message,
    decode_engine_message,
    encode_message,
    pack_indices,
    unpack_indices,
)
from dataplane.localapi.stream import Closed, FrameReader, send_frame

ENGINE = [
    Hello(version=LOCALAPI_VERSION, role="prefill", engine_id="e", manifest=b"PDPM\x01x", pid=7, seq=1),
    RegisterPools(regions=(
        PoolRegion(name="kv.0", component=-1, tensor=0, size=4096, kind="fd", offset=0, fd_index=0),
        PoolRegion(name="mamba.0", component=0, tensor=0, size=64, kind="cuda_ipc", handle=b"h" * 64),
        PoolRegion(name="aux.0", component=-2, tensor=0, size=8, kind="shm", shm_name="pdpair-x"),
    ), seq=2),
    Send(room=5, kv=pack_indices([1, 2, 3]), aux=0, state=(pack_indices([4]), b""), seq=3),
    Expect(room=5, kv=pack_indices([7]), state=(pack_indices([1]),), prefix_len=64, seq=4),
    Poll(rooms=(5, 6), seq=5),
    Abort(room=5, reason="client gone", seq=6),
]
AGENT = [
    Welcome(version=1, agent_id="a", max_frame=1 << 20, seq=1),
    Ack(seq=2),
    Error(code="bad_request", message="kv: item index 9 outside", seq=3),
    RoomState(room=5, state=2, kv_items=3, aux=True, state_items=(1, 0)),
    RoomStates(states=(RoomState(room=5, state=0, reason="x"),), seq=4),
]


@pytest.mark.parametrize("msg", ENGINE, ids=lambda m: type(m).__name__)
def test_engine_messages_round_trip(msg):
    assert decode_engine_message(encode_message(msg)) == msg


@pytest.mark.parametrize("msg", AGENT, ids=lambda m: type(m).__name__)
def test_agent_messages_round_trip(msg):
    assert decode_agent_message(encode_message(msg)) == msg


def test_each_side_refuses_the_other_sides_messages():
    with pytest.raises(WireFormatError):
        decode_engine_message(encode_message(Ack(seq=1)))
    with pytest.raises(WireFormatError):
        decode_agent_message(encode_message(ENGINE[0]))


@pytest.mark.parametrize(
    "payload",
    [b"", b"\xc1", msgspec.msgpack.encode({"type": "send"}), msgspec.msgpack.encode({"type": "nope"}),
     msgspec.msgpack.encode({"type": "send", "room": -1}),
     msgspec.msgpack.encode({"type": "send", "room": 1, "aux": 2**40})],
)
def test_malformed_messages_raise_wire_format_error(payload):
    with pytest.raises(WireFormatError, match="local API message"):
        decode_engine_message(payload)


def test_indices_pack_as_int32_and_refuse_bad_input():
    arr = unpack_indices(pack_indices(np.array([0, 5, 2**31 - 1])))
    assert arr.dtype == np.int32 and arr.tolist() == [0, 5, 2**31 - 1]
    assert pack_indices(None) == b"" and unpack_indices(b"").size == 0
    with pytest.raises(WireFormatError, match="whole number"):
        unpack_indices(b"\x00\x00\x00")
    with pytest.raises(WireFormatError, match="negative"):
        unpack_indices(np.array([-3], dtype="<i4").tobytes())
    with pytest.raises(WireFormatError, match=r"0\.\.2"):
        pack_indices([-1])


def test_frames_round_trip_and_carry_descriptors():
    a, b = socket.socketpair()
    fd = os.memfd_create("pdpair-test")
    try:
        send_frame(a, b"hello", [fd])
        send_frame(a, b"x" * 100_000)
        reader = FrameReader(b, max_frame=1 << 20)
        assert reader.read() == b"hello"
        (got,) = reader.take_fds()
        assert os.fstat(got).st_ino == os.fstat(fd).st_ino
        os.close(got)
        assert reader.read() == b"x" * 100_000
        a.close()
        with pytest.raises(Closed):
            reader.read()
    finally:
        os.close(fd)
        b.close()


def test_oversized_frame_is_refused_before_its_body_is_read():
    a, b = socket.socketpair()
    with a, b:
        a.sendall((10_000_000).to_bytes(4, "big"))
        with pytest.raises(FrameTooLarge, match=r"10000000 bytes exceeds the maximum of 4096"):
            FrameReader(b, max_frame=4096).read()


def test_torn_frame_is_a_closed_connection():
    a, b = socket.socketpair()
    with b:
        a.sendall((100).to_bytes(4, "big") + b"abc")
        a.close()
        with pytest.raises(Closed, match="inside a frame"):
            FrameReader(b).read()
