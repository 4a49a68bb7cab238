"""The schema a sidecar agent adopts from its engine (``localapi.engine_schema``): the manifest and the
regions give back exactly the engine's schema for every profile and TP rank, and a hostile or broken
manifest is refused with one error naming the problem."""

from __future__ import annotations

import msgspec
import pytest

from dataplane.codec import encode_manifest, manifest_from_schema
from dataplane.config import AgentConfig, ModelConfig
from dataplane.errors import LocalApiError
from dataplane.localapi.engine_schema import MAX_TENSORS, check_manifest_bounds, schema_from_engine
from dataplane.localapi.messages import Hello, PoolRegion
from dataplane.localapi.sidecar import Sidecar, configured_schema, engine_manifest
from dataplane.schema.profiles import profile_names, schema_from_config


def schema(profile="qwen3-next", tp_size=1, tp_rank=0):
    cfg = AgentConfig(
        model=ModelConfig(profile=profile, pool_pages=16, max_requests=4),
        prefill=msgspec.structs.replace(AgentConfig().prefill, tp_size=tp_size),
        tp_rank=tp_rank,
    )
    return schema_from_config(cfg)


def regions(s):
    return [PoolRegion(name=r.name, component=r.component, tensor=r.tensor, size=r.size, kind="fd")
            for r in s.regions()]


@pytest.mark.parametrize("profile", profile_names())
@pytest.mark.parametrize(("tp_size", "tp_rank"), [(1, 0), (2, 1), (4, 2)])
def test_the_engines_schema_comes_back_whole(profile, tp_size, tp_rank):
    s = schema(profile, tp_size, tp_rank)
    m = manifest_from_schema(s, role="prefill")
    check_manifest_bounds(m)
    assert schema_from_engine(m, regions(s)) == s


def test_a_region_that_is_not_whole_items_is_refused():
    s = schema()
    rs = regions(s)
    rs[0] = msgspec.structs.replace(rs[0], size=rs[0].size + 1)
    with pytest.raises(LocalApiError, match=r"incompatible: kv/0: \d+ bytes is not a whole number"):
        schema_from_engine(manifest_from_schema(s, role="prefill"), rs)


def test_a_manifest_without_aux_is_refused():
    m = msgspec.structs.replace(manifest_from_schema(schema(), role="prefill"), aux_item_lens=())
    with pytest.raises(LocalApiError, match="no aux buffers described"):
        schema_from_engine(m, regions(schema()))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda m: msgspec.structs.replace(m, components=m.components * 65), "65 components, at most 64"),
        (lambda m: msgspec.structs.replace(
            m, kv=msgspec.structs.replace(m.kv, num_layers=MAX_TENSORS + 1, layer_ids=())),
         f"{MAX_TENSORS + 1} KV buffers"),
        (lambda m: msgspec.structs.replace(
            m, components=(msgspec.structs.replace(m.components[0], num_items=1 << 40),)),
         "items, at most"),
        (lambda m: msgspec.structs.replace(m, aux_item_lens=(1 << 41,)), "an item of 2199023255552 bytes"),
    ],
)
def test_manifest_bounds(change, match):
    with pytest.raises(LocalApiError, match=match):
        check_manifest_bounds(change(manifest_from_schema(schema(), role="prefill")))


def hello(s, **kw):
    return Hello(version=1, role="prefill", engine_id="e",
                 manifest=encode_manifest(manifest_from_schema(s, role="prefill")), **kw)


@pytest.mark.parametrize(
    ("s", "kw", "match"),
    [
        (schema(tp_size=2, tp_rank=1), {}, "manifest is prefill rank 1 of 2, its Hello prefill rank 0 of 1"),
        (schema(), {"tp_rank": 2, "tp_size": 2}, "the rank must be below tp_size"),
        (schema(), {"tp_size": 4, "dp_size": 3}, "dp_size must divide tp_size"),
        (schema(tp_size=2, tp_rank=0), {"tp_rank": 3, "tp_size": 4, "dp_size": 2},
         r"attention TP rank 1 of 2"),
    ],
)
def test_hello_ranks_must_agree_with_the_manifest(s, kw, match):
    with pytest.raises(LocalApiError, match=match):
        engine_manifest(hello(s, **kw))


def test_dp_attention_ranks_agree_with_their_attention_group():
    m = engine_manifest(hello(schema(tp_size=2, tp_rank=1), tp_rank=3, tp_size=4, dp_size=2))
    assert (m.tp_rank, m.tp_size) == (1, 2)


def test_garbage_manifest_is_one_clear_error():
    with pytest.raises(LocalApiError, match="bad_request: engine manifest: manifest: missing magic"):
        engine_manifest(Hello(version=1, role="prefill", engine_id="e", manifest=b"\x00" * 64))


def test_an_agent_without_a_layout_takes_any_engine_schema(tmp_path):
    cfg = AgentConfig(model=ModelConfig(profile=None)).with_engine(
        mode="external", socket_path=str(tmp_path / "s.sock")
    )
    assert configured_schema(cfg) is None
    sidecar = Sidecar(cfg)
    for profile in ("qwen3-next", "gpt-oss"):
        assert sidecar.hello(hello(schema(profile)))
    with pytest.raises(LocalApiError, match="not_registered"):
        assert sidecar.schema


def test_an_agent_with_a_profile_needs_the_engine_to_match(tmp_path):
    cfg = AgentConfig(model=ModelConfig(profile="qwen3-next", pool_pages=16, max_requests=4)).with_engine(
        mode="external", socket_path=str(tmp_path / "s.sock")
    )
    sidecar = Sidecar(cfg)
    assert sidecar.schema == schema()
    with pytest.raises(LocalApiError, match="incompatible: engine schema differs from the agent's: model"):
        sidecar.hello(hello(schema("gpt-oss")))
