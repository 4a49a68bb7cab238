"""Integer arrays on the wire: sglang's ``pack_int_lists`` and raw little-endian arrays.

``pack_int_lists(lists, fmt)`` is ``<u32 n><u32 byte_len x n>`` followed by each list as little-endian
``fmt`` (``"i"`` int32, ``"I"`` uint32); an empty outer list packs to ``b""``. Unlike sglang, which slices
whatever it is given, unpacking here is strict: a truncated header, a byte length that is not a multiple
of 4, or lengths that do not add up to the buffer are ``WireFormatError``s.

Most lists on the hot path are short (one mamba slot, 72 item lengths), where a numpy call costs more
than the packing, so they go through cached ``struct.Struct``s: ``struct`` range-checks every value
itself, and anything it refuses (or that is not a plain ``int``) falls back to the numpy path, which
finds the offending element for the error message. Arrays already in the wire dtype need no range check.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from ..errors import WireFormatError

IntFormat = Literal["i", "I"]
_WIRE_DTYPE = {"i": np.dtype("<i4"), "I": np.dtype("<u4")}
_NATIVE_DTYPE = {"i": np.dtype(np.int32), "I": np.dtype(np.uint32)}
_RANGE = {"i": (-(2**31), 2**31 - 1), "I": (0, 2**32 - 1)}
_SHORT = 512
"""Lists up to this length use ``struct`` (one cached ``Struct`` per format and length)."""
_STRUCTS: dict[tuple[str, int], struct.Struct] = {}
_U32 = struct.Struct("<I")
_ONE_LIST = struct.Struct("<II")
"""The header of a ``pack_int_lists`` buffer holding one list (a request's state indices, usually)."""
_INT_ONLY = {int}
_LITTLE = sys.byteorder == "little"


def _struct(fmt: str, n: int) -> struct.Struct:
    found = _STRUCTS.get((fmt, n))
    if found is None:
        found = struct.Struct(f"<{n}{fmt}")
        if n <= _SHORT + 1:
            _STRUCTS[(fmt, n)] = found
    return found


def _dtype(fmt: str) -> np.dtype[Any]:
    if fmt not in _WIRE_DTYPE:
        raise WireFormatError(f"integer format must be 'i' or 'I', got {fmt!r}")
    return _WIRE_DTYPE[fmt]


def _first_bad(values: Sequence[Any], lo: int, hi: int) -> tuple[int, Any]:
    """Only on the error path: locate the offending element for the message."""
    for pos, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or not lo <= int(v) <= hi:
            return pos, v
    return -1, None


def _pack_short(values: Sequence[Any], fmt: str) -> bytes | None:
    """``struct`` packing of a short list of plain ints; ``None`` when the checked path must decide."""
    if set(map(type, values)) != _INT_ONLY:
        return None
    try:
        return _struct(fmt, len(values)).pack(*values)
    except struct.error:
        return None


def pack_array(values: Sequence[int] | npt.NDArray[Any], fmt: IntFormat, *, what: str = "array") -> bytes:
    """One flat list as raw little-endian ``fmt`` (sglang's KV page indices and ``kv_layer_ids``)."""
    dtype = _dtype(fmt)
    if type(values) is np.ndarray:
        if values.ndim == 1 and values.dtype == dtype:
            return values.tobytes()
    elif isinstance(values, list | tuple) and 0 < len(values) <= _SHORT:
        packed = _pack_short(values, fmt)
        if packed is not None:
            return packed
    return _pack_checked(values, fmt, dtype, what)


def _pack_checked(
    values: Sequence[int] | npt.NDArray[Any], fmt: str, dtype: np.dtype[Any], what: str
) -> bytes:
    lo, hi = _RANGE[fmt]
    try:
        arr = np.asarray(values)
    except (OverflowError, ValueError, TypeError):
        arr = np.asarray([], dtype=object)
    if arr.size == 0 and arr.dtype != object:
        return b""
    if arr.ndim != 1 or arr.dtype.kind not in "iu" or arr.min() < lo or arr.max() > hi:
        if arr.ndim > 1:
            raise WireFormatError(f"{what}: expected a flat list of integers, got shape {arr.shape}")
        pos, bad = _first_bad(list(values), lo, hi)
        raise WireFormatError(
            f"{what}: position {pos}: value {bad!r} is not an integer in range for {fmt!r} ({lo}..{hi})"
        )
    return arr.astype(dtype, copy=False).tobytes()


def unpack_array(buf: bytes, fmt: IntFormat, *, what: str = "array") -> npt.NDArray[Any]:
    """Raw little-endian ``fmt`` → native numpy array (int32 or uint32); ``b""`` → empty array."""
    dtype = _dtype(fmt)
    if len(buf) % 4:
        raise WireFormatError(f"{what}: {len(buf)} bytes is not a multiple of 4")
    return _owned(buf, dtype, fmt)


def _owned(buf: bytes, dtype: np.dtype[Any], fmt: str) -> npt.NDArray[Any]:
    """A writeable native array of ``buf``'s values: on a little-endian host the wire dtype is
    native, so a ``bytearray`` copy read in place costs less than ``frombuffer(...).astype``."""
    if _LITTLE:
        return np.frombuffer(bytearray(buf), dtype)
    return np.frombuffer(buf, dtype).astype(_NATIVE_DTYPE[fmt])


def pack_int_lists(
    lists: Sequence[Sequence[int] | npt.NDArray[Any]], fmt: IntFormat, *, what: str = "int lists"
) -> bytes:
    """sglang's ``pack_int_lists``: header of counts and byte lengths, then each list's bytes."""
    _dtype(fmt)
    n = len(lists)
    if n == 0:
        return b""
    bodies = [pack_array(lst, fmt, what=f"{what}: list {i}") for i, lst in enumerate(lists)]
    return _struct("I", n + 1).pack(n, *map(len, bodies)) + b"".join(bodies)


def _list_spans(buf: bytes, what: str) -> list[tuple[int, int]]:
    """Validated ``(offset, byte_len)`` of each list in a non-empty ``pack_int_lists`` buffer."""
    if len(buf) < 4:
        raise WireFormatError(f"{what}: truncated header ({len(buf)} bytes, need at least 4)")
    n = _U32.unpack_from(buf)[0]
    body_start = 4 + 4 * n
    if len(buf) < body_start:
        raise WireFormatError(
            f"{what}: header says {n} lists, needing {body_start} header bytes, but the buffer has {len(buf)}"
        )
    lens = (
        _struct("I", n).unpack_from(buf, 4)
        if n <= _SHORT
        else np.frombuffer(buf, dtype="<u4", count=n, offset=4).tolist()
    )
    for i, ln in enumerate(lens):
        if ln % 4:
            raise WireFormatError(f"{what}: list {i} byte length {ln} is not a multiple of 4")
    total = sum(lens)
    if body_start + total != len(buf):
        raise WireFormatError(
            f"{what}: list lengths sum to {total} bytes but {len(buf) - body_start} follow the header"
        )
    spans, offset = [], body_start
    for ln in lens:
        spans.append((offset, ln))
        offset += ln
    return spans


def unpack_int_lists(buf: bytes, fmt: IntFormat, *, what: str = "int lists") -> list[npt.NDArray[Any]]:
    """Inverse of ``pack_int_lists``; each list comes back as a numpy int32/uint32 array."""
    dtype = _dtype(fmt)
    if len(buf) == 0:
        return []
    native = _NATIVE_DTYPE[fmt]
    if len(buf) >= 8:
        n, byte_len = _ONE_LIST.unpack_from(buf)
        if n == 1 and byte_len == len(buf) - 8 and not byte_len % 4:
            return [_owned(buf[8:], dtype, fmt)]
    return [
        np.frombuffer(buf, dtype=dtype, count=ln >> 2, offset=off).astype(native)
        for off, ln in _list_spans(buf, what)
    ]


def unpack_int_tuples(buf: bytes, fmt: IntFormat, *, what: str = "int lists") -> tuple[tuple[int, ...], ...]:
    """``unpack_int_lists`` as tuples of Python ints (registration fields), without numpy."""
    _dtype(fmt)
    if len(buf) == 0:
        return ()
    return tuple(_unpack_tuple(buf, fmt, off, ln) for off, ln in _list_spans(buf, what))


def unpack_tuple(buf: bytes, fmt: IntFormat, *, what: str = "array") -> tuple[int, ...]:
    """``unpack_array`` as a tuple of Python ints."""
    _dtype(fmt)
    if len(buf) % 4:
        raise WireFormatError(f"{what}: {len(buf)} bytes is not a multiple of 4")
    return _unpack_tuple(buf, fmt, 0, len(buf))


def _unpack_tuple(buf: bytes, fmt: str, offset: int, byte_len: int) -> tuple[int, ...]:
    n = byte_len >> 2
    if n <= _SHORT:
        return _struct(fmt, n).unpack_from(buf, offset)
    return tuple(np.frombuffer(buf, dtype=_WIRE_DTYPE[fmt], count=n, offset=offset).tolist())
