"""Our tagged control messages: one typed decoder, round trips, and clean errors on garbage."""

from __future__ import annotations

import msgspec
import pytest

from dataplane.codec import Abort, Heartbeat, Hello, Refused, decode_control, encode_control
from dataplane.errors import WireFormatError

MESSAGES = [
    Hello(agent_id="decode-0", role="decode", generation="abc", manifest=b"PDPM\x01\x80"),
    Hello(agent_id="prefill-0", role="prefill"),
    Refused(reason="component 1 is `swa` on prefill but `dsa` on decode"),
    Heartbeat(agent_id="decode-0", seq=12, time_ns=1_700_000_000_000_000_000),
    Abort(room=2**63 - 1, reason="client went away"),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_round_trip(msg) -> None:
    assert decode_control(encode_control(msg)) == msg


def test_tag_is_on_the_wire_and_dispatch_by_match() -> None:
    raw = msgspec.msgpack.decode(encode_control(Abort(room=5)))
    assert raw == {"type": "abort", "room": 5, "reason": ""}
    match decode_control(encode_control(Heartbeat(agent_id="a", seq=1, time_ns=2))):
        case Heartbeat(seq=seq):
            assert seq == 1
        case _:
            pytest.fail("not dispatched to Heartbeat")


@pytest.mark.parametrize(
    ("payload", "needle"),
    [
        (b"", "control message"),
        (b"\xc1", "control message"),
        (msgspec.msgpack.encode({"type": "teleport"}), "Invalid value 'teleport'"),
        (msgspec.msgpack.encode({"type": "abort", "room": -1}), "room"),
        (msgspec.msgpack.encode({"type": "hello", "agent_id": "x", "role": "router"}), "role"),
        (msgspec.msgpack.encode({"type": "heartbeat", "agent_id": "x", "seq": 1}), "time_ns"),
        (b"\x00" * (2 << 20), "exceeds"),
    ],
)
def test_garbage_raises_wire_format_error(payload: bytes, needle: str) -> None:
    with pytest.raises(WireFormatError, match=needle):
        decode_control(payload)


def test_encode_refuses_non_control_objects() -> None:
    with pytest.raises(WireFormatError, match="not a control message"):
        encode_control({"type": "abort"})  # type: ignore[arg-type]
