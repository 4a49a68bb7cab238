"""Planner rules, one named table per rule, and the bad inputs that must raise ``PlanError``."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

from dataplane.errors import PlanError
from dataplane.planner import (
    AUX_COMPONENT,
    KV_COMPONENT,
    PeerComponent,
    PeerLayout,
    PeerRegion,
    RequestIndices,
    WritePlan,
    plan_request,
    slice_byte_blocks,
    target_ranks,
)
from dataplane.schema import AuxSpec, Component, KVSpec, RoleSchema, TensorSpec
from dataplane.schema.profiles import profile

KV = -1


def schema(
    *comps: Component,
    tp: int = 1,
    rank: int = 0,
    kv_item: int = 0,
    pages: int = 32,
    layers: tuple[int, ...] = (0, 0),
    layout: str = "mha",
    page_size: int = 2,
) -> RoleSchema:
    kv = KVSpec(kv_item or 64 // tp, pages, layers, page_size=page_size, layout=layout)  # type: ignore[arg-type]
    return RoleSchema("t", tp, rank, kv, comps, AuxSpec((16, 8), 4))


def comp(name: str, state_type: str, *lens: int, items: int = 8, dims: tuple[int, ...] = ()) -> Component:
    tensors = tuple(TensorSpec(n, i // 2, tp_dim=dims[i] if dims else 0) for i, n in enumerate(lens))
    return Component(name, state_type, tensors, items)


def plan(local: RoleSchema, peer: RoleSchema | PeerLayout, **req: object) -> WritePlan:
    layout = peer if isinstance(peer, PeerLayout) else PeerLayout.from_schema(peer)
    kv = req.pop("kv", ([], []))
    return plan_request(local, layout, RequestIndices.of(*kv, **req))  # type: ignore[arg-type, misc]


# ---- KV -------------------------------------------------------------------------------------------

KV_CASES = {
    "two-runs": (
        ([1, 2, 3, 7], [10, 11, 12, 20]),
        [
            (0, 64, 0, 640, 192, KV),
            (0, 448, 0, 1280, 64, KV),
            (1, 64, 1, 640, 192, KV),
            (1, 448, 1, 1280, 64, KV),
        ],
    ),
    "dst-breaks-run": (
        ([4, 5], [9, 3]),
        [
            (0, 256, 0, 576, 64, KV),
            (0, 320, 0, 192, 64, KV),
            (1, 256, 1, 576, 64, KV),
            (1, 320, 1, 192, 64, KV),
        ],
    ),
    "descending": (
        ([2, 1], [1, 0]),
        [(0, 128, 0, 64, 64, KV), (0, 64, 0, 0, 64, KV), (1, 128, 1, 64, 64, KV), (1, 64, 1, 0, 64, KV)],
    ),
    "one-page": (([31], [0]), [(0, 1984, 0, 0, 64, KV), (1, 1984, 1, 0, 64, KV)]),
}


@pytest.mark.parametrize(("kv", "rows"), KV_CASES.values(), ids=KV_CASES.keys())
def test_kv_runs(kv: tuple[list[int], list[int]], rows: list[tuple[int, ...]]) -> None:
    assert plan(schema(), schema(), kv=kv).rows() == rows


def test_kv_pairs_buffers_by_layer_id() -> None:
    local = schema(layers=(3, 7, 3, 7))
    aux = (PeerRegion(16, 4), PeerRegion(8, 4))
    peer = PeerLayout(1, 0, tuple(PeerRegion(64, 32) for _ in range(4)), (7, 3, 7, 3), aux)
    rows = plan(local, peer, kv=([0], [5])).rows()
    assert [(r[0], r[2]) for r in rows] == [(0, 1), (1, 0), (2, 3), (3, 2)]


def test_kv_one_page_drift_is_truncated_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        p = plan(schema(), schema(), kv=([1, 2, 3], [4, 5]))
    assert p.total_bytes == 2 * 2 * 64 and "sending the first 2" in caplog.text


def test_kv_mla_with_tp_mismatch_copies_whole_pages() -> None:
    local, peer = (
        schema(kv_item=64, layout="mla", layers=(0,)),
        schema(tp=2, rank=1, kv_item=64, layout="mla", layers=(0,)),
    )
    assert plan(local, peer, kv=([1, 2], [5, 6])).rows() == [(0, 64, 0, 320, 128, KV)]


def test_kv_mha_tp_scatter_writes_each_token_half() -> None:
    # page of 2 tokens; prefill TP1 token row 32 bytes, decode TP2 token row 16 bytes (rank 1: upper half)
    local, peer = schema(layers=(0,)), schema(tp=2, rank=1, kv_item=32, layers=(0,))
    rows = plan(local, peer, kv=([1], [3])).rows()
    assert rows == [(0, 64 + 16, 0, 96, 16, KV), (0, 64 + 48, 0, 96 + 16, 16, KV)]


def test_kv_mha_tp_aggregation_places_each_rank() -> None:
    local, peer = schema(tp=2, rank=1, kv_item=32, layers=(0,)), schema(layers=(0,))
    rows = plan(local, peer, kv=([1], [3])).rows()
    assert rows == [(0, 32, 0, 192 + 16, 16, KV), (0, 48, 0, 192 + 48, 16, KV)]


# ---- aux and empty requests ------------------------------------------------------------------------


def test_aux_writes_one_item_per_buffer() -> None:
    rows = plan(schema(), schema(), src_aux=1, dst_aux=3).rows()
    assert rows == [(2, 16, 2, 48, 16, AUX_COMPONENT), (3, 8, 3, 24, 8, AUX_COMPONENT)]


def test_empty_request_gives_empty_plan() -> None:
    mamba = comp("m", "mamba", 32)
    p = plan(schema(mamba), schema(mamba), src_state=[None], dst_state=[[]])
    assert len(p) == 0 and p.total_bytes == 0 and p.bytes_by_component() == {}


def test_state_lists_may_be_shorter_than_components() -> None:
    a, b = comp("m", "mamba", 32), comp("w", "swa", 16)
    p = plan(schema(a, b), schema(a, b), src_state=[[1]], dst_state=[[2]])
    assert p.writes_by_component() == {0: 1}


# ---- SLOT (mamba) ----------------------------------------------------------------------------------


def test_mamba_equal_tp_one_write_per_tensor() -> None:
    m = comp("m", "mamba", 32, 48, 32, 48)
    rows = plan(schema(m), schema(m), src_state=[[2]], dst_state=[[5]]).rows()
    assert [r[1:] for r in rows] == [
        (64, 4, 160, 32, 0),
        (96, 5, 240, 48, 0),
        (64, 6, 160, 32, 0),
        (96, 7, 240, 48, 0),
    ]


@pytest.mark.parametrize(
    ("src_tp", "src_rank", "dst_tp", "dst_rank"), [(1, 0, 2, 1), (2, 1, 1, 0), (2, 0, 4, 1), (4, 3, 2, 1)]
)
def test_mamba_tp_mismatch_uses_slice_blocks(src_tp: int, src_rank: int, dst_tp: int, dst_rank: int) -> None:
    def m(tp: int) -> Component:
        return comp("m", "mamba", 64 * 4 // tp, dims=(16 // tp,))

    local, peer = schema(m(src_tp), tp=src_tp, rank=src_rank), schema(m(dst_tp), tp=dst_tp, rank=dst_rank)
    rows = plan(local, peer, src_state=[[1]], dst_state=[[2]]).rows()
    blocks = slice_byte_blocks(
        src_item_len=256 // src_tp,
        dst_item_len=256 // dst_tp,
        src_dim=16 // src_tp,
        dst_dim=16 // dst_tp,
        outer_count=1,
        src_tp=src_tp,
        dst_tp=dst_tp,
        dst_rank=dst_rank,
        local_rank=src_rank,
    )
    assert [(r[1], r[3], r[4]) for r in rows] == [
        (256 // src_tp + s, 2 * 256 // dst_tp + d, n) for s, d, n in blocks
    ]


def test_mamba_replicated_tensor_written_by_elected_rank_only() -> None:
    def m(tp: int) -> Component:
        return comp("m", "mamba", 64 // tp, 24, dims=(16 // tp, 0))

    peer = schema(m(1))
    writer = plan(schema(m(2), tp=2, rank=0), peer, src_state=[[1]], dst_state=[[1]])
    other = plan(schema(m(2), tp=2, rank=1), peer, src_state=[[1]], dst_state=[[1]])
    assert writer.writes_by_component() == {0: 2} and other.writes_by_component() == {0: 1}
    assert writer.size.tolist() == [32, 24] and other.size.tolist() == [32]


# ---- PAGED and POSITIONAL ----------------------------------------------------------------------------


def test_swa_runs_are_coalesced() -> None:
    w = comp("w", "swa", 16, 16)
    rows = plan(schema(w), schema(w), src_state=[[1, 2, 3, 6]], dst_state=[[0, 1, 2, 3]]).rows()
    assert [r[1:] for r in rows] == [
        (16, 4, 0, 48, 0),
        (96, 4, 48, 16, 0),
        (16, 5, 0, 48, 0),
        (96, 5, 48, 16, 0),
    ]


def test_dsa_with_mla_and_tp_mismatch_is_allowed() -> None:
    d = comp("d", "dsa", 16)
    p = plan(
        schema(d, kv_item=64, layout="mla", layers=(0,)),
        schema(d, tp=2, kv_item=64, layout="mla", layers=(0,)),
        src_state=[[1, 2]],
        dst_state=[[3, 4]],
    )
    assert p.bytes_by_component() == {0: 32}


def test_positional_equal_lengths() -> None:
    r = comp("r", "swa_ring", 8)
    p = plan(schema(r), schema(r), src_state=[[0, 1, 2]], dst_state=[[5, 6, 7]])
    assert p.rows() == [(4, 0, 4, 40, 24, 0)]


# ---- bad inputs -------------------------------------------------------------------------------------

MAMBA, SWA, RING = comp("m", "mamba", 32), comp("w", "swa", 16), comp("r", "swa_ring", 8)
BAD = {
    "kv-src-negative": (
        schema(),
        schema(),
        {"kv": ([-1], [0])},
        r"kv: prefill index -1 at position 0 .*< 32\)",
    ),
    "kv-dst-too-large": (
        schema(),
        schema(pages=4),
        {"kv": ([0, 1], [3, 4])},
        r"kv: decode index 4 at position 1 .*< 4\)",
    ),
    "kv-drift-2": (schema(), schema(), {"kv": ([1, 2, 3], [1])}, "3 pages on prefill but 1 on decode"),
    "kv-item-len": (
        schema(),
        schema(kv_item=32),
        {"kv": ([1], [1])},
        r"kv buffer 0 \(layer 0\): item length 64 bytes on prefill but 32 on decode \(equal TP 1\)",
    ),
    "kv-missing-layer": (schema(layers=(0, 1)), schema(layers=(0, 2)), {}, "no .*buffer for layer 1"),
    "kv-gqa-replicated": (
        schema(layers=(0,)),
        schema(tp=2, kv_item=64, layers=(0,)),
        {},
        "split dimension totals differ",
    ),
    "component-count": (
        schema(MAMBA),
        schema(),
        {},
        r"component count mismatch: prefill declares 1 \(mamba\), decode registered 0",
    ),
    "mamba-two-slots": (
        schema(MAMBA),
        schema(MAMBA),
        {"src_state": [[1, 2]], "dst_state": [[3, 4]]},
        "exactly one index",
    ),
    "mamba-slot-range": (
        schema(MAMBA),
        schema(MAMBA),
        {"src_state": [[8]], "dst_state": [[0]]},
        r"m: prefill index 8 at position 0 .*< 8\)",
    ),
    "mamba-item-len": (
        schema(MAMBA),
        schema(comp("m", "mamba", 16)),
        {},
        r"component 0 'm' \(mamba\) tensor 0 \(layer 0\): item length 32",
    ),
    "mamba-not-target": (
        schema(comp("m", "mamba", 16, dims=(4,)), tp=2),
        schema(comp("m", "mamba", 8, dims=(2,)), tp=4, rank=2),
        {},
        None,
    ),
    "swa-drift-2": (
        schema(SWA),
        schema(SWA),
        {"src_state": [[1, 2, 3]], "dst_state": [[1]]},
        "more than 1 apart",
    ),
    "swa-tp-mha": (schema(SWA), schema(SWA, tp=2), {}, "cannot move between different TP sizes"),
    "ring-drift-1": (
        schema(RING),
        schema(RING),
        {"src_state": [[1, 2]], "dst_state": [[1]]},
        "positional state needs equal lengths",
    ),
    "too-many-state-lists": (
        schema(),
        schema(),
        {"src_state": [[1]], "dst_state": [[1]]},
        "state indices for 1 components; the schema has 0",
    ),
    "aux-one-side": (schema(), schema(), {"src_aux": 1}, "aux: index given on one side only"),
    "aux-range": (schema(), schema(), {"src_aux": 4, "dst_aux": 0}, r"aux: prefill index 4 .*< 4\)"),
    "state-type-differs": (
        schema(SWA),
        PeerLayout(
            1,
            0,
            (PeerRegion(64, 32),) * 2,
            (0, 0),
            (PeerRegion(16, 4), PeerRegion(8, 4)),
            (PeerComponent((PeerRegion(16, 8),), state_type="dsa"),),
        ),
        {},
        "decode declares state type 'dsa'",
    ),
}


@pytest.mark.parametrize(("local", "peer", "req", "match"), BAD.values(), ids=BAD.keys())
def test_bad_input_raises_plan_error(
    local: RoleSchema, peer: RoleSchema | PeerLayout, req: dict, match: str | None
) -> None:
    if local.components and "src_state" not in req:
        req = {**req, "src_state": [[0]], "dst_state": [[0]]}
    with pytest.raises(PlanError, match=match or "is not a target of prefill rank 0"):
        plan(local, peer, **req)


@pytest.mark.parametrize(
    ("values", "match"),
    [([2**31], "does not fit in int32"), ([1.5], "must be integers")],
    ids=["int32-overflow", "float"],
)
def test_request_indices_reject(values: list, match: str) -> None:
    with pytest.raises(PlanError, match=match):
        RequestIndices.of(values, [0])


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ({"kv_region_sizes": [100]}, "size 100 is not a multiple of item_len 64"),
        ({"state_item_lens": [[8, 8]]}, "component 0: 1 buffers but 2 item lens"),
        ({"state_region_sizes": [[64], [64]]}, "registered 2 state components but 1 item-len lists"),
        ({"kv_layer_ids": [0, 1, 2]}, "kv_layer_ids has 3 entries for 1 KV buffers"),
    ],
    ids=["kv-size", "state-lens", "state-count", "kv-layer-ids"],
)
def test_peer_layout_from_registration_rejects(args: dict, match: str) -> None:
    base: dict[str, Any] = dict(
        tp_size=1,
        tp_rank=0,
        kv_item_len=64,
        kv_region_sizes=[640],
        kv_layer_ids=[0],
        aux_item_lens=[8],
        aux_region_sizes=[32],
        state_item_lens=[[8]],
        state_region_sizes=[[64]],
        state_dim_per_tensor=[[2]],
        state_layer_ids=[[0]],
    )
    with pytest.raises(PlanError, match=match):
        PeerLayout.from_registration(**{**base, **args})


def test_peer_layout_from_registration_matches_from_schema() -> None:
    s = profile("qwen3-next").schema(tp_size=2, tp_rank=1, pool_pages=8, layers=8)
    built = PeerLayout.from_registration(
        tp_size=2,
        tp_rank=1,
        kv_item_len=s.kv.item_len,
        kv_region_sizes=[s.kv.item_len * 8] * len(s.kv.layer_ids),
        kv_layer_ids=s.kv.layer_ids,
        aux_item_lens=s.aux.item_lens,
        aux_region_sizes=[n * s.aux.num_items for n in s.aux.item_lens],
        state_item_lens=s.state_item_lens,
        state_region_sizes=[
            [n * c.num_items for n in lens] for c, lens in zip(s.components, s.state_item_lens, strict=True)
        ],
        state_dim_per_tensor=s.state_dim_per_tensor,
        state_layer_ids=s.state_layer_ids,
        state_types=s.state_types,
    )
    assert built == PeerLayout.from_schema(s)


def test_target_ranks() -> None:
    assert list(target_ranks(1, 4, 0)) == [0, 1, 2, 3]
    assert list(target_ranks(2, 4, 1)) == [2, 3]
    assert list(target_ranks(4, 2, 3)) == [1]
    with pytest.raises(PlanError, match="one TP size must divide the other"):
        target_ranks(2, 3, 0)


def test_write_plan_helpers() -> None:
    a = WritePlan.build(0, [0, 64], 1, [0, 64], 64, KV_COMPONENT)
    b = WritePlan.build([2], [8], [2], [8], [8], 0)
    both = WritePlan.concat([a, WritePlan.empty(), b])
    assert len(both) == 3 and both.total_bytes == 136
    assert both.bytes_by_component() == {KV_COMPONENT: 128, 0: 8}
    assert both.writes_by_component() == {KV_COMPONENT: 2, 0: 1}
    assert WritePlan.concat([]).total_bytes == 0
    with pytest.raises(ValueError, match="local_offset must be a 1-D int64"):
        WritePlan(*(np.zeros(1, np.int32) for _ in range(6))).check()  # type: ignore[arg-type]
