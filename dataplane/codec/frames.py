"""Frame-level helpers shared by the sglang-compatible messages: the guard, ASCII-decimal integers and
strings, and msgpack lists of opaque descriptor blobs.

sglang parses these with bare ``int(frame.decode("ascii"))`` and ``msgspec.msgpack.decode``; here every
helper names the field it reads and turns any malformation into a ``WireFormatError``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import msgspec

from ..errors import WireFormatError

GUARD = b"MoriMsgGuard"
MAX_INT_DIGITS = 20
_DECIMAL = re.compile(rb"-?[0-9]{1,%d}" % MAX_INT_DIGITS)
_PRINTABLE_ASCII = re.compile(rb"[\x20-\x7e]*")
U64_MAX = 2**64 - 1

Blobs = tuple[bytes, ...]
_BLOB_LIST = msgspec.msgpack.Decoder(list[bytes])
_BLOB_LISTS = msgspec.msgpack.Decoder(list[list[bytes]])
_ENCODER = msgspec.msgpack.Encoder()
_BYTES_ONLY = {bytes}


def check_frames(frames: Sequence[bytes], *, kind: str, min_frames: int) -> list[bytes]:
    """Validate the guard and the frame count; return the frames as a list of ``bytes`` (a list that
    already is one, guard first, is returned as it is: the common case, checked in one pass)."""
    if type(frames) is list and frames and frames[0] == GUARD and set(map(type, frames)) == _BYTES_ONLY:
        if len(frames) < min_frames:
            raise WireFormatError(f"{kind}: expected at least {min_frames} frames, got {len(frames)}")
        return frames
    if isinstance(frames, bytes | bytearray | memoryview | str):
        raise WireFormatError(f"{kind}: expected a sequence of frames, got a single {type(frames).__name__}")
    out: list[bytes] = []
    for i, frame in enumerate(frames):
        if type(frame) is bytes:
            out.append(frame)
            continue
        if isinstance(frame, str):
            raise WireFormatError(f"{kind}: frame {i} is a str, not bytes")
        try:
            out.append(bytes(memoryview(frame)))
        except TypeError:
            raise WireFormatError(f"{kind}: frame {i} is a {type(frame).__name__}, not bytes") from None
    if not out or out[0] != GUARD:
        head = out[0][:16] if out else None
        raise WireFormatError(f"{kind}: frame 0 must be the guard {GUARD!r}, got {head!r}")
    if len(out) < min_frames:
        raise WireFormatError(f"{kind}: expected at least {min_frames} frames, got {len(out)}")
    return out


def int_frame(value: int, *, field: str, lo: int = 0, hi: int = U64_MAX) -> bytes:
    """An integer as sglang sends it: ASCII decimal."""
    if type(value) is int and lo <= value <= hi:
        return b"%d" % value
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise WireFormatError(f"{field}: {value!r} is not an integer in {lo}..{hi}")
    return b"%d" % int(value)


def parse_int(frame: bytes, *, field: str, lo: int = 0, hi: int = U64_MAX) -> int:
    """Strict ASCII decimal (optional leading ``-``, at most 20 digits) within ``lo..hi``.

    ``bytes.isdigit`` admits ASCII digits only, so plain digit strings skip the regex; ``int()`` alone
    would also take signs, spaces and underscores."""
    if type(frame) is bytes and frame.isdigit() and len(frame) <= MAX_INT_DIGITS:
        value = int(frame)
    elif not _DECIMAL.fullmatch(frame):
        raise WireFormatError(f"{field}: expected an ASCII decimal integer, got {frame[:32]!r}")
    else:
        value = int(frame)
    if not lo <= value <= hi:
        raise WireFormatError(f"{field}: {value} out of range {lo}..{hi}")
    return value


def str_frame(value: str, *, field: str) -> bytes:
    if not isinstance(value, str):
        raise WireFormatError(f"{field}: expected a string, got {type(value).__name__}")
    if value.isascii() and value.isprintable():
        return value.encode("ascii")
    raw = value.encode("ascii", errors="replace")
    if not _PRINTABLE_ASCII.fullmatch(raw) or raw != value.encode("utf-8"):
        raise WireFormatError(f"{field}: {value[:64]!r} is not printable ASCII")
    return raw


def parse_str(frame: bytes, *, field: str) -> str:
    """A printable-ASCII frame (addresses, engine keys)."""
    if type(frame) is bytes and frame.isascii():
        text = frame.decode("ascii")
        if text.isprintable():
            return text
    if not _PRINTABLE_ASCII.fullmatch(frame):
        raise WireFormatError(f"{field}: expected printable ASCII, got {frame[:32]!r}")
    return frame.decode("ascii")


def blob_list_frame(blobs: Sequence[bytes]) -> bytes:
    """sglang's ``_pack_mem_desc_list``: a msgpack list of bin, or ``b""`` when empty."""
    return _ENCODER.encode([bytes(b) for b in blobs]) if len(blobs) else b""


def blob_lists_frame(per_component: Sequence[Sequence[bytes]]) -> bytes:
    """sglang's ``_pack_mem_desc_lists``: a msgpack list of lists of bin, or ``b""`` when empty."""
    if not len(per_component):
        return b""
    return _ENCODER.encode([[bytes(b) for b in comp] for comp in per_component])


def parse_blob_list(frame: bytes, *, field: str) -> Blobs:
    if not frame:
        return ()
    try:
        return tuple(_BLOB_LIST.decode(frame))
    except msgspec.MsgspecError as exc:
        raise WireFormatError(f"{field}: not a msgpack list of binary blobs ({exc})") from None


def parse_blob_lists(frame: bytes, *, field: str) -> tuple[tuple[Blobs, ...], bool]:
    """Per-component descriptor lists. Returns ``(lists, flat)``: ``flat`` is True for the pre
    per-component layout (one msgpack list of bin), which comes back as a single component."""
    if not frame:
        return (), False
    try:
        return tuple(tuple(comp) for comp in _BLOB_LISTS.decode(frame)), False
    except msgspec.MsgspecError:
        pass
    try:
        flat = tuple(_BLOB_LIST.decode(frame))
    except msgspec.MsgspecError as exc:
        raise WireFormatError(f"{field}: not a msgpack list of lists of binary blobs ({exc})") from None
    return ((flat,) if flat else ()), True
