"""The planner's grouping and TP slicing against golden vectors produced by sglang 0.5.23 itself."""

from __future__ import annotations

import json

import numpy as np
import pytest
from codec_vectors import VECTORS

from dataplane.planner import contiguous_runs, group_concurrent_contiguous, slice_byte_blocks


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
