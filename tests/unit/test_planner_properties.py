"""Properties of the planner: writes stay inside both regions, coalescing moves exactly the bytes of a
naive per-page plan, and TP-sliced mamba state reassembles the decode rank's shard byte for byte."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dataplane.planner import PeerLayout, RequestIndices, WritePlan, plan_request, target_ranks
from dataplane.schema import AuxSpec, Component, KVSpec, RoleSchema, TensorSpec

PAGES, SLOTS = 24, 6


def _schema(kv_layers: int, swa: int, ring: int, tp: int = 1, rank: int = 0) -> RoleSchema:
    comps = [
        Component("mamba", "mamba", (TensorSpec(48, 0), TensorSpec(80, 0)), SLOTS),
        Component("swa", "swa", tuple(TensorSpec(swa, i) for i in range(2)), PAGES),
        Component("ring", "swa_ring", (TensorSpec(ring, 0),), PAGES),
    ]
    kv = KVSpec(32, PAGES, tuple(range(kv_layers)) * 2, page_size=4)
    return RoleSchema("p", tp, rank, kv, tuple(comps), AuxSpec((16,), 4))


def _pages(draw: st.DrawFn, n: int) -> tuple[list[int], list[int]]:
    src = draw(st.lists(st.integers(0, PAGES - 1), min_size=n, max_size=n))
    dst = draw(st.lists(st.integers(0, PAGES - 1), min_size=n, max_size=n))
    return src, dst


@st.composite
def requests(draw: st.DrawFn) -> tuple[RoleSchema, RequestIndices]:
    s = _schema(draw(st.integers(1, 3)), draw(st.sampled_from([8, 24])), draw(st.sampled_from([4, 12])))
    kv = _pages(draw, draw(st.integers(0, 12)))
    swa, ring = _pages(draw, draw(st.integers(0, 6))), _pages(draw, draw(st.integers(0, 4)))
    slot = draw(st.sampled_from([None, (1, 2), (SLOTS - 1, 0)]))
    mamba = (None, None) if slot is None else ([slot[0]], [slot[1]])
    aux = draw(st.sampled_from([(None, None), (0, 3)]))
    req = RequestIndices.of(*kv, *aux, [mamba[0], swa[0], ring[0]], [mamba[1], swa[1], ring[1]])
    return s, req


def _naive(s: RoleSchema, req: RequestIndices) -> list[tuple[int, int, int, int, int]]:
    """One copy per item per buffer, straight from the rules' definitions (no grouping)."""
    out = []
    for r in s.regions():
        if r.component == -1:
            pairs = zip(req.src_kv.tolist(), req.dst_kv.tolist(), strict=True)
        elif r.component == -2:
            pairs = zip([req.src_aux] if req.src_aux is not None else [], [req.dst_aux], strict=False)
        else:
            src, dst = req.src_state[r.component], req.dst_state[r.component]  # type: ignore[index]
            pairs = zip([] if src is None else src.tolist(), [] if dst is None else dst.tolist(), strict=True)
        base = s.region_base(r.component) + r.tensor
        out += [(base, a * r.item_len, base, b * r.item_len, r.item_len) for a, b in pairs]
    return sorted(out)


def _per_item(plan: WritePlan, s: RoleSchema) -> list[tuple[int, int, int, int, int]]:
    lens = [r.item_len for r in s.regions()]
    out = []
    for lr, lo, rr, ro, size, _ in plan.rows():
        n = lens[lr]
        assert size % n == 0
        out += [(lr, lo + k * n, rr, ro + k * n, n) for k in range(size // n)]
    return sorted(out)


@settings(max_examples=150, deadline=None)
@given(requests())
def test_coalesced_plan_equals_naive_per_page_plan(case: tuple[RoleSchema, RequestIndices]) -> None:
    s, req = case
    plan = plan_request(s, PeerLayout.from_schema(s), req)
    assert _per_item(plan, s) == _naive(s, req)
    assert plan.total_bytes == sum(w[4] for w in _naive(s, req))


@settings(max_examples=150, deadline=None)
@given(requests())
def test_every_write_lies_inside_both_regions(case: tuple[RoleSchema, RequestIndices]) -> None:
    s, req = case
    plan = plan_request(s, PeerLayout.from_schema(s), req)
    sizes = np.array([r.size for r in s.regions()])
    for region, offset in ((plan.local_region, plan.local_offset), (plan.remote_region, plan.remote_offset)):
        assert (offset >= 0).all() and (plan.size > 0).all()
        assert (offset + plan.size <= sizes[region]).all()


def _conv_schema(groups: tuple[int, ...], heads: int, row: int, tp: int, rank: int) -> RoleSchema:
    rows = sum(groups) // tp
    tensors = (
        TensorSpec(rows * row, 0, tp_dim=rows, conv_shard_groups=groups),
        TensorSpec(heads // tp * row, 0, tp_dim=heads // tp),
        TensorSpec(row * 2, 0, tp_dim=0),
    )
    kv = KVSpec(8, 2, (0,), page_size=1, layout="mla")
    return RoleSchema("m", tp, rank, kv, (Component("mamba", "mamba", tensors, 3),), AuxSpec((8,), 2))


def _shard(full: np.ndarray, groups: tuple[int, ...], tp: int, rank: int) -> np.ndarray:
    """Rank ``rank``'s rows: each sub-block split by TP on its own, the shares concatenated."""
    parts, start = [], 0
    for g in groups:
        parts.append(full[start + rank * g // tp : start + (rank + 1) * g // tp])
        start += g
    return np.concatenate(parts)


@settings(max_examples=60, deadline=None)
@given(
    tps=st.sampled_from([(1, 2), (2, 1), (1, 4), (4, 1), (2, 4), (4, 2), (2, 2)]),
    groups=st.sampled_from([(4, 4, 8), (8, 8, 16), (4, 12)]),
    row=st.sampled_from([2, 6]),
    slots=st.tuples(st.integers(0, 2), st.integers(0, 2)),
)
def test_sliced_mamba_reassembles_decode_shards(
    tps: tuple[int, int], groups: tuple[int, ...], row: int, slots: tuple[int, int]
) -> None:
    src_tp, dst_tp, heads = *tps, 8
    rng = np.random.default_rng(sum(groups) * row)
    full = [rng.integers(0, 255, (sum(groups), row), np.uint8), rng.integers(0, 255, (heads, row), np.uint8)]
    repl = rng.integers(0, 255, 2 * row, np.uint8)
    for d in range(dst_tp):
        peer_schema = _conv_schema(groups, heads, row, dst_tp, d)
        peer = PeerLayout.from_schema(peer_schema)
        remote = [np.zeros(r.size, np.uint8) for r in peer_schema.regions()]
        writers = [r for r in range(src_tp) if d in target_ranks(src_tp, dst_tp, r)]
        for r in writers:
            local_schema = _conv_schema(groups, heads, row, src_tp, r)
            local = [np.zeros(reg.size, np.uint8) for reg in local_schema.regions()]
            base, item = local_schema.region_base(0), slots[0]
            local[base][item * local_schema.components[0].tensors[0].item_len :][
                : sum(groups) // src_tp * row
            ] = _shard(full[0], groups, src_tp, r).ravel()
            t1 = local_schema.components[0].tensors[1].item_len
            local[base + 1][item * t1 : (item + 1) * t1] = _shard(full[1], (heads,), src_tp, r).ravel()
            local[base + 2][item * row * 2 : (item + 1) * row * 2] = repl
            req = RequestIndices.of([], [], src_state=[[slots[0]]], dst_state=[[slots[1]]])
            for lr, lo, rr, ro, size, _ in plan_request(local_schema, peer, req).rows():
                remote[rr][ro : ro + size] = local[lr][lo : lo + size]
        base = peer_schema.region_base(0)
        t0, t1 = (t.item_len for t in peer_schema.components[0].tensors[:2])
        got0 = remote[base][slots[1] * t0 : (slots[1] + 1) * t0]
        got1 = remote[base + 1][slots[1] * t1 : (slots[1] + 1) * t1]
        assert (got0 == _shard(full[0], groups, dst_tp, d).ravel()).all()
        assert (got1 == _shard(full[1], (heads,), dst_tp, d).ravel()).all()
        assert (remote[base + 2][slots[1] * row * 2 : (slots[1] + 1) * row * 2] == repl).all()
