"""sglang's state-type names: every ``StateType`` of sglang 0.5.23 maps to a rule or is refused by name,
and the older ``nsa`` is ``dsa`` wherever sglang's names reach us (engine, manifest, config).

The enum is read from the installed sglang 0.5.23's ``disaggregation/base/conn.py`` (parsed with
``ast``, never imported), so a state type sglang adds or drops fails here until the mapping says
what to do with it."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
from pathlib import Path

import pytest

from dataplane.codec import check_compatible, decode_manifest, encode_manifest, manifest_from_schema
from dataplane.config import parse_config
from dataplane.errors import BadInput, UnknownStateType
from dataplane.harness.bench import sglang_ref
from dataplane.schema import (
    SGLANG_STATE_TYPES,
    SGLANG_STATE_TYPES_REFUSED,
    Component,
    KVSpec,
    RoleSchema,
    SendRule,
    TensorSpec,
    sglang_state_type,
    state_type,
)
from dataplane.schema.profiles import schema_from_config

_BASE_CONN = "sglang/srt/disaggregation/base/conn.py"


def _wheel_state_types() -> dict[str, str]:
    """``StateType`` member name → value, from the wheel's source."""
    spec = importlib.util.find_spec("sglang")  # scripts/setup installs sglang's CPU test set
    assert spec is not None and spec.submodule_search_locations, "sglang is not installed: run scripts/setup"
    assert importlib.metadata.version("sglang") == sglang_ref.SGLANG_VERSION
    source = Path(next(iter(spec.submodule_search_locations))).parent / _BASE_CONN
    tree = ast.parse(source.read_text())
    (enum,) = (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "StateType")
    members = {}
    for stmt in enum.body:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant):
            (target,) = stmt.targets
            assert isinstance(target, ast.Name) and isinstance(stmt.value.value, str)
            members[target.id] = stmt.value.value
    assert members, f"{_BASE_CONN} has no StateType members"
    return members


def test_the_mapping_covers_exactly_sglangs_state_types() -> None:
    values = set(_wheel_state_types().values())
    assert values == set(SGLANG_STATE_TYPES) | set(SGLANG_STATE_TYPES_REFUSED)
    assert not set(SGLANG_STATE_TYPES) & set(SGLANG_STATE_TYPES_REFUSED)


@pytest.mark.parametrize("member", sorted(SGLANG_STATE_TYPES))
def test_every_mapped_state_type_has_a_rule(member: str) -> None:
    info = sglang_state_type(member)
    assert info is state_type(SGLANG_STATE_TYPES[member])
    assert isinstance(info.rule, SendRule)


def test_every_wheel_state_type_maps_or_is_refused_by_name() -> None:
    for member, value in _wheel_state_types().items():
        try:
            info = sglang_state_type(value)
        except BadInput as exc:
            text = str(exc)
            assert repr(value) in text and "\n" not in text, (member, text)
            assert value in SGLANG_STATE_TYPES_REFUSED, member
        else:
            assert info.name == SGLANG_STATE_TYPES[value], member


@pytest.mark.parametrize(
    ("name", "rule", "sliceable"),
    [
        ("mamba", SendRule.SLOT, True),
        ("swa", SendRule.PAGED, False),
        ("dsa", SendRule.PAGED, False),
        ("block_scale", SendRule.PAGED, False),
        ("block_scale_swa", SendRule.PAGED, False),
        ("swa_ring", SendRule.POSITIONAL, False),
        ("c128_state", SendRule.POSITIONAL, False),
        ("request_row", SendRule.POSITIONAL, False),
        ("qsa_pending", SendRule.POSITIONAL, False),
        ("minimax_dense_kv", SendRule.POSITIONAL, False),
    ],
)
def test_rules_follow_how_sglang_sends_each_type(name: str, rule: SendRule, sliceable: bool) -> None:
    info = sglang_state_type(name)
    assert (info.rule, info.tp_sliceable) == (rule, sliceable)


def test_dsa_tail_is_refused_with_its_name_and_why() -> None:
    with pytest.raises(UnknownStateType, match=r"^sglang state type 'dsa_tail' is not supported") as info:
        sglang_state_type("dsa_tail")
    assert "ring segment" in str(info.value)


def test_an_unknown_name_is_refused_with_its_name() -> None:
    with pytest.raises(UnknownStateType, match=r"unknown sglang state type 'mamba2'; .*: block_scale, "):
        sglang_state_type("mamba2")


def test_nsa_is_dsa_for_the_engine_and_the_registry() -> None:
    assert sglang_state_type("nsa") is sglang_state_type("dsa") is state_type("nsa")
    comp = Component("idx", "nsa", (TensorSpec(132),), 16)
    assert comp.state_type == "dsa" and comp.info.rule is SendRule.PAGED


def _rank(state: str) -> RoleSchema:
    comp = Component("idx", state, (TensorSpec(132, layer_id=0),), 16)
    kv = KVSpec(item_len=4096, num_pages=16, layer_ids=(0,), layout="mla")
    return RoleSchema(model="m", tp_size=1, tp_rank=0, kv=kv, components=(comp,))


def test_a_manifest_naming_nsa_pairs_with_one_naming_dsa() -> None:
    """A peer's manifest that still says ``nsa`` decodes as ``dsa`` and pairs with a ``dsa`` rank."""
    frame = encode_manifest(manifest_from_schema(_rank("dsa"), role="decode"))
    old = frame.replace(b"\xa3dsa", b"\xa3nsa")
    assert old != frame
    decoded = decode_manifest(old)
    assert decoded.components[0].state_type == "dsa"
    check_compatible(manifest_from_schema(_rank("dsa"), role="prefill"), decoded)


def test_a_config_naming_nsa_builds_a_dsa_component() -> None:
    text = (
        "model: {profile: null, name: m, kvItemLen: 4096, kvLayers: 1, poolPages: 16, "
        "components: [{name: idx, stateType: nsa, itemLens: [132], numItems: 16}]}"
    )
    (comp,) = schema_from_config(parse_config(text)).components
    assert comp.state_type == "dsa"
