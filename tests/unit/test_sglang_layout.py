"""sglang's ``KVArgs`` read as PDPair's schema (``dataplane.sglang.layout``), and what is refused.

The ``KVArgs`` here is sglang 0.5.23's own class, its state components appended by sglang's own
``append_state_component``, as ``setup_state_kv_args`` does for a hybrid GDN pool.
"""

from __future__ import annotations

import pytest

conn = pytest.importorskip("sglang.srt.disaggregation.base.conn")
utils = pytest.importorskip("sglang.srt.disaggregation.utils")

from dataplane.schema import AUX_COMPONENT, KV_COMPONENT  # noqa: E402
from dataplane.sglang.layout import Unsupported, layout_from_kvargs  # noqa: E402


def kv_args(**over):
    a = conn.KVArgs()
    a.engine_rank, a.page_size, a.kv_cache_dtype_str = 0, 16, "auto"
    a.kv_data_ptrs, a.kv_data_lens, a.kv_item_lens = [0x1000, 0x9000], [4096 * 8] * 2, [4096] * 2
    a.kv_layer_ids = [3, 3]
    a.aux_data_ptrs, a.aux_data_lens, a.aux_item_lens = [0x20000, 0x30000], [64 * 4, 8 * 4], [64, 8]
    a.mla_compression_ratios = None
    for name in ("state_types", "state_data_ptrs", "state_data_lens", "state_item_lens",
                 "state_dim_per_tensor", "state_slice_outer_counts", "state_layer_ids",
                 "state_conv_shard_groups"):
        setattr(a, name, [])
    # a GDN layer: conv state (3 sub-blocks of 128 rows, kernel 3, bf16) and temporal state (4 heads)
    utils.append_state_component(
        a, conn.StateType.MAMBA, [0x40000, 0x50000], [5 * 2304, 5 * 16384], [2304, 16384],
        [384, 4], [[128, 128, 128], None], [1, 1], [0, 0],
    )
    for k, v in over.items():
        setattr(a, k, v)
    return a


def test_every_buffer_becomes_a_region_in_sglang_order_with_its_geometry():
    layout = layout_from_kvargs(kv_args(), model="m", tp_size=1, tp_rank=0, is_mla=False)
    s = layout.schema
    assert (s.kv.item_len, s.kv.num_pages, s.kv.layer_ids, s.kv.page_size) == (4096, 8, (3, 3), 16)
    assert s.aux.item_lens == (64, 8) and s.aux.num_items == 4
    (mamba,) = s.components
    assert (mamba.name, mamba.state_type, mamba.num_items) == ("mamba", "mamba", 5)
    conv, temporal = mamba.tensors
    assert (conv.item_len, conv.tp_dim, conv.conv_shard_groups) == (2304, 384, (128, 128, 128))
    assert (temporal.item_len, temporal.tp_dim, temporal.conv_shard_groups) == (16384, 4, ())
    assert [r.component for r in s.regions()] == [KV_COMPONENT] * 2 + [AUX_COMPONENT] * 2 + [0, 0]
    assert layout.buffers == (
        (0x1000, 4096 * 8), (0x9000, 4096 * 8), (0x20000, 256), (0x30000, 32),
        (0x40000, 5 * 2304), (0x50000, 5 * 16384),
    )


def test_nsa_is_dsa_and_a_second_component_of_a_type_gets_its_own_name():
    a = kv_args()
    for st in ("nsa", "dsa"):
        utils.append_state_component(a, st, [0x60000], [16 * 132 * 8], [16 * 132])
    names = [(c.name, c.state_type) for c in layout_from_kvargs(a, model="m", tp_size=1, tp_rank=0,
                                                               is_mla=True).schema.components]
    assert names == [("mamba", "mamba"), ("dsa", "dsa"), ("dsa2", "dsa")]


@pytest.mark.parametrize(("change", "line"), [
    ({"kv_item_lens": [4096, 2048]}, r"^pdpair: KV buffers of different page sizes \[2048, 4096\]"),
    ({"mla_compression_ratios": [0, 4]}, r"^pdpair: compressed-MLA pools \(DeepSeek-V4\) are not supported"),
    ({"kv_layer_ids": [3]}, r"^pdpair: 2 KV buffers but 1 kv_layer_ids$"),
])
def test_what_the_schema_cannot_carry_is_refused_in_one_line(change, line):
    with pytest.raises(Unsupported, match=line):
        layout_from_kvargs(kv_args(**change), model="m", tp_size=1, tp_rank=0, is_mla=False)


def test_dsa_tail_is_refused_by_name():
    a = kv_args()
    utils.append_state_component(a, conn.StateType.DSA_TAIL, [0x70000], [64], [8])
    with pytest.raises(Unsupported, match=r"^pdpair: .*'dsa_tail' is not supported by PDPair"):
        layout_from_kvargs(a, model="m", tp_size=1, tp_rank=0, is_mla=False)


@pytest.mark.parametrize(("is_mla", "ptrs", "ids"), [
    (False, [0x1000, 0x9000, 0x11000, 0x19000], (4, 5, 4, 5)),  # K per layer, then V per layer
    (True, [0x1000, 0x9000], (4, 5)),
])
def test_pools_sglang_pairs_by_position_get_layer_ids_by_position(is_mla, ptrs, ids):
    """``build_kv_layer_ids`` gives ``[]`` for every pool but the hybrid ones."""
    a = kv_args(kv_layer_ids=[], kv_data_ptrs=ptrs, kv_data_lens=[4096 * 8] * len(ptrs),
                kv_item_lens=[4096] * len(ptrs))
    a.prefill_start_layer = 4
    layout = layout_from_kvargs(a, model="m", tp_size=1, tp_rank=0, is_mla=is_mla)
    assert layout.schema.kv.layer_ids == ids


def test_an_odd_count_of_positional_mha_buffers_is_refused():
    a = kv_args(kv_layer_ids=[], kv_data_ptrs=[0x1000], kv_data_lens=[4096 * 8], kv_item_lens=[4096])
    with pytest.raises(Unsupported, match=r"^pdpair: 1 MHA KV buffers are not K and V per layer$"):
        layout_from_kvargs(a, model="m", tp_size=1, tp_rank=0, is_mla=False)
