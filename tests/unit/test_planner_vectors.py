"""The planner's grouping and TP slicing against golden vectors produced by sglang 0.5.23 itself."""

from __future__ import annotations

import json

import numpy as np
import pytest
from codec_vectors import VECTORS

from dataplane.planner import (
    PeerComponent,
    PeerLayout,
    PeerRegion,
    RequestIndices,
    contiguous_runs,
    group_concurrent_contiguous,
    plan_request,
    slice_byte_blocks,
)
from dataplane.schema import Component, KVSpec, RoleSchema, TensorSpec


@pytest.mark.parametrize("case", VECTORS["group_concurrent_contiguous"], ids=lambda c: str(c["src"]))
def test_group_concurrent_contiguous_matches_sglang(case: dict) -> None:
    src, dst = np.array(case["src"], np.int32), np.array(case["dst"], np.int32)
    assert group_concurrent_contiguous(src, dst) == (case["src_groups"], case["dst_groups"])
    s_start, d_start, length = contiguous_runs(src, dst)
    assert [[int(a)] for a in s_start] == [g[:1] for g in case["src_groups"]]
    assert [[int(a)] for a in d_start] == [g[:1] for g in case["dst_groups"]]
    assert length.tolist() == [len(g) for g in case["src_groups"]]


@pytest.mark.parametrize(
    "case", VECTORS["mamba_state_slice_byte_blocks"], ids=lambda c: json.dumps(c["args"], sort_keys=True)
)
def test_mamba_slice_blocks_match_sglang(case: dict) -> None:
    a = case["args"]
    blocks = slice_byte_blocks(
        src_item_len=a["src_item_len"],
        dst_item_len=a["dst_item_len"],
        src_dim=a["src_dim"],
        dst_dim=a["dst_dim"],
        outer_count=a["outer_count"],
        src_tp=a["src_attn_tp_size"],
        dst_tp=a["dst_attn_tp_size"],
        dst_rank=a["dst_tp_rank_in_group"],
        local_rank=a["local_tp_rank_in_group"],
        conv_shard_groups=a.get("conv_shard_groups"),
    )
    assert [list(b) for b in blocks] == case["blocks"]


def test_all_five_slice_vectors_present() -> None:
    assert len(VECTORS["mamba_state_slice_byte_blocks"]) == 5
    assert len(VECTORS["tp_slice_writes"]) == 3


PAGES = 16


def _prefill(p: dict) -> RoleSchema:
    """The sending rank of a ``tp_slice_writes`` case: its engine rank taken modulo its attention-TP
    size, as the agent is handed it; one K and one V buffer for layer 0; one mamba component."""
    tensors = tuple(
        TensorSpec(n, layer_id=lid, tp_dim=dim, outer_count=outer, conv_shard_groups=tuple(groups or ()))
        for n, dim, groups, outer, lid in zip(
            p["state_item_lens"],
            p["state_dim_per_tensor"],
            p["state_conv_shard_groups"],
            p["state_slice_outer_counts"],
            p["state_layer_ids"],
            strict=True,
        )
    )
    kv = KVSpec(item_len=p["kv_item_len"], num_pages=PAGES, layer_ids=(0, 0), page_size=p["page_size"])
    return RoleSchema(
        model="m",
        tp_size=p["attn_tp_size"],
        tp_rank=p["engine_rank"] % p["attn_tp_size"],
        kv=kv,
        components=(Component("mamba", "mamba", tensors, PAGES),),
    )


def _decode(d: dict) -> PeerLayout:
    """The decode rank as its registration describes it: the engine rank exactly as sglang sent it."""
    kv = PeerRegion(d["dst_kv_item_len"], PAGES)
    comp = PeerComponent(
        tuple(PeerRegion(n, PAGES) for n in d["dst_state_item_lens"]),
        dims=tuple(d["dst_state_dim_per_tensor"]),
        layer_ids=tuple(d["dst_state_layer_ids"]),
    )
    aux = (PeerRegion(64, 256),)
    return PeerLayout(d["decode_tp_size"], d["decode_tp_rank"], (kv, kv), (0, 0), aux, (comp,))


@pytest.mark.parametrize("case", VECTORS["tp_slice_writes"], ids=lambda c: c["name"])
def test_tp_sliced_writes_match_sglang_for_dp_attention_ranks(case: dict) -> None:
    """A decode rank registered with its DP-attention engine rank (at or above its attention-TP size)
    gets, from the planner, exactly the KV head slices and mamba blocks sglang's MoRI sender writes."""
    i = case["inputs"]
    local, peer = _prefill(i["prefill"]), _decode(i["decode"])
    assert peer.tp_rank >= peer.tp_size or local.tp_rank != i["prefill"]["engine_rank"]
    src, dst = [[i["state_index"]]], [[i["dst_state_index"]]]
    req = RequestIndices.of(i["kv_indices"], i["dst_kv_indices"], src_state=src, dst_state=dst)
    plan = plan_request(local, peer, req).expanded()

    def writes(mask: np.ndarray, *cols: np.ndarray) -> list[list[int]]:
        return sorted(list(map(int, row)) for row in zip(*(c[mask] for c in cols), strict=True))

    for region in (0, 1):
        mask = plan.local_region == region
        assert writes(mask, plan.local_offset, plan.remote_offset, plan.size) == sorted(case["kv_writes"])
    base = local.region_base(0)
    mask = plan.component == 0
    ours = writes(
        mask,
        plan.local_region - base,
        plan.remote_region - peer.region_base(0),
        plan.local_offset,
        plan.remote_offset,
        plan.size,
    )
    assert ours == sorted(case["mamba_writes"])


def test_a_dp_attention_rank_slices_as_its_rank_in_the_group() -> None:
    """Decode engine rank 5 of attention-TP 2 is rank 1 of its group: the same writes as rank 1."""
    (case,) = [c for c in VECTORS["tp_slice_writes"] if c["name"].startswith("dp-decode-rank-5")]
    local, dp = _prefill(case["inputs"]["prefill"]), _decode(case["inputs"]["decode"])
    assert (dp.tp_rank, dp.tp_size, dp.attn_tp_rank) == (5, 2, 1)
    plain = PeerLayout(dp.tp_size, 1, dp.kv, dp.kv_layer_ids, dp.aux, dp.components)
    other = PeerLayout(dp.tp_size, 4, dp.kv, dp.kv_layer_ids, dp.aux, dp.components)
    req = RequestIndices.of([3, 4], [5, 6], src_state=[[1]], dst_state=[[2]])
    ours, same, diff = (plan_request(local, p, req).expanded() for p in (dp, plain, other))
    assert ours.remote_offset.tolist() == same.remote_offset.tolist()
    assert ours.local_offset.tolist() != diff.local_offset.tolist()
