"""Every golden vector from sglang 0.5.23 is a test: our encoders reproduce sglang's frames byte for
byte, and our decoders recover what sglang's parsers read from them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from codec_vectors import VECTORS, as_plain, frames_of, metadata_from_inputs, registration_from_inputs

from dataplane.codec import (
    decode_metadata,
    decode_registration,
    encode_metadata,
    encode_registration,
    pack_int_lists,
    unpack_int_lists,
)


def _ids(cases: list[dict[str, Any]]) -> list[str]:
    return [c.get("name") or f"{c.get('fmt')}:{c.get('lists')}" for c in cases]


@pytest.mark.parametrize("case", VECTORS["pack_int_lists"], ids=_ids(VECTORS["pack_int_lists"]))
def test_pack_int_lists_matches_sglang(case: dict[str, Any]) -> None:
    assert pack_int_lists(case["lists"], case["fmt"]).hex() == case["hex"]


@pytest.mark.parametrize("case", VECTORS["pack_int_lists"], ids=_ids(VECTORS["pack_int_lists"]))
def test_unpack_int_lists_matches_sglang(case: dict[str, Any]) -> None:
    arrays = unpack_int_lists(bytes.fromhex(case["hex"]), case["fmt"])
    assert as_plain(arrays) == case["unpacked_by_sglang"]
    expected = np.int32 if case["fmt"] == "i" else np.uint32
    assert all(a.dtype == expected for a in arrays)


@pytest.mark.parametrize("case", VECTORS["registration"], ids=_ids(VECTORS["registration"]))
def test_registration_encodes_like_sglang(case: dict[str, Any]) -> None:
    frames = encode_registration(registration_from_inputs(case["inputs"]))
    assert [f.hex() for f in frames] == case["frames_hex"]


@pytest.mark.parametrize("case", VECTORS["registration"], ids=_ids(VECTORS["registration"]))
def test_registration_decodes_like_sglang(case: dict[str, Any]) -> None:
    reg = decode_registration(frames_of(case))
    parsed = dict(case["parsed_by_sglang"])
    assert [len(c) for c in reg.dst_state_mem_descs] == parsed.pop("n_state_mem_descs")
    for field, expected in parsed.items():
        assert as_plain(getattr(reg, field)) == expected, field
    assert reg == registration_from_inputs(case["inputs"])
    assert reg.plain_sglang_peer and reg.manifest is None and not reg.legacy_flat_state


@pytest.mark.parametrize("case", VECTORS["transfer_metadata"], ids=_ids(VECTORS["transfer_metadata"]))
def test_metadata_encodes_like_sglang(case: dict[str, Any]) -> None:
    frames = encode_metadata(metadata_from_inputs(case["inputs"]))
    assert [f.hex() for f in frames] == case["frames_hex"]


@pytest.mark.parametrize("case", VECTORS["transfer_metadata"], ids=_ids(VECTORS["transfer_metadata"]))
def test_metadata_decodes_like_sglang(case: dict[str, Any]) -> None:
    meta = decode_metadata(frames_of(case))
    for field, expected in case["parsed_by_sglang"].items():
        assert as_plain(getattr(meta, field)) == expected, field
    assert meta.dst_kv_indices.dtype == np.int32
    assert all(a.dtype == np.int32 for a in meta.dst_state_indices)
    i = case["inputs"]
    assert (meta.room, meta.endpoint, meta.dst_port, meta.engine_key) == (
        i["room"],
        i["local_ip"],
        i["rank_port"],
        i["engine_key"],
    )


def test_dummy_metadata_blanks_kv_aux_and_state() -> None:
    (case,) = [c for c in VECTORS["transfer_metadata"] if c["name"] == "dummy"]
    frames = frames_of(case)
    assert frames[5] == frames[6] == frames[7] == b""
    meta = decode_metadata(frames)
    assert meta.is_dummy and meta.dst_aux_index == -1 and meta.dst_state_indices == ()
