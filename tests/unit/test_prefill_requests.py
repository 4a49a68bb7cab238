"""How prefill turns a room's plan into engine requests: one for a small room, one per component for a
large one, each request carrying every component's exact share of bytes and writes."""

from __future__ import annotations

import numpy as np

from dataplane.agent.requests import ONE_REQUEST_ROWS, transfer_requests
from dataplane.planner import WritePlan
from dataplane.schema import AUX_COMPONENT, KV_COMPONENT


def plan_of(rows: list[tuple[int, int]]) -> WritePlan:
    """A plan of ``(component, size)`` rows, components in planner order (contiguous runs)."""
    comp = np.array([c for c, _ in rows], np.int16)
    size = np.array([s for _, s in rows], np.int64)
    offsets = np.cumsum(size) - size
    region = np.zeros(len(rows), np.int32)
    return WritePlan.build(region, offsets, region, offsets, size, comp)


def shares(requests) -> dict[int, tuple[int, int]]:
    out: dict[int, list[int]] = {}
    for parts, writes in requests:
        assert sum(n for _, n, _ in parts) == writes.nbytes and sum(k for *_, k in parts) == writes.count
        for comp, nbytes, count in parts:
            got = out.setdefault(comp, [0, 0])
            got[0] += nbytes
            got[1] += count
    return {c: (b, k) for c, (b, k) in out.items()}


def test_a_small_room_is_one_request_with_every_components_share():
    plan = plan_of([(KV_COMPONENT, 4096), (KV_COMPONENT, 8192), (AUX_COMPONENT, 64), (0, 1024)])
    requests = transfer_requests(plan)
    assert len(requests) == 1 and len(requests[0][1]) == 4
    assert shares(requests) == {KV_COMPONENT: (12288, 2), AUX_COMPONENT: (64, 1), 0: (1024, 1)}


def test_a_large_room_is_one_request_per_component():
    rows = [(KV_COMPONENT, 4096)] * ONE_REQUEST_ROWS + [(AUX_COMPONENT, 64), (0, 1024), (0, 1024)]
    requests = transfer_requests(plan_of(rows))
    assert [[c for c, *_ in parts] for parts, _ in requests] == [[KV_COMPONENT], [AUX_COMPONENT], [0]]
    assert shares(requests) == {
        KV_COMPONENT: (4096 * ONE_REQUEST_ROWS, ONE_REQUEST_ROWS), AUX_COMPONENT: (64, 1), 0: (2048, 2),
    }


def test_an_empty_plan_has_no_requests():
    assert transfer_requests(plan_of([])) == []


def test_a_compact_plans_strided_rows_travel_as_they_are_and_count_their_writes():
    """A TP-sliced plan (``WritePlan.repeat``): each request carries its rows' repeat, and the shares
    count every write a row stands for, small room or large."""
    plan = plan_of([(KV_COMPONENT, 512), (KV_COMPONENT, 512), (AUX_COMPONENT, 64), (0, 1024)])
    rep = np.array([[64, 128, 1, 3], [1024, 1024, 0, 2048], [512, 512, 0, 1024]], np.int64)
    plan = WritePlan.trusted(plan.local_region, plan.local_offset, plan.remote_region, plan.remote_offset,
                             plan.size, plan.component, rep)
    want = {KV_COMPONENT: (512 * 192, 192), AUX_COMPONENT: (64, 1), 0: (3 * 1024, 3)}
    for rows in (ONE_REQUEST_ROWS, 1):
        requests = transfer_requests(plan, rows)
        assert len(requests) == (1 if rows == ONE_REQUEST_ROWS else 3)
        assert shares(requests) == want
        assert all(w.repeat is not None for _, w in requests)
        assert np.array_equal(np.concatenate([w.repeat for _, w in requests], axis=1), rep)
