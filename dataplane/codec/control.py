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

NonNeg = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
Text = Annotated[str, msgspec.Meta(max_length=64 * 1024)]
MAX_CONTROL_BYTES = 1 << 20


class _Control(msgspec.Struct, frozen=True, tag_field="type"):
    """Base of every control message (shares the tag field)."""


class Hello(_Control, frozen=True, tag="hello"):
    """First message on a control connection: who I am and, optionally, my encoded manifest frame."""

    agent_id: Text
    role: Literal["prefill", "decode"]
    generation: Text = ""
    manifest: bytes | None = None


class Refused(_Control, frozen=True, tag="refused"):
    """The peer will not pair with us; ``reason`` is human-readable (IncompatiblePeer's reason)."""

    reason: Text
    agent_id: Text = ""
    """Who refused (lets a decode rank tell which prefill rank refused it); appended, so optional."""


class Heartbeat(_Control, frozen=True, tag="heartbeat"):
    agent_id: Text
    seq: NonNeg
    time_ns: NonNeg


class Abort(_Control, frozen=True, tag="abort"):
    """Stop working on ``room``; both sides fail it with ``reason``."""

    room: NonNeg
    reason: Text = ""


ControlMessage = Hello | Refused | Heartbeat | Abort

_ENCODER = msgspec.msgpack.Encoder()
_DECODER: msgspec.msgpack.Decoder[ControlMessage] = msgspec.msgpack.Decoder(ControlMessage)


def encode_control(msg: ControlMessage) -> bytes:
    if not isinstance(msg, Hello | Refused | Heartbeat | Abort):
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
