"""Compact (strided) plans of TP-mismatched pairings: expanded, they are exactly the per-block,
per-item writes of the slicing rules (sglang 0.5.23's ``compute_mamba_state_slice_byte_blocks``
semantics, one write per block of every item), and executed row by row at their strides they move the
same bytes."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dataplane.planner import (
    PeerLayout,
    RequestIndices,
    WritePlan,
    pairing_for,
    plan_request,
    slice_byte_blocks,
    target_ranks,
)
from dataplane.schema import AuxSpec, Component, KVSpec, RoleSchema, TensorSpec

HEADS, PAGES, SLOTS = 8, 40, 5
TPS = [(1, 2), (2, 1), (1, 4), (4, 1), (2, 4), (4, 2), (8, 4), (4, 8), (2, 8), (8, 2)]
Row = tuple[int, int, int, int, int]


def _schema(tp: int, rank: int, head: int, page: int, layers: int, outer: int, row: int) -> RoleSchema:
    groups = (8, 8, 16)
    conv = sum(groups) // tp
    mamba = tuple(
        spec
        for i in range(layers)
        for spec in (
            TensorSpec(conv * row, i, tp_dim=conv, conv_shard_groups=groups),
            TensorSpec(outer * HEADS // tp * row, i, tp_dim=HEADS // tp, outer_count=outer),
            TensorSpec(2 * row, i, tp_dim=0),
        )
    )
    kv = KVSpec(page * HEADS // tp * head, PAGES, tuple(range(layers)) * 2, page_size=page)
    return RoleSchema("m", tp, rank, kv, (Component("mamba", "mamba", mamba, SLOTS),), AuxSpec((8,), 4))


def _runs(draw: st.DrawFn, n: int) -> list[int]:
    """``n`` page ids in runs of 1-6 consecutive pages (runs may repeat or overlap: the planner
    pairs positions, it does not require distinct pages)."""
    out: list[int] = []
    while len(out) < n:
        k = min(draw(st.integers(1, 6)), n - len(out))
        start = draw(st.integers(0, PAGES - k))
        out += range(start, start + k)
    return out


@st.composite
def cases(draw: st.DrawFn) -> tuple[RoleSchema, RoleSchema, RequestIndices]:
    src_tp, dst_tp = draw(st.sampled_from(TPS))
    rank = draw(st.integers(0, src_tp - 1))
    dst_rank = draw(st.sampled_from(list(target_ranks(src_tp, dst_tp, rank))))
    geometry = dict(
        head=draw(st.sampled_from([2, 6, 16])),
        page=draw(st.sampled_from([1, 2, 4, 16])),
        layers=draw(st.integers(1, 3)),
        outer=draw(st.sampled_from([1, 3])),
        row=draw(st.sampled_from([2, 4])),
    )
    local, peer = _schema(src_tp, rank, **geometry), _schema(dst_tp, dst_rank, **geometry)
    n = draw(st.integers(0, 24))
    slots = draw(st.sampled_from([None, (0, 4), (3, 1)]))
    state = (None, None) if slots is None else ([slots[0]], [slots[1]])
    req = RequestIndices.of(_runs(draw, n), _runs(draw, n), 1, 2, [state[0]], [state[1]])
    return local, peer, req


def _rule_writes(local: RoleSchema, peer: RoleSchema, req: RequestIndices) -> list[Row]:
    """Every write by the rules' definitions: each block of ``slice_byte_blocks`` for each paired
    index, KV buffers and tensors paired by position (both sides list the same layers)."""
    tp = dict(src_tp=local.tp_size, dst_tp=peer.tp_size, dst_rank=peer.tp_rank, local_rank=local.tp_rank)
    out: list[Row] = []
    kv, pkv = local.kv, peer.kv
    blocks = slice_byte_blocks(
        src_item_len=kv.item_len,
        dst_item_len=pkv.item_len,
        src_dim=kv.item_len // kv.page_size,
        dst_dim=pkv.item_len // kv.page_size,
        outer_count=kv.page_size,
        **tp,
    )
    for i in range(len(kv.layer_ids)):
        for a, b in zip(req.src_kv.tolist(), req.dst_kv.tolist(), strict=True):
            out += [(i, a * kv.item_len + s, i, b * pkv.item_len + d, n) for s, d, n in blocks]
    lbase, rbase = local.region_base(-2), peer.region_base(-2)
    out.append((lbase, 1 * 8, rbase, 2 * 8, 8))
    if req.src_state and req.src_state[0] is not None and req.dst_state:
        a, b = int(req.src_state[0][0]), int(req.dst_state[0][0])  # type: ignore[index]
        lbase, rbase = local.region_base(0), peer.region_base(0)
        for ti, (t, pt) in enumerate(
            zip(local.components[0].tensors, peer.components[0].tensors, strict=True)
        ):
            for s, d, n in slice_byte_blocks(
                src_item_len=t.item_len,
                dst_item_len=pt.item_len,
                src_dim=t.tp_dim,
                dst_dim=pt.tp_dim,
                outer_count=t.outer_count,
                conv_shard_groups=t.conv_shard_groups or None,
                **tp,
            ):
                out.append((lbase + ti, a * t.item_len + s, rbase + ti, b * pt.item_len + d, n))
    return sorted(out)


def _copy_strided(plan: WritePlan, local: list[np.ndarray], remote: list[np.ndarray]) -> None:
    """Each row as its definition reads: ``count`` copies of ``size`` bytes, ``stride`` apart."""
    rep = (
        plan.repeat
        if plan.repeat is not None
        else np.array([[1] * len(plan), [0] * len(plan), [0] * len(plan)])
    )
    for k in range(len(plan)):
        lr, lo, rr, ro, n = (
            int(x[k])
            for x in (plan.local_region, plan.local_offset, plan.remote_region, plan.remote_offset, plan.size)
        )
        for j in range(int(rep[0, k])):
            a, b = lo + j * int(rep[1, k]), ro + j * int(rep[2, k])
            remote[rr][b : b + n] = local[lr][a : a + n]


@settings(max_examples=120, deadline=None)
@given(cases())
def test_compact_plan_expands_to_the_rules_writes(
    case: tuple[RoleSchema, RoleSchema, RequestIndices],
) -> None:
    local, peer, req = case
    plan = plan_request(local, PeerLayout.from_schema(peer), req)
    expanded = plan.expanded()
    assert expanded.repeat is None and len(expanded) == plan.writes
    assert sorted(r[:5] for r in expanded.rows()) == _rule_writes(local, peer, req)
    assert expanded.total_bytes == plan.total_bytes
    assert expanded.bytes_by_component() == plan.bytes_by_component()
    assert expanded.writes_by_component() == plan.writes_by_component()


@settings(max_examples=40, deadline=None)
@given(cases())
def test_compact_rows_move_the_bytes_of_the_expanded_plan(
    case: tuple[RoleSchema, RoleSchema, RequestIndices],
) -> None:
    local, peer, req = case
    plan = plan_request(local, PeerLayout.from_schema(peer), req)
    rng = np.random.default_rng(len(plan))
    src = [rng.integers(0, 256, r.size, dtype=np.uint8) for r in local.regions()]
    compact = [np.zeros(r.size, np.uint8) for r in peer.regions()]
    rows = [np.zeros(r.size, np.uint8) for r in peer.regions()]
    _copy_strided(plan, src, compact)
    for lr, lo, rr, ro, n, _ in plan.rows():
        rows[rr][ro : ro + n] = src[lr][lo : lo + n]
    assert all((a == b).all() for a, b in zip(compact, rows, strict=True))


def test_a_head_slice_of_every_token_of_a_page_run_is_one_row() -> None:
    """TP 1 -> 2 over two runs of pages: one row per KV buffer and run, ``page x run`` writes each."""
    local, peer = _schema(1, 0, 16, 4, 1, 1, 2), _schema(2, 1, 16, 4, 1, 1, 2)
    req = RequestIndices.of([3, 4, 5, 9], [7, 8, 9, 1], 1, 2)
    plan = plan_request(local, PeerLayout.from_schema(peer), req)
    kv = plan.component == -1
    assert plan.repeat is not None
    assert int(kv.sum()) == 2 * 2 and plan.writes == 2 * 16 + 1
    assert plan.repeat[0, kv].tolist() == [12, 4, 12, 4]
    assert plan.repeat[1:, kv].T.tolist() == [[128, 64]] * 4
    assert plan.local_offset[kv].tolist() == [3 * 512 + 64, 9 * 512 + 64] * 2
    assert plan.remote_offset[kv].tolist() == [7 * 256, 1 * 256] * 2


def test_write_plan_checks_its_repeat() -> None:
    plan = WritePlan.build(0, [0, 64], 1, [0, 64], 8, -1)
    with np.testing.assert_raises_regex(ValueError, "repeat must be a"):
        WritePlan(
            *(
                getattr(plan, f)
                for f in (
                    "local_region",
                    "local_offset",
                    "remote_region",
                    "remote_offset",
                    "size",
                    "component",
                )
            ),
            np.zeros((3, 2), np.int64),
        ).check()


def test_a_recurring_mamba_block_beside_whole_mla_pages_writes_every_repetition() -> None:
    """MLA pages move whole between TP sizes, so such a pairing has the one-pass common shape, except
    that a mamba tensor whose slice recurs per outer block (``outer_count``) is strided: the request
    then takes the general path, and every repetition is written."""

    def schema(tp: int, rank: int) -> RoleSchema:
        mamba = (TensorSpec(3 * HEADS // tp * 4, 0, tp_dim=HEADS // tp, outer_count=3),)
        kv = KVSpec(64, PAGES, (0,), page_size=4, layout="mla")
        return RoleSchema("m", tp, rank, kv, (Component("mamba", "mamba", mamba, SLOTS),), AuxSpec((8,), 4))

    local, peer = schema(1, 0), schema(2, 1)
    layout = PeerLayout.from_schema(peer)
    req = RequestIndices.of([1, 2], [3, 4], 1, 2, [[2]], [[1]])
    plan = plan_request(local, layout, req)
    mamba = sorted(r[:5] for r in plan.rows() if r[5] == 0)
    base_l, base_r = local.region_base(0), peer.region_base(0)
    # prefill item 96 bytes (3 x 8 heads x 4), decode 48 (3 x 4 heads x 4): rank 1's heads 4..7 of each block
    assert mamba == [(base_l, 2 * 96 + o * 32 + 16, base_r, 1 * 48 + o * 16, 16) for o in range(3)]
    pairing = pairing_for(local, layout)
    assert pairing.common is None and pairing.components[0].table.strided
