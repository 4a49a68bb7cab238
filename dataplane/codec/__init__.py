"""Codec layer: bytes on the wire ↔ typed messages. Pure (no I/O, no sockets).

- sglang 0.5.23 MoRI frames, byte for byte: ``pack_int_lists``, the registration and the per-room
  transfer-metadata messages (decode → prefill) and the status message (prefill → decode).
- Our trailing schema-manifest frame on registration and the negotiation that refuses an
  incompatible peer with a human-readable reason.
- Our own control messages, a tagged union of msgspec Structs.

Every decoder takes untrusted bytes and raises only ``BadInput`` subclasses.
"""

from .control import Abort, ControlMessage, Heartbeat, Hello, Refused, decode_control, encode_control
from .frames import GUARD
from .ints import pack_array, pack_int_lists, unpack_array, unpack_int_lists
from .kinds import FrameKind, frame_kind
from .manifest import (
    MANIFEST_MAGIC,
    MANIFEST_VERSION,
    ComponentSummary,
    KVSummary,
    Manifest,
    decode_manifest,
    encode_manifest,
    is_manifest_frame,
    manifest_from_schema,
)
from .metadata import TransferMetadata, decode_metadata, encode_metadata
from .negotiation import check_compatible, incompatibilities
from .registration import (
    REGISTRATION_FRAMES,
    Registration,
    decode_registration,
    encode_registration,
    engine_key_of,
)
from .status import KVPoll, StatusMessage, advance, decode_status, encode_status

__all__ = [
    "GUARD",
    "MANIFEST_MAGIC",
    "MANIFEST_VERSION",
    "REGISTRATION_FRAMES",
    "Abort",
    "ComponentSummary",
    "ControlMessage",
    "FrameKind",
    "Heartbeat",
    "Hello",
    "KVPoll",
    "KVSummary",
    "Manifest",
    "Refused",
    "Registration",
    "StatusMessage",
    "TransferMetadata",
    "advance",
    "check_compatible",
    "decode_control",
    "decode_manifest",
    "decode_metadata",
    "decode_registration",
    "decode_status",
    "encode_control",
    "encode_manifest",
    "encode_metadata",
    "encode_registration",
    "encode_status",
    "engine_key_of",
    "frame_kind",
    "incompatibilities",
    "is_manifest_frame",
    "manifest_from_schema",
    "pack_array",
    "pack_int_lists",
    "unpack_array",
    "unpack_int_lists",
]
