"""pack_int_lists / unpack_int_lists and raw arrays: strict validation with messages that say where."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from dataplane.codec import pack_array, pack_int_lists, unpack_array, unpack_int_lists
from dataplane.errors import BadInput, WireFormatError


def test_empty_outer_list_is_empty_bytes_both_ways() -> None:
    assert pack_int_lists([], "i") == b""
    assert unpack_int_lists(b"", "I") == []


def test_accepts_numpy_arrays_and_returns_native_dtypes() -> None:
    buf = pack_int_lists([np.array([1, -2], dtype=np.int64), np.arange(3, dtype=np.int32)], "i")
    out = unpack_int_lists(buf, "i")
    assert [a.tolist() for a in out] == [[1, -2], [0, 1, 2]]
    assert all(a.dtype == np.int32 and a.flags.writeable for a in out)


@pytest.mark.parametrize(
    ("buf", "needle"),
    [
        (b"\x01\x00", "truncated header"),
        (struct.pack("<I", 2) + struct.pack("<I", 4), "header says 2 lists"),
        (struct.pack("<II", 1, 6) + b"\x00" * 6, "list 0 byte length 6 is not a multiple of 4"),
        (struct.pack("<II", 1, 8) + b"\x00" * 4, "sum to 8 bytes but 4 follow"),
        (struct.pack("<II", 1, 4) + b"\x00" * 8, "sum to 4 bytes but 8 follow"),
        (struct.pack("<I", 0xFFFFFFFF), "header says 4294967295 lists"),
    ],
)
def test_unpack_rejects_malformed_buffers(buf: bytes, needle: str) -> None:
    with pytest.raises(WireFormatError, match=needle):
        unpack_int_lists(buf, "i", what="state_indices")


def test_unpack_error_names_the_field() -> None:
    with pytest.raises(WireFormatError, match=r"^dst_state_item_lens: "):
        unpack_int_lists(b"\x00", "I", what="dst_state_item_lens")


@pytest.mark.parametrize(
    ("lists", "fmt", "needle"),
    [
        ([[1], [2, 2**31]], "i", "list 1: position 1: value 2147483648"),
        ([[0, -1]], "I", "list 0: position 1: value -1"),
        ([[2**32]], "I", "list 0: position 0: value 4294967296"),
        ([[1, 2**70]], "i", "list 0: position 1"),
        ([[1.5]], "i", "position 0: value 1.5"),
        ([["7"]], "i", "position 0: value '7'"),
        ([[[1, 2]]], "i", "flat list"),
    ],
)
def test_pack_rejects_values_out_of_range_naming_list_and_position(lists, fmt, needle) -> None:
    with pytest.raises(BadInput, match=needle):
        pack_int_lists(lists, fmt)


def test_unknown_format_is_rejected() -> None:
    with pytest.raises(WireFormatError, match="'i' or 'I'"):
        pack_int_lists([[1]], "q")  # type: ignore[arg-type]
    with pytest.raises(WireFormatError, match="'i' or 'I'"):
        unpack_int_lists(b"", "h")  # type: ignore[arg-type]


def test_raw_arrays_round_trip_and_validate() -> None:
    assert pack_array([5, 6, 7, 9], "i") == struct.pack("<4i", 5, 6, 7, 9)
    assert unpack_array(struct.pack("<2I", 1, 3), "I").tolist() == [1, 3]
    assert unpack_array(b"", "i").dtype == np.int32
    with pytest.raises(WireFormatError, match="kv: 5 bytes is not a multiple of 4"):
        unpack_array(b"\x00" * 5, "i", what="kv")
    with pytest.raises(WireFormatError, match="kv: position 2"):
        pack_array([1, 2, -3], "I", what="kv")
