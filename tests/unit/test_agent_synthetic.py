"""The synthetic engine: deterministic fill, exact verification, TP-split rows agree across TP sizes."""

import numpy as np
import pytest

from dataplane import planner
from dataplane.agent import IndexAllocator, MemoryPools, SyntheticEngine, items_for_tokens
from dataplane.schema.profiles import profile


def _schema(name="qwen3-next", tp=1, rank=0):
    return profile(name).schema(tp_size=tp, tp_rank=rank, pool_pages=64, max_requests=8, layers=8)


def _idx(counts):
    kv = np.arange(counts.kv, dtype=np.int32)
    return kv, (0 if counts.aux else None), [np.arange(n, dtype=np.int32) for n in counts.state]


def test_fill_then_verify_every_component():
    pools = MemoryPools.allocate(_schema())
    eng = SyntheticEngine(pools)
    kv, aux, st = _idx(items_for_tokens(pools.schema, 1000))
    eng.fill(42, kv, aux, st)
    checks = eng.verify(42, kv, aux, st)
    assert {c.component for c in checks} == {"kv", "aux", "mamba"}
    assert all(c.ok and c.checksum == c.expected_checksum for c in checks)
    assert not any(c.ok for c in eng.verify(43, kv, aux, st))


def test_one_flipped_byte_fails_only_its_component():
    pools = MemoryPools.allocate(_schema())
    eng = SyntheticEngine(pools)
    kv, aux, st = _idx(items_for_tokens(pools.schema, 300))
    eng.fill(7, kv, aux, st)
    mamba_region = pools.schema.region_base(0)
    pools.buffers[mamba_region][3] ^= 0xFF
    bad = {c.component: c.ok for c in eng.verify(7, kv, aux, st)}
    assert bad == {"kv": True, "aux": True, "mamba": False}


def test_content_independent_of_physical_slot():
    pools = MemoryPools.allocate(_schema())
    eng = SyntheticEngine(pools)
    kv_a = np.array([3, 4], dtype=np.int32)
    eng.fill(9, kv_a, None, [None])
    got = pools.read_items(0, kv_a)
    assert np.array_equal(got, eng.expected(9, 0, 2))


def test_all_empty_request():
    counts = items_for_tokens(_schema(), 0)
    assert counts.empty


@pytest.mark.parametrize(("ptp", "dtp"), [(1, 2), (2, 1)])
def test_tp_mismatched_mamba_slices_verify(ptp, dtp):
    """Apply the planner's writes with memcpy between in-process pools: decode verifies exactly."""
    src = [MemoryPools.allocate(_schema(tp=ptp, rank=r)) for r in range(ptp)]
    dst = [MemoryPools.allocate(_schema(tp=dtp, rank=r)) for r in range(dtp)]
    counts = items_for_tokens(dst[0].schema, 500)
    kv, aux, st = _idx(counts)
    for pools in src:
        SyntheticEngine(pools).fill(11, kv, aux, st)
    for d in dst:
        layout = planner.PeerLayout.from_schema(d.schema)
        for s in src:
            if d.schema.tp_rank not in planner.target_ranks(ptp, dtp, s.schema.tp_rank):
                continue
            req = planner.RequestIndices(kv, kv, aux, aux, st, st)
            plan = planner.plan_request(s.schema, layout, req)
            for lr, lo, rr, ro, n, _ in plan.rows():
                d.buffers[rr][ro : ro + n] = s.buffers[lr][lo : lo + n]
        checks = SyntheticEngine(d).verify(11, kv, aux, st)
        assert checks and all(c.ok for c in checks), [(c.component, c.ok) for c in checks]


def test_allocator_take_give():
    a = IndexAllocator("kv", 4)
    first = a.take(3)
    assert first.tolist() == [0, 1, 2] and a.take(2) is None
    a.give(first)
    assert a.available == 4
