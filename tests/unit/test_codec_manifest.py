"""The schema manifest frame and the negotiation that refuses incompatible peers with clear reasons."""

from __future__ import annotations

import msgspec
import pytest

from dataplane.codec import (
    ComponentSummary,
    Manifest,
    check_compatible,
    decode_manifest,
    encode_manifest,
    incompatibilities,
    manifest_from_schema,
)
from dataplane.errors import IncompatiblePeer, SchemaError, UnknownStateType, WireFormatError
from dataplane.schema import Component, KVSpec, RoleSchema, TensorSpec

replace = msgspec.structs.replace


def schema(
    tp: int = 2,
    *,
    layout: str = "mha",
    kv_item_len: int | None = None,
    swa: bool = True,
    dsa: bool = True,
    mamba_scale: int | None = None,
) -> RoleSchema:
    """A mamba+swa+dsa rank at attention-TP ``tp``; mamba items split along TP."""
    per = (mamba_scale or 2) * 3072 // tp
    comps = [Component("mamba", "mamba", (TensorSpec(per * 2, tp_dim=per), TensorSpec(1 << 20)), 64)]
    if swa:
        comps.append(Component("swa", "swa", (TensorSpec(32768, layer_id=1),), 512))
    if dsa:
        comps.append(Component("dsa", "dsa", (TensorSpec(8448, layer_id=2),), 512))
    return RoleSchema(
        model="m",
        tp_size=tp,
        tp_rank=0,
        kv=KVSpec(item_len=kv_item_len or 8192 // tp, num_pages=64, layer_ids=(0, 1), layout=layout),  # type: ignore[arg-type]
        components=tuple(comps),
    )


def pair(p: RoleSchema, d: RoleSchema, gp: str = "", gd: str = "") -> tuple[Manifest, Manifest]:
    return manifest_from_schema(p, role="prefill", generation=gp), manifest_from_schema(
        d, role="decode", generation=gd
    )


def reason(p: Manifest, d: Manifest) -> str:
    with pytest.raises(IncompatiblePeer) as info:
        check_compatible(p, d)
    return info.value.reason


def test_manifest_from_schema_and_round_trip() -> None:
    m = manifest_from_schema(schema(), role="decode", generation="g1")
    assert [c.name for c in m.components] == ["mamba", "swa", "dsa"]
    assert m.components[0].item_lens == (6144, 1 << 20) and m.components[0].tp_dims == (3072, 0)
    assert (m.kv.item_len, m.kv.num_layers, m.page_size, m.format_version) == (4096, 2, 64, 1)
    frame = encode_manifest(m)
    assert frame[:5] == b"PDPM\x01"
    assert decode_manifest(frame) == m
    with pytest.raises(SchemaError, match="role"):
        manifest_from_schema(schema(), role="router")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("frame", "err", "needle"),
    [
        (b"PDPX\x01", WireFormatError, "missing magic"),
        (b"PDPM", WireFormatError, "truncated"),
        (b"PDPM\x02\x80", WireFormatError, "framing version 2"),
        (b"PDPM\x01\xc1", WireFormatError, "manifest: "),
        (b"PDPM\x01\x80", WireFormatError, "missing required field"),
    ],
)
def test_decode_manifest_rejects_garbage(frame: bytes, err: type[Exception], needle: str) -> None:
    with pytest.raises(err, match=needle):
        decode_manifest(frame)


def test_decode_manifest_checks_state_types_and_list_lengths() -> None:
    m = manifest_from_schema(schema(), role="decode")
    odd = replace(m, components=(replace(m.components[0], tp_dims=(1,)),))
    with pytest.raises(WireFormatError, match="2 item lens but 1 tp dims"):
        decode_manifest(b"PDPM\x01" + msgspec.msgpack.encode(odd))
    alien = replace(m, components=(replace(m.components[0], state_type="hyena"),))
    with pytest.raises(UnknownStateType, match="hyena"):
        decode_manifest(b"PDPM\x01" + msgspec.msgpack.encode(alien))


def test_compatible_pairs_pass() -> None:
    check_compatible(*pair(schema(2), schema(2), "abc", "abc"))
    check_compatible(*pair(schema(2), schema(2), "abc", ""))
    check_compatible(
        *pair(schema(2, layout="mla", kv_item_len=576), schema(4, layout="mla", kv_item_len=576))
    )


def test_tp_mismatched_mamba_is_compatible_when_item_lens_scale() -> None:
    p, d = pair(schema(2, swa=False), schema(4, swa=False))
    assert p.components[0].item_lens[0] == 2 * d.components[0].item_lens[0]
    check_compatible(p, d)


def test_mamba_item_length_mismatch_with_equal_tp() -> None:
    p, d = pair(schema(2), schema(2, mamba_scale=1))
    assert "mamba item length 6144 vs 3072 with equal TP sizes (2)" in reason(p, d)


def test_mamba_that_does_not_scale_with_tp() -> None:
    p, d = pair(schema(2, swa=False), schema(4, swa=False, mamba_scale=1))
    assert "does not scale to 1536 / 768 on decode (TP 4)" in reason(p, d)


def test_component_type_mismatch_is_named() -> None:
    p, d = pair(schema(), schema())
    d = replace(d, components=(d.components[0], replace(d.components[1], state_type="dsa"), d.components[2]))
    assert "component 1 is `swa` on prefill but `dsa` on decode" in reason(p, d)


def test_component_count_mismatch_names_the_missing_component() -> None:
    text = reason(*pair(schema(), schema(dsa=False)))
    assert "prefill declares 3 components but decode 2; decode lacks component 2 `dsa` (dsa)" in text


def test_kv_page_dtype_and_generation_mismatches() -> None:
    p, d = pair(schema(), schema(kv_item_len=2048), "abc123", "def456")
    d = replace(d, page_size=32, kv=replace(d.kv, dtype="float8_e4m3fn"))
    text = reason(p, d)
    assert "prefill generation abc123 ≠ decode generation def456" in text
    assert "page size 64 on prefill vs 32 on decode" in text
    assert "kv dtype bfloat16 on prefill vs float8_e4m3fn on decode" in text
    assert "kv item length 4096 on prefill vs 2048 on decode with equal TP sizes" in text


def test_component_dtype_and_name_mismatch() -> None:
    p, d = pair(schema(), schema())
    d = replace(d, components=(replace(d.components[0], dtype="float32", name="ssm"), *d.components[1:]))
    text = reason(p, d)
    assert "component 0 (`mamba`) dtype bfloat16 on prefill vs float32 on decode" in text
    assert "component 0 is named `mamba` on prefill but `ssm` on decode" in text


def test_non_mla_swa_with_mismatched_tp_is_rejected() -> None:
    assert "non-MLA swa with mismatched TP (prefill 2, decode 4)" in reason(*pair(schema(2), schema(4)))


def test_mha_kv_that_cannot_be_head_sliced() -> None:
    p, d = pair(schema(2, swa=False, kv_item_len=3000), schema(4, swa=False, kv_item_len=2048))
    assert "cannot be head-sliced" in reason(p, d)


def test_unknown_state_type_is_a_reason_not_a_crash() -> None:
    p, d = pair(schema(), schema())
    alien = ComponentSummary("x", "hyena", "bfloat16", (64,), (0,), 8)
    d = replace(d, components=(*d.components[:2], alien))
    assert "component 2 has unknown state type `hyena` on decode" in reason(p, d)


def test_roles_must_be_prefill_then_decode() -> None:
    p, d = pair(schema(), schema())
    assert incompatibilities(d, p)[0] == "expected a prefill and a decode manifest, got decode and prefill"
