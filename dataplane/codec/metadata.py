"""The per-room transfer-metadata message (decode → prefill), byte-compatible with sglang 0.5.23 MoRI
(``MoriKVReceiver.send_metadata`` / ``TransferInfo.from_zmq``).

Frames: 0 guard, 1 room, 2 ip, 3 rank_port, 4 engine_key, 5 KV page indices (raw ``<i4``), 6 aux index
(ASCII, or empty for none), 7 ``pack_int_lists(state_indices, "i")`` (empty when there is no state),
8 required_dst_info_num, 9 decode_prefix_len (ASCII, empty unless > 0).

A *dummy* message (a decode rank that needs nothing from this prefill rank) blanks frames 5-7;
``is_dummy`` is not on the wire: like sglang, the decoder derives it as "no KV pages, no aux index and
no decode prefix". With ``legacy_flat_state=True`` (a peer whose registration used the old flat layout)
frame 7 is read as one raw ``<i4`` array, i.e. a single component.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import WireFormatError
from .frames import GUARD, U64_MAX, check_frames, int_frame, parse_int, parse_str, str_frame
from .ints import pack_array, pack_int_lists, unpack_array, unpack_int_lists
from .messages import IndexArray, TransferMetadata

MIN_METADATA_FRAMES = 7
"""sglang requires frames up to the aux index; later ones default."""
I32_MAX = 2**31 - 1

_NO_STATE = np.empty(0, dtype=np.int32)
_WIRE_I32 = np.dtype("<i4")
_LITTLE = sys.byteorder == "little"
_BYTES_ONLY = {bytes}
_ONE_LIST = struct.Struct("<II")
"""``pack_int_lists`` header of a single list: the common one-component state frame skips the generic
packer (an int32 array needs no range check)."""


def _flat(entry: Any | None) -> Any:
    """One component's indices as a flat sequence: 1-D arrays and plain lists pass as they are (the
    packer checks them), anything else is flattened through numpy as before."""
    if entry is None:
        return _NO_STATE
    if (type(entry) is np.ndarray and entry.ndim == 1) or (
        type(entry) in (list, tuple) and all(type(v) is int for v in entry)
    ):
        return entry
    return np.asarray(entry).ravel()


def _kv_frame(kv: Any) -> bytes:
    if type(kv) is np.ndarray and kv.ndim == 1 and kv.dtype == _WIRE_I32:
        return kv.tobytes()
    return pack_array(kv, "i", what="dst_kv_indices")


def _state_frame(state: Sequence[Any | None]) -> bytes:
    if len(state) == 1:
        one = state[0]
        if type(one) is np.ndarray and one.ndim == 1 and one.dtype == _WIRE_I32:
            return _ONE_LIST.pack(1, one.nbytes) + one.tobytes()
    return pack_int_lists([_flat(s) for s in state], "i", what="dst_state_indices")


def encode_metadata(msg: TransferMetadata) -> list[bytes]:
    """Frames as sglang 0.5.23's ``send_metadata`` builds them (dummy blanks KV, aux and state).

    The common message (plain ints and ASCII strings in range, int32 KV pages, an aux index, one
    state array of int32, no decode prefix) is checked and built in one pass; anything else, errors
    included, by the general path."""
    room, port, required, aux = msg.room, msg.dst_port, msg.required_dst_info_num, msg.dst_aux_index
    ep, key, kv, state = msg.endpoint, msg.engine_key, msg.dst_kv_indices, msg.dst_state_indices
    if (
        type(room) is int
        and type(port) is int
        and type(required) is int
        and type(aux) is int
        and 0 <= room <= U64_MAX
        and 0 <= port <= 65535
        and 1 <= required <= I32_MAX
        and 0 <= aux <= I32_MAX
        and type(ep) is str
        and type(key) is str
        and ep.isascii()
        and key.isascii()
        and ep.isprintable()
        and key.isprintable()
        and type(kv) is np.ndarray
        and kv.ndim == 1
        and kv.dtype == _WIRE_I32
        and not msg.is_dummy
        and not msg.decode_prefix_len
        and len(state) == 1
    ):
        one = state[0]
        if type(one) is np.ndarray and one.ndim == 1 and one.dtype == _WIRE_I32:
            return [
                GUARD,
                b"%d" % room,
                ep.encode("ascii"),
                b"%d" % port,
                key.encode("ascii"),
                kv.tobytes(),
                b"%d" % aux,
                _ONE_LIST.pack(1, one.nbytes) + one.tobytes(),
                b"%d" % required,
                b"",
            ]
    return _encode(msg)


def _encode(msg: TransferMetadata) -> list[bytes]:
    dummy = msg.is_dummy
    aux = msg.dst_aux_index
    if not isinstance(aux, int) or isinstance(aux, bool) or aux < -1:
        raise WireFormatError(f"dst_aux_index: {aux!r} is not an index or -1")
    room, port, required, prefix = msg.room, msg.dst_port, msg.required_dst_info_num, msg.decode_prefix_len
    if (
        type(room) is int
        and type(port) is int
        and type(required) is int
        and 0 <= room <= U64_MAX
        and 0 <= port <= 65535
        and 1 <= required <= I32_MAX
        and aux <= I32_MAX
    ):
        head = b"%d" % room, b"%d" % port, b"%d" % required, b"%d" % aux
    else:
        head = (
            int_frame(room, field="room"),
            int_frame(port, field="dst_port", hi=65535),
            int_frame(required, field="required_dst_info_num", lo=1, hi=I32_MAX),
            b"" if dummy or aux < 0 else int_frame(aux, field="dst_aux_index", hi=I32_MAX),
        )
    ep, key, kv = msg.endpoint, msg.engine_key, msg.dst_kv_indices
    plain = type(ep) is str and type(key) is str and ep.isascii() and key.isascii()
    return [
        GUARD,
        head[0],
        ep.encode("ascii") if plain and ep.isprintable() else str_frame(ep, field="endpoint"),
        head[1],
        key.encode("ascii") if plain and key.isprintable() else str_frame(key, field="engine_key"),
        b"" if dummy else _kv_frame(kv),
        b"" if dummy or aux < 0 else head[3],
        b"" if dummy else _state_frame(msg.dst_state_indices),
        head[2],
        b"" if not prefix else int_frame(prefix, field="decode_prefix_len"),
    ]


def _state(frame: bytes, *, legacy_flat_state: bool) -> tuple[IndexArray, ...]:
    if legacy_flat_state:
        flat = unpack_array(frame, "i", what="dst_state_indices (old flat layout)")
        return (flat,) if flat.size else ()
    return tuple(unpack_int_lists(frame, "i", what="dst_state_indices"))


def decode_metadata(frames: Sequence[bytes], *, legacy_flat_state: bool = False) -> TransferMetadata:
    """Parse untrusted frames; raises ``WireFormatError`` only."""
    if not legacy_flat_state and type(frames) is list:
        plain = _decode_plain(frames)
        if plain is not None:
            return plain
    f = check_frames(frames, kind="metadata", min_frames=MIN_METADATA_FRAMES)
    if f[1] == b"None":
        raise WireFormatError("metadata: frame 1 is b'None', which marks a registration message")
    kv = unpack_array(f[5], "i", what="dst_kv_indices")
    aux = parse_int(f[6], field="dst_aux_index", hi=I32_MAX) if f[6] else -1
    prefix = parse_int(f[9], field="decode_prefix_len") if len(f) > 9 and f[9] else None
    return TransferMetadata(
        room=parse_int(f[1], field="room"),
        endpoint=parse_str(f[2], field="endpoint"),
        dst_port=parse_int(f[3], field="dst_port", hi=65535),
        engine_key=parse_str(f[4], field="engine_key"),
        dst_kv_indices=kv,
        dst_aux_index=aux,
        dst_state_indices=_state(f[7] if len(f) > 7 else b"", legacy_flat_state=legacy_flat_state),
        required_dst_info_num=(
            parse_int(f[8], field="required_dst_info_num", lo=1, hi=I32_MAX) if len(f) > 8 else 1
        ),
        is_dummy=kv.size == 0 and aux < 0 and not prefix,
        decode_prefix_len=prefix,
    )


def _decode_plain(f: list[Any]) -> TransferMetadata | None:
    """The common message (an aux index, no or one state list, no decode prefix, plain fields) in one
    pass, with the same checks as the general path, inline (``check_frames``' too: the guard first,
    every frame ``bytes``); ``None`` for anything else, which the general path then parses or
    rejects with the field's error. Digit strings of at most 19 (9) digits are below 2**64 (2**31)
    whatever their digits, so only the port and the count need a range check."""
    if len(f) < 9 or not _LITTLE or f[0] != GUARD or set(map(type, f)) != _BYTES_ONLY:
        return None
    room, ep, port, key, kv, aux, state, required = f[1:9]
    n = len(state)
    if (
        (len(f) > 9 and f[9])
        or len(kv) % 4
        or (n and (n < 8 or n % 4 or _ONE_LIST.unpack_from(state) != (1, n - 8)))
        or not (room.isdigit() and len(room) <= 19 and aux.isdigit() and len(aux) <= 9)
        or not (port.isdigit() and len(port) <= 5 and required.isdigit() and len(required) <= 9)
        or not (ep.isascii() and key.isascii())
    ):
        return None
    endpoint, engine_key, port_n, required_n = (
        ep.decode("ascii"),
        key.decode("ascii"),
        int(port),
        int(required),
    )
    if port_n > 65535 or required_n < 1 or not (endpoint.isprintable() and engine_key.isprintable()):
        return None
    return TransferMetadata(
        room=int(room),
        endpoint=endpoint,
        dst_port=port_n,
        engine_key=engine_key,
        dst_kv_indices=np.frombuffer(bytearray(kv), _WIRE_I32),
        dst_aux_index=int(aux),
        dst_state_indices=(np.frombuffer(bytearray(state[8:]), _WIRE_I32),) if n else (),
        required_dst_info_num=required_n,
    )
