"""Integer arrays on the wire: sglang's ``pack_int_lists`` and raw little-endian arrays.

``pack_int_lists(lists, fmt)`` is ``<u32 n><u32 byte_len x n>`` followed by each list as little-endian
``fmt`` (``"i"`` int32, ``"I"`` uint32); an empty outer list packs to ``b""``. Unlike sglang, which slices
whatever it is given, unpacking here is strict: a truncated header, a byte length that is not a multiple
of 4, or lengths that do not add up to the buffer are ``WireFormatError``s. Values move through numpy
(``np.frombuffer`` / ``tobytes``), never a per-element Python loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from ..errors import WireFormatError

IntFormat = Literal["i", "I"]
_WIRE_DTYPE = {"i": np.dtype("<i4"), "I": np.dtype("<u4")}
_NATIVE_DTYPE = {"i": np.dtype(np.int32), "I": np.dtype(np.uint32)}
_RANGE = {"i": (-(2**31), 2**31 - 1), "I": (0, 2**32 - 1)}


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


def pack_array(values: Sequence[int] | npt.NDArray[Any], fmt: IntFormat, *, what: str = "array") -> bytes:
    """One flat list as raw little-endian ``fmt`` (sglang's KV page indices and ``kv_layer_ids``)."""
    dtype = _dtype(fmt)
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
    return np.frombuffer(buf, dtype=dtype).astype(_NATIVE_DTYPE[fmt])


def pack_int_lists(lists: Sequence[Sequence[int] | npt.NDArray[Any]], fmt: IntFormat, *,
                   what: str = "int lists") -> bytes:
    """sglang's ``pack_int_lists``: header of counts and byte lengths, then each list's bytes."""
    _dtype(fmt)
    if len(lists) == 0:
        return b""
    bodies = [pack_array(lst, fmt, what=f"{what}: list {i}") for i, lst in enumerate(lists)]
    header = np.array([len(bodies), *(len(b) for b in bodies)], dtype="<u4").tobytes()
    return header + b"".join(bodies)


def unpack_int_lists(buf: bytes, fmt: IntFormat, *, what: str = "int lists") -> list[npt.NDArray[Any]]:
    """Inverse of ``pack_int_lists``; each list comes back as a numpy int32/uint32 array."""
    dtype = _dtype(fmt)
    if len(buf) == 0:
        return []
    if len(buf) < 4:
        raise WireFormatError(f"{what}: truncated header ({len(buf)} bytes, need at least 4)")
    n = int(np.frombuffer(buf, dtype="<u4", count=1)[0])
    body_start = 4 + 4 * n
    if len(buf) < body_start:
        raise WireFormatError(
            f"{what}: header says {n} lists, needing {body_start} header bytes, but the buffer has {len(buf)}"
        )
    lens = np.frombuffer(buf, dtype="<u4", count=n, offset=4).astype(np.int64)
    odd = np.flatnonzero(lens % 4)
    if odd.size:
        first = int(odd[0])
        raise WireFormatError(f"{what}: list {first} byte length {int(lens[first])} is not a multiple of 4")
    total = int(lens.sum())
    if body_start + total != len(buf):
        raise WireFormatError(
            f"{what}: list lengths sum to {total} bytes but {len(buf) - body_start} follow the header"
        )
    ends = body_start + np.cumsum(lens)
    starts = ends - lens
    native = _NATIVE_DTYPE[fmt]
    return [
        np.frombuffer(buf, dtype=dtype, count=int(ln) // 4, offset=int(s)).astype(native)
        for s, ln in zip(starts.tolist(), lens.tolist(), strict=True)
    ]
