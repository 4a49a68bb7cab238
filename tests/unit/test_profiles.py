"""Model profiles and ``schema_from_config``: structure, sizes, and the errors of explicit mode."""

from __future__ import annotations

import pytest

from dataplane.config import parse_config
from dataplane.errors import SchemaError, UnknownStateType
from dataplane.schema import SendRule
from dataplane.schema.profiles import PROFILES, profile, profile_names, schema_from_config


@pytest.mark.parametrize("name", profile_names())
@pytest.mark.parametrize("tp", [1, 2])
def test_counts_alone_fit_a_profile_in_a_demo_pool(name: str, tp: int) -> None:
    """The demo's counts (one layer of each kind, 512 pages, 32 slots) keep every real-size profile
    within a few hundred MB; the same counts with every layer hold the whole model's layout."""
    p = profile(name)
    schema = p.schema(tp_size=tp, tp_rank=tp - 1, pool_pages=512, max_requests=32, layers=p.pattern_layers)
    assert {c.name for c in schema.components} == {c.name for c in p.schema().components}
    total = sum(r.size for r in schema.regions())
    assert 10 << 20 < total < 400 << 20
    assert schema.model == name and schema.tp_rank == tp - 1
    full = profile(name).schema(tp_size=tp, pool_pages=512, max_requests=32)
    assert full.kv.item_len == schema.kv.item_len and len(full.kv.layer_ids) > len(schema.kv.layer_ids)


@pytest.mark.parametrize(
    ("name", "kv_bytes_per_token"),
    [
        ("qwen3-next", 2 * 256 * 2),
        ("deepseek-v3.2", (512 + 64) * 2),
        ("gpt-oss", 8 * 64 * 2),
        ("pure-kv", 8 * 128 * 2),
        ("minimax-m2", 8 * 128 * 2),
    ],
)
def test_kv_is_the_models_real_size_per_token(name: str, kv_bytes_per_token: int) -> None:
    """Head counts and head dims of the public model configs, bfloat16: no divisor anywhere."""
    assert profile(name).schema(page_size=16, layers=1).kv.item_len == 16 * kv_bytes_per_token


def test_every_send_rule_has_a_profile() -> None:
    rules = {c.info.rule for p in PROFILES.values() for c in p.schema().components}
    assert rules == set(SendRule)


def test_qwen3_next_layout() -> None:
    s = profile("qwen3-next").schema(tp_size=2)
    full = tuple(range(3, 48, 4))
    assert s.kv.layer_ids == full + full and s.kv.layout == "mha"
    (mamba,) = s.components
    assert mamba.state_type == "mamba" and len(mamba.tensors) == 2 * 36 and mamba.num_items == 64
    conv, temporal = mamba.tensors[:2]
    assert conv.layer_id == temporal.layer_id == 0
    assert sum(conv.conv_shard_groups) == conv.tp_dim * 2 and len(conv.conv_shard_groups) == 3
    assert temporal.tp_dim == 16
    assert s.state_dim_per_tensor[0][:2] == [conv.tp_dim, 16]
    assert profile("qwen3-next").schema(tp_size=1).components[0].tensors[0].item_len == 2 * conv.item_len


def test_deepseek_mla_kv_is_not_split_by_tp() -> None:
    one, two = (profile("deepseek-v3.2").schema(tp_size=t) for t in (1, 2))
    assert one.kv.item_len == two.kv.item_len and one.kv.layout == "mla"
    assert len(one.kv.layer_ids) == 61
    (dsa,) = one.components
    assert dsa.state_type == "dsa" and len(dsa.tensors) == 61 and dsa.info.rule is SendRule.PAGED
    assert one.state_dim_per_tensor == [[]]


def test_gpt_oss_alternates_full_and_swa() -> None:
    s = profile("gpt-oss").schema()
    assert set(s.kv.layer_ids) == set(range(1, 36, 2))
    (swa,) = s.components
    assert [t.layer_id for t in swa.tensors][:4] == [0, 0, 2, 2]


def test_real_sizes_with_layers_cut() -> None:
    real = profile("qwen3-next").schema(layers=4, pool_pages=1)
    assert real.kv.item_len == 64 * 2 * 256 * 2
    assert [t.item_len for t in real.components[0].tensors[:2]] == [8192 * 3 * 2, 32 * 128 * 128 * 4]
    assert real.kv.layer_ids == (3, 3)
    dsa = profile("deepseek-v3.2").schema(layers=2).components[0]
    assert [t.item_len for t in dsa.tensors] == [64 * (128 + 4)] * 2


@pytest.mark.parametrize(
    ("name", "kwargs", "match"),
    [
        ("qwen3-next", {"tp_size": 32}, "does not divide"),
        ("qwen3-next", {"pool_pages": 0}, "must be > 0"),
        ("pure-kv", {"tp_size": 3}, "power of two"),
        ("gpt-oss", {"layers": 37}, "'gpt-oss' has 36 layers, not 37: ask for at most that"),
        ("gpt-oss", {"layers": 0}, "layers, page_size, pool_pages, max_requests must be > 0"),
    ],
    ids=["tp-over-heads", "no-pages", "tp-not-power-of-two", "more-layers-than-the-model", "no-layers"],
)
def test_profile_schema_rejects(name: str, kwargs: dict, match: str) -> None:
    with pytest.raises(SchemaError, match=match):
        profile(name).schema(**kwargs)


def test_unknown_profile() -> None:
    with pytest.raises(SchemaError, match=r"unknown model profile 'nope'; known profiles: deepseek-v3\.2"):
        profile("nope")


def test_schema_from_config_profile_mode() -> None:
    cfg = parse_config(
        "role: decode\ntpRank: 1\ndecode: {tpSize: 2}\nmodel: {profile: gpt-oss, poolPages: 8}\n"
    )
    s = schema_from_config(cfg)
    assert (s.tp_size, s.tp_rank, s.kv.num_pages) == (2, 1, 8)
    assert s == profile("gpt-oss").schema(tp_size=2, tp_rank=1, pool_pages=8, layers=4)
    assert len(s.kv.layer_ids) == 4 and len(s.components[0].tensors) == 4
    whole = schema_from_config(parse_config("model: {profile: gpt-oss, poolPages: 8, layers: 0}\n"))
    assert whole == profile("gpt-oss").schema(pool_pages=8) and len(whole.kv.layer_ids) == 36
    with pytest.raises(SchemaError, match=r"^model.layers 37: profile 'gpt-oss' has 36 layers; set at most"):
        schema_from_config(parse_config("model: {profile: gpt-oss, layers: 37}\n"))


EXPLICIT = "model: {profile: null, name: m, kvItemLen: 4096, kvLayers: 2, poolPages: 16, components: [%s]}"


def test_schema_from_config_explicit_mode() -> None:
    comp = "{name: m, stateType: mamba, itemLens: [96, 64], numItems: 8, tpDims: [3, 4], layerIds: [5, 5]}"
    s = schema_from_config(parse_config(EXPLICIT % comp))
    assert s.kv.layer_ids == (0, 1, 0, 1) and s.kv.item_len == 4096
    assert s.state_dim_per_tensor == [[3, 4]] and s.state_layer_ids == [[5, 5]]


@pytest.mark.parametrize(
    ("text", "error", "match"),
    [
        ("model: {profile: null, kvLayers: 2}", SchemaError, "kvItemLen must be a positive"),
        ("model: {profile: null, kvItemLen: 64}", SchemaError, "kvLayers must be positive"),
        (
            EXPLICIT % "{name: a, stateType: bogus, itemLens: [8], numItems: 1}",
            UnknownStateType,
            r"components\[0\] \('a'\): unknown state type 'bogus'",
        ),
        (EXPLICIT % "{name: a, stateType: swa, itemLens: [], numItems: 1}", SchemaError, "itemLens is empty"),
        (
            EXPLICIT % "{name: a, stateType: mamba, itemLens: [8, 8], numItems: 1, tpDims: [2]}",
            SchemaError,
            "tpDims has 1 entries for 2",
        ),
        (
            EXPLICIT % "{name: a, stateType: mamba, itemLens: [10], numItems: 1, tpDims: [3]}",
            SchemaError,
            "not a multiple of tp_dim 3",
        ),
        (
            EXPLICIT % "{name: a, stateType: swa, itemLens: [8], numItems: 0}",
            SchemaError,
            "num_items must be positive",
        ),
        (
            EXPLICIT % "{name: a, stateType: swa, itemLens: [8], numItems: 1, layerIds: [1, 2]}",
            SchemaError,
            "layerIds has 2",
        ),
        (
            EXPLICIT
            % (
                "{name: a, stateType: swa, itemLens: [8], numItems: 1}, "
                "{name: a, stateType: dsa, itemLens: [8], numItems: 1}"
            ),
            SchemaError,
            "unique",
        ),
    ],
    ids=[
        "no-kv-item-len",
        "no-kv-layers",
        "unknown-type",
        "no-tensors",
        "tp-dims-length",
        "item-not-multiple",
        "no-items",
        "layer-ids-length",
        "duplicate-names",
    ],
)
def test_schema_from_config_explicit_errors(text: str, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        schema_from_config(parse_config(text))
