"""Our own control messages between agents (not sglang's): a tagged union of msgspec Structs with one
typed decoder, after msgspec's ``examples/asyncio-kv``. Dispatch with ``match``::

    match decode_control(payload):
        case Hello(agent_id=peer): ...
        case Heartbeat(seq=seq): ...

Evolution: new fields get defaults; a new message is a new tagged Struct appended to
``ControlMessage``. Each message is one msgpack object carrying its tag in field ``type``.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from ..errors import WireFormatError

MAX_CONTROL_BYTES = 1 << 20
NonNeg = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
Text = Annotated[str, msgspec.Meta(max_length=64 * 1024)]
Nonce = Annotated[bytes, msgspec.Meta(max_length=32)]


class _Control(msgspec.Struct, frozen=True, tag_field="type"):
    """Base of every control message (shares the tag field)."""


class Hello(_Control, frozen=True, tag="hello"):
    """First message on a control connection: who I am and, optionally, my encoded manifest frame."""

    agent_id: Text
    role: Literal["prefill", "decode"]
    generation: Text = ""
    manifest: bytes | None = None
    lane_port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 0
    """Prefill's direct-lane listener (``agent.lanes``); 0: none, stay on ZMQ."""
    lane_token: Annotated[bytes, msgspec.Meta(max_length=64)] = b""
    """What the decode presents when it dials the lane (empty for an authenticated pairing: decode
    derives it from the pairing key)."""
    nonce: Nonce = b""
    """Prefill's nonce of an authenticated pairing (``codec.auth.pairing_key``)."""


class Refused(_Control, frozen=True, tag="refused"):
    """The peer will not pair with us; ``reason`` is human-readable (IncompatiblePeer's reason)."""

    reason: Text
    agent_id: Text = ""
    """Who refused (lets a decode rank tell which prefill rank refused it); appended, so optional."""
    nonce: Nonce = b""
    """Prefill's nonce: the refusal is sealed like a ``Hello`` (a spoofed one is not)."""


class Heartbeat(_Control, frozen=True, tag="heartbeat"):
    agent_id: Text
    seq: NonNeg
    time_ns: NonNeg


class Abort(_Control, frozen=True, tag="abort"):
    """Stop working on ``room``; both sides fail it with ``reason``."""

    room: NonNeg
    reason: Text = ""


class StagedOffer(_Control, frozen=True, tag="staged_offer"):
    """Decode → prefill, sent just before its registration on the same socket: a landing buffer for
    staged writes (``region``: the transport's descriptor blob of it; ``slots`` x ``slot_bytes``).
    A prefill that accepts appends the blob to the registration's regions; a peer that never sends
    one (plain sglang) gets direct writes only."""

    agent_id: Text
    region: Annotated[bytes, msgspec.Meta(max_length=64 * 1024)]
    slots: Annotated[int, msgspec.Meta(ge=1, le=1 << 16)]
    slot_bytes: Annotated[int, msgspec.Meta(ge=1, le=1 << 40)]


class Staged(_Control, frozen=True, tag="staged_msg"):
    """One staged-path message between paired agents: ``payload`` is a notice (prefill → decode) or
    an acknowledgement (decode → prefill), encoded by ``dataplane.staging.encode_staged``."""

    agent_id: Text
    payload: Annotated[bytes, msgspec.Meta(max_length=MAX_CONTROL_BYTES - 1024)]


ControlMessage = Hello | Refused | Heartbeat | Abort | StagedOffer | Staged

_ENCODER = msgspec.msgpack.Encoder()
_DECODER: msgspec.msgpack.Decoder[ControlMessage] = msgspec.msgpack.Decoder(ControlMessage)


def encode_control(msg: ControlMessage) -> bytes:
    if not isinstance(msg, Hello | Refused | Heartbeat | Abort | StagedOffer | Staged):
        raise WireFormatError(f"not a control message: {type(msg).__name__}")
    return _ENCODER.encode(msg)


def decode_control(data: bytes) -> ControlMessage:
    """Parse one untrusted control message; raises ``WireFormatError`` only."""
    if len(data) > MAX_CONTROL_BYTES:
        raise WireFormatError(f"control message of {len(data)} bytes exceeds {MAX_CONTROL_BYTES}")
    try:
        return _DECODER.decode(data)
    except msgspec.MsgspecError as exc:
        raise WireFormatError(f"control message: {exc}") from None
