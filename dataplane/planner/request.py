"""``plan_request``: one request's KV, aux and state components → one ``WritePlan``.

Request-independent work (pairing buffers by layer, item-length and TP checks, slice blocks) is done
once per (local schema, peer layout) and cached by identity; ``pairing_for`` exposes it so the agent
can hold one per peer. Writes stay inside both sides' registered regions by construction: ``Pairing``
checks every block against its item once, and each request's indices are checked against the item
counts (see ``TensorGroup``). The common request shape takes a one-pass path (``shape.CommonShape``)
with the same checks; everything else, errors included, goes through ``plan_parts``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from ..errors import PlanError
from ..schema import RoleSchema, SendRule
from .assemble import Builder
from .layout import PeerLayout, RequestIndices
from .pairing import Pairing, TensorGroup
from .plan import WritePlan
from .rules import checked, checked_runs

__all__ = ["pairing_for", "plan_parts", "plan_request"]

_CACHE: dict[tuple[int, int], Pairing] = {}
_CACHE_LIMIT = 64


def pairing_for(local: RoleSchema, peer: PeerLayout) -> Pairing:
    """The prepared ``Pairing`` for this (schema, layout) pair, built on first use."""
    key = (id(local), id(peer))
    found = _CACHE.get(key)
    if found is None or found.local is not local or found.peer is not peer:
        if len(_CACHE) >= _CACHE_LIMIT:
            _CACHE.clear()
        found = _CACHE[key] = Pairing.build(local, peer)
    return found


def plan_request(
    local: RoleSchema, peer: PeerLayout, req: RequestIndices, *, pairing: Pairing | None = None
) -> WritePlan:
    """Every write that moves this request's state from this (prefill) rank to ``peer``.

    Components with no index on either side are skipped (as sglang does); an all-empty request gives
    an empty plan, which the caller completes at once. A request of the pairing's common shape is
    planned in one pass (``CommonShape``); anything else, and any error, by ``plan_parts``.
    """
    pr = pairing or pairing_for(local, peer)
    if pr.common is not None:
        plan = pr.common.plan(req)
        if plan is not None:
            return plan
    return plan_parts(pr, req)


def plan_parts(pr: Pairing, req: RequestIndices) -> WritePlan:
    """The general path: each part checked by its rule, then every row written by ``Builder``."""
    out = Builder(pr.tables)
    if (req.src_kv.size or req.dst_kv.size) and len(pr.kv):
        _add(out, 0, pr.kv, req.src_kv, req.dst_kv)
    if (req.src_aux is None) != (req.dst_aux is None):
        raise PlanError(f"aux: index given on one side only (prefill {req.src_aux}, decode {req.dst_aux})")
    if req.src_aux is not None and req.dst_aux is not None and len(pr.aux):
        out.single(1, *_aux(pr.aux, req.src_aux, req.dst_aux))
    src_state, dst_state = _states(req.src_state, pr, "prefill"), _states(req.dst_state, pr, "decode")
    for ci, (group, src, dst) in enumerate(zip(pr.components, src_state, dst_state, strict=True)):
        if src is not None and dst is not None and src.size and dst.size and len(group):
            _add(out, 2 + ci, group, src, dst)
    return out.plan()


def _add(
    out: Builder, gi: int, group: TensorGroup, src: npt.NDArray[np.int32], dst: npt.NDArray[np.int32]
) -> None:
    """Whole-item and strided groups with several indices go through ``checked_runs`` (one pass for
    the range check and the runs); everything else through ``checked``."""
    if (group.whole or group.table.strided) and src.size > 1 and dst.size > 1:
        out.runs(gi, *checked_runs(group, src, dst))
    else:
        out.add(gi, *checked(group, src, dst))


def _aux(group: TensorGroup, src: int, dst: int) -> tuple[int, int]:
    """The aux slot as plain ints: in-range slot indices (the common case) need no arrays; anything
    else goes through ``checked``, for the rule's own check and the specific error."""
    if (
        group.rule is SendRule.SLOT
        and type(src) is int
        and type(dst) is int
        and 0 <= src < group.local_limit
        and 0 <= dst < group.remote_limit
    ):
        return src, dst
    s, d = checked(group, _one(src), _one(dst))
    return int(s[0]), int(d[0])


def _one(index: int) -> npt.NDArray[np.int32]:
    if not -(2**31) <= index < 2**31:
        raise PlanError(f"aux index {index} does not fit in int32")
    return np.array([index], dtype=np.int32)


def _states(
    entries: Sequence[npt.NDArray[np.int32] | None] | None, pr: Pairing, side: str
) -> list[npt.NDArray[np.int32] | None]:
    n = len(pr.components)
    entries = entries or []
    if len(entries) > n:
        raise PlanError(f"{side} sent state indices for {len(entries)} components; the schema has {n}")
    return [*entries, *([None] * (n - len(entries)))]
