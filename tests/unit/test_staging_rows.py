"""Plan byte ranges → rows of a chunked arena: the rows cover exactly the planned bytes, page by page,
for real model plans; splitting into slots keeps order; peer runs outside a region are refused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataplane.errors import PlanError
from dataplane.planner import PeerLayout, RequestIndices, plan_request
from dataplane.schema.profiles import profile
from dataplane.staging import Runs, expand, pick_chunk, region_rows, runs_of, split


def byte_ranges(region: np.ndarray, offset: np.ndarray, size: np.ndarray, bases: np.ndarray) -> np.ndarray:
    """Every byte the writes cover, as arena byte addresses, in plan order (the per-page reference)."""
    at = bases[region] + offset
    return np.concatenate([np.arange(a, a + n) for a, n in zip(at, size, strict=True)])


@pytest.mark.parametrize("model", ["qwen3-next", "deepseek-v3.2", "gpt-oss"])
def test_rows_equal_the_per_page_plan(model: str) -> None:
    schema = profile(model).schema(pool_pages=16, max_requests=4, layers=4)
    rng = np.random.default_rng(1)
    src, dst = rng.permutation(16)[:5], rng.permutation(16)[:5]
    states = [src if c.info.rule.name != "SLOT" else [1] for c in schema.components]
    dstates = [dst if c.info.rule.name != "SLOT" else [2] for c in schema.components]
    req = RequestIndices.of(src, dst, 0, 1, states, dstates)
    plan = plan_request(schema, PeerLayout.from_schema(schema), req)
    sizes = np.array([r.size for r in schema.regions()], dtype=np.int64)
    bases = np.cumsum(sizes) - sizes
    for comp in np.unique(plan.component):
        p = plan.select(plan.component == comp)
        chunk = pick_chunk(bases[p.local_region] + p.local_offset, p.remote_offset, p.size)
        runs = runs_of(p.local_region, p.local_offset, p.size, chunk)
        rows = expand(runs, *region_rows(bases, sizes, chunk))
        got = (rows[:, None] * chunk + np.arange(chunk)).ravel()
        assert np.array_equal(got, byte_ranges(p.local_region, p.local_offset, p.size, bases))


def test_pick_chunk_is_the_largest_power_of_two_dividing_all_capped() -> None:
    assert pick_chunk([0, 8192, 73728], [73728]) == 8192
    assert pick_chunk([4 << 20], [8 << 20]) == 1 << 20
    assert pick_chunk([4 << 20], [8 << 20], limit=4096) == 4096
    with pytest.raises(PlanError):
        pick_chunk([0], [0])


def test_runs_must_be_whole_rows_and_inside_their_region() -> None:
    with pytest.raises(PlanError, match="whole rows"):
        runs_of([0], [100], [4096], 4096)
    with pytest.raises(PlanError, match="whole rows"):
        runs_of([0], [3 * 768], [768 * 5 + 1], 768)
    with pytest.raises(PlanError, match="non-empty"):
        runs_of([0], [0], [0], 4096)
    base_rows, region_rows_ = np.array([0, 10]), np.array([10, 10])
    with pytest.raises(PlanError, match="outside its region"):
        expand(Runs(np.array([1], np.int32), np.array([8]), np.array([3])), base_rows, region_rows_)
    with pytest.raises(PlanError, match="region outside"):
        expand(Runs(np.array([2], np.int32), np.array([0]), np.array([1])), base_rows, region_rows_)
    bases, counts = region_rows([0, 1000], [1000, 1000], 8)
    assert bases.tolist() == [0, 125] and counts.tolist() == [125, 125]
    bases, counts = region_rows([0, 1000], [1024, 1024], 256)
    assert counts.tolist() == [4, 0]
    with pytest.raises(PlanError, match="row-aligned"):
        expand(Runs(np.array([1], np.int32), np.array([0]), np.array([1])), bases, counts)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=30), st.integers(1, 12))
def test_split_keeps_every_row_in_order_within_slot_size(counts: list[int], per: int) -> None:
    n = np.array(counts, dtype=np.int64)
    runs = Runs(np.zeros(len(n), np.int32), np.cumsum(n) - n + 5, n)
    pieces = split(runs, per)
    whole = expand(runs, np.array([0]), np.array([10_000]))
    parts = [expand(p, np.array([0]), np.array([10_000])) for p in pieces]
    assert all(0 < len(p) <= per for p in parts)
    assert all(len(p) == per for p in parts[:-1])
    assert np.array_equal(np.concatenate(parts), whole)
