"""A room's write plan as engine requests, and each request's share of every component.

A compact plan's strided rows (``WritePlan.repeat``) travel as they are: a share counts their writes.

A room of at most ``ONE_REQUEST_ROWS`` writes goes as one request: the engine's fixed cost per request
(NIXL on the 2-vCPU VM: three one-row requests 122-142 µs, one three-row request 54-63 µs; 103 rows:
344 µs as three, 273 µs as one) outweighs the rows; its components then share one latency. Larger
rooms go as one request per component: each component's offsets share a large block size (KV pages:
20 to 256 KiB, mamba: 1 KiB) that the NIXL adapter's prepared lists index, while the room as a whole
only shares the smallest (64 B aux).
"""

from __future__ import annotations

import numpy as np

from ..planner import WritePlan
from ..room import Part
from ..transports import Writes

ONE_REQUEST_ROWS = 128


def writes_by_component(plan: WritePlan) -> list[tuple[int, Writes]]:
    """The plan cut into one ``Writes`` per component. The planner emits each component's rows as one
    contiguous run, so the cut is slices (views) instead of a boolean mask per component; any other
    order is grouped with a stable sort first."""
    comp = plan.component
    if len(comp) == 0:
        return []
    edges = [0, *(np.flatnonzero(comp[1:] != comp[:-1]) + 1).tolist()]
    ids = comp[edges].tolist()
    if len(set(ids)) != len(ids):
        return writes_by_component(plan.select(np.argsort(comp, kind="stable")))  # type: ignore[arg-type]
    edges.append(len(comp))
    lr, lo, rr, ro, size, rep = (
        plan.local_region, plan.local_offset, plan.remote_region, plan.remote_offset, plan.size, plan.repeat
    )
    return [
        (c, Writes(lr[a:b], lo[a:b], rr[a:b], ro[a:b], size[a:b], None if rep is None else rep[:, a:b]))
        for c, a, b in zip(ids, edges, edges[1:], strict=False)
    ]


def transfer_requests(
    plan: WritePlan, one_request_rows: int = ONE_REQUEST_ROWS
) -> list[tuple[list[Part], Writes]]:
    """The plan as engine requests, each with its share of every component: one request for a room
    of at most ``one_request_rows`` writes, else one per component (``writes_by_component``). An
    engine without a per-descriptor cost (``Transport.one_request_rows``) takes any room as one."""
    n = len(plan.component)
    if n > one_request_rows or n == 0:
        return [([Part(comp, w.nbytes, w.count)], w) for comp, w in writes_by_component(plan)]
    shares: dict[int, list[int]] = {}
    counts = [1] * n if plan.repeat is None else plan.repeat[0].tolist()
    for comp, size, count in zip(plan.component.tolist(), plan.size.tolist(), counts, strict=True):
        share = shares.setdefault(comp, [0, 0])
        share[0] += size * count
        share[1] += count
    writes = Writes(
        plan.local_region, plan.local_offset, plan.remote_region, plan.remote_offset, plan.size, plan.repeat
    )
    return [([Part(comp, nbytes, count) for comp, (nbytes, count) in shares.items()], writes)]


__all__ = ["ONE_REQUEST_ROWS", "Part", "transfer_requests", "writes_by_component"]
