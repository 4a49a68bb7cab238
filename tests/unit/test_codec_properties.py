"""Hypothesis round trips: pack_int_lists, registration (with and without manifest) and metadata; the
one-pass metadata decoder against the general one."""

from __future__ import annotations

from unittest.mock import patch

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dataplane.codec import (
    GUARD,
    ComponentSummary,
    KVSummary,
    Manifest,
    Registration,
    TransferMetadata,
    decode_metadata,
    decode_registration,
    encode_metadata,
    encode_registration,
    pack_int_lists,
    unpack_int_lists,
)
from dataplane.codec import metadata as metadata_module
from dataplane.errors import WireFormatError

FAST = settings(max_examples=60, deadline=None)
i32 = st.integers(-(2**31), 2**31 - 1)
u32 = st.integers(0, 2**32 - 1)
small_u32 = st.integers(1, 2**31)
blob = st.binary(min_size=1, max_size=24)
ascii_text = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=20)


@FAST
@given(st.data(), st.sampled_from(["i", "I"]))
def test_pack_int_lists_round_trip(data: st.DataObject, fmt: str) -> None:
    lists = data.draw(st.lists(st.lists(i32 if fmt == "i" else u32, max_size=8), max_size=6))
    out = unpack_int_lists(pack_int_lists(lists, fmt), fmt)  # type: ignore[arg-type]
    assert [a.tolist() for a in out] == lists


@st.composite
def registrations(draw: st.DrawFn) -> Registration:
    tensors = draw(st.lists(st.integers(1, 4), max_size=3))
    descs = tuple(tuple(draw(blob) for _ in range(n)) for n in tensors)
    item_lens = tuple(tuple(draw(small_u32) for _ in range(n)) for n in tensors)
    dims = tuple(tuple(draw(u32) for _ in range(n)) if draw(st.booleans()) else () for n in tensors)
    layers = tuple(tuple(draw(u32) for _ in range(n)) for n in tensors) if draw(st.booleans()) else ()
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    kv_len = draw(small_u32)
    manifest = None
    if draw(st.booleans()):
        comps = tuple(
            ComponentSummary(f"c{i}", "mamba", "bfloat16", lens, (0,) * len(lens), 4)
            for i, lens in enumerate(item_lens)
        )
        manifest = Manifest(
            role="decode",
            model=draw(ascii_text),
            tp_size=tp,
            tp_rank=tp - 1,
            page_size=64,
            kv=KVSummary(kv_len, "bfloat16", "mha", 2),
            components=comps,
            generation=draw(st.text(max_size=8)),
        )
    return Registration(
        endpoint=draw(ascii_text),
        dst_port=draw(st.integers(0, 65535)),
        engine_desc=draw(blob),
        dst_kv_mem_descs=tuple(draw(st.lists(blob, max_size=4))),
        dst_aux_mem_descs=tuple(draw(st.lists(blob, max_size=2))),
        dst_state_mem_descs=descs,
        gpu_id=draw(st.integers(-1, 16)),
        decode_tp_size=tp,
        decode_tp_rank=draw(st.integers(0, 7)) * tp + tp - 1,
        dst_kv_item_len=kv_len,
        dst_state_item_lens=item_lens,
        dst_state_dim_per_tensor=dims,
        dcp_size=2,
        dcp_rank=draw(st.integers(0, 1)),
        dst_state_layer_ids=layers,
        dst_kv_layer_ids=tuple(draw(st.lists(u32, max_size=6))),
        manifest=manifest,
    )


@FAST
@given(registrations())
def test_registration_round_trip(reg: Registration) -> None:
    frames = encode_registration(reg)
    assert len(frames) == 18 + (reg.manifest is not None)
    assert decode_registration(frames) == reg


@st.composite
def metadata(draw: st.DrawFn) -> TransferMetadata:
    kv = np.asarray(draw(st.lists(i32, max_size=16)), dtype=np.int32)
    aux = draw(st.integers(-1, 2**31 - 1))
    prefix = draw(st.none() | st.integers(1, 2**40))
    dummy = draw(st.booleans()) and prefix is None
    state = tuple(
        np.asarray(x, dtype=np.int32) for x in draw(st.lists(st.lists(i32, max_size=5), max_size=4))
    )
    return TransferMetadata(
        room=draw(st.integers(0, 2**64 - 1)),
        endpoint=draw(ascii_text),
        dst_port=draw(st.integers(0, 65535)),
        engine_key=draw(ascii_text),
        dst_kv_indices=kv,
        dst_aux_index=aux,
        dst_state_indices=state,
        required_dst_info_num=draw(st.integers(1, 8)),
        is_dummy=dummy or (kv.size == 0 and aux < 0 and prefix is None),
        decode_prefix_len=prefix,
    )


@FAST
@given(metadata())
def test_metadata_round_trip(meta: TransferMetadata) -> None:
    out = decode_metadata(encode_metadata(meta))
    assert (out.room, out.endpoint, out.dst_port, out.engine_key) == (
        meta.room,
        meta.endpoint,
        meta.dst_port,
        meta.engine_key,
    )
    assert (out.required_dst_info_num, out.decode_prefix_len, out.is_dummy) == (
        meta.required_dst_info_num,
        meta.decode_prefix_len,
        meta.is_dummy,
    )
    if meta.is_dummy:
        assert out.dst_kv_indices.size == 0 and out.dst_aux_index == -1 and out.dst_state_indices == ()
    else:
        assert out.dst_kv_indices.tolist() == meta.dst_kv_indices.tolist()
        assert out.dst_aux_index == meta.dst_aux_index
        assert [a.tolist() for a in out.dst_state_indices] == [a.tolist() for a in meta.dst_state_indices]


FIELD_BYTES = st.sampled_from(
    [
        b"",
        b"0",
        b"7",
        b"-1",
        b"007",
        b"65535",
        b"65536",
        b"2147483647",
        b"2147483648",
        b"None",
        b"1 ",
        b"\x7f",
    ]
) | st.binary(max_size=12)


def _fields(m: TransferMetadata) -> tuple[object, ...]:
    arrays = (m.dst_kv_indices, *m.dst_state_indices)
    return (
        m.room,
        m.endpoint,
        m.dst_port,
        m.engine_key,
        m.dst_aux_index,
        m.required_dst_info_num,
        m.is_dummy,
        m.decode_prefix_len,
        [(a.dtype, a.flags.writeable, a.tolist()) for a in arrays],
    )


@FAST
@given(metadata(), st.dictionaries(st.integers(1, 10), FIELD_BYTES, max_size=3))
def test_one_pass_decode_equals_the_general_path(meta: TransferMetadata, edits: dict[int, bytes]) -> None:
    """Valid and mangled frames: the one-pass decoder gives what the general path gives, or declines."""
    frames = encode_metadata(meta)
    for i, value in edits.items():
        frames[i % len(frames)] = value
    try:
        general: object = _fields(_general_decode(frames))
    except WireFormatError as exc:
        general = str(exc)
    if frames[0] == GUARD:  # decode_metadata checks the guard before either path
        plain = metadata_module._decode_plain(frames)
        if plain is not None:
            assert _fields(plain) == general
    try:
        assert _fields(decode_metadata(frames)) == general
    except WireFormatError as exc:
        assert str(exc) == general


def _general_decode(frames: list[bytes]) -> TransferMetadata:
    with patch.object(metadata_module, "_decode_plain", lambda f: None):
        return decode_metadata(frames)
