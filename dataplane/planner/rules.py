"""The send rules as one table: ``SendRule`` → planning function. A new state type is one registry
entry in ``dataplane.schema.registry``; a new *rule* is one function here plus one ``RULES`` entry.

Each function takes a prepared ``TensorGroup`` and the paired index arrays of one request and returns
its writes: whole-item groups coalesce contiguous runs into one write per run per tensor; sliced groups
(TP mismatch) write each block of each item.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from ..errors import PlanError
from ..schema import SendRule
from .pairing import TensorGroup
from .plan import WritePlan
from .runs import contiguous_runs

__all__ = ["RULES", "check_indices", "plan_group"]

log = logging.getLogger(__name__)
Indices = npt.NDArray[np.int32]
Rule = Callable[[TensorGroup, Indices, Indices], WritePlan]


def check_indices(idx: Indices, limit: int, what: str) -> None:
    """Every index must address an existing item: ``0 <= idx < limit``."""
    if idx.size == 1:
        if 0 <= int(idx[0]) < limit:
            return
    elif idx.size == 0 or (int(idx.min()) >= 0 and int(idx.max()) < limit):
        return
    pos = int(np.argmax((idx < 0) | (idx >= limit)))
    raise PlanError(
        f"{what} index {int(idx[pos])} at position {pos} is outside the region (0 <= index < {limit})"
    )


def _expand(group: TensorGroup, src: Indices, dst: Indices) -> WritePlan:
    check_indices(src, group.local_limit, f"{group.name}: prefill")
    check_indices(dst, group.remote_limit, f"{group.name}: decode")
    if group.whole and src.size == 1:
        return WritePlan.trusted(
            group.local_region.copy(),
            group.local_item * int(src[0]),
            group.remote_region.copy(),
            group.remote_item * int(dst[0]),
            group.local_item.copy(),
            np.full(len(group), group.component, dtype=np.int16),
        )
    if group.whole:
        s_start, d_start, length = contiguous_runs(src, dst)
        n = len(length)
        return WritePlan.trusted(
            np.repeat(group.local_region, n),
            (group.local_item[:, None] * s_start).ravel(),
            np.repeat(group.remote_region, n),
            (group.remote_item[:, None] * d_start).ravel(),
            (group.local_item[:, None] * length).ravel(),
            np.full(n * len(group), group.component, dtype=np.int16),
        )
    t, pages = group.block_tensor, src.size
    s, d = src.astype(np.int64), dst.astype(np.int64)
    return WritePlan.trusted(
        np.repeat(group.block_local_region, pages),
        (group.block_local_item[:, None] * s + group.block_src[:, None]).ravel(),
        np.repeat(group.block_remote_region, pages),
        (group.block_remote_item[:, None] * d + group.block_dst[:, None]).ravel(),
        np.repeat(group.block_size, pages),
        np.full(len(t) * pages, group.component, dtype=np.int16),
    )


def _slot(group: TensorGroup, src: Indices, dst: Indices) -> WritePlan:
    """One item per request on each side (mamba slot, aux slot)."""
    if src.size != 1 or dst.size != 1:
        raise PlanError(
            f"{group.name}: a {group.rule.value} component needs exactly one index on each side, "
            f"got {src.size} on prefill and {dst.size} on decode"
        )
    return _expand(group, src, dst)


def _paged(group: TensorGroup, src: Indices, dst: Indices) -> WritePlan:
    """Pages paired by position; a one-page drift (an allocation rounding) is truncated."""
    drift = abs(src.size - dst.size)
    if drift > 1:
        raise PlanError(
            f"{group.name}: {src.size} pages on prefill but {dst.size} on decode (more than 1 apart)"
        )
    if drift:
        n = min(src.size, dst.size)
        log.warning(
            "%s: %d pages on prefill, %d on decode; sending the first %d", group.name, src.size, dst.size, n
        )
        src, dst = src[:n], dst[:n]
    return _expand(group, src, dst)


def _positional(group: TensorGroup, src: Indices, dst: Indices) -> WritePlan:
    """Items paired by position (ring buffers, compressed blocks): any length mismatch misaligns rows."""
    if src.size != dst.size:
        raise PlanError(
            f"{group.name}: {src.size} items on prefill but {dst.size} on decode; "
            "positional state needs equal lengths"
        )
    return _expand(group, src, dst)


RULES: dict[SendRule, Rule] = {
    SendRule.SLOT: _slot,
    SendRule.PAGED: _paged,
    SendRule.POSITIONAL: _positional,
}


def plan_group(group: TensorGroup, src: Indices, dst: Indices) -> WritePlan:
    """Plan one group by its rule; a group with no paired tensors plans nothing."""
    if not len(group):
        return WritePlan.empty()
    return RULES[group.rule](group, src, dst)
