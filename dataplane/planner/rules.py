"""The send rules as one table: ``SendRule`` → check of one request's paired indices. A new state type
is one registry entry in ``dataplane.schema.registry``; a new *rule* is one function here plus one
``CHECKS`` entry.

Each check takes a prepared ``TensorGroup`` and the paired index arrays of one request and returns the
pair to plan (a paged pair with a one-page drift comes back truncated); ``checked`` then requires every
index to address an item on its side. ``assemble`` turns checked pairs into writes: whole-item groups
coalesce contiguous runs into one write per run per tensor; sliced groups (TP mismatch) write each block
of each item. ``RULES``/``plan_group`` plan one group on its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from ..errors import PlanError
from ..schema import SendRule
from .assemble import assemble
from .pairing import TensorGroup
from .plan import WritePlan
from .runs import interleaved, paired_runs, word_runs
from .tables import Tables

__all__ = ["CHECKS", "RULES", "check_indices", "checked", "checked_runs", "plan_group"]

log = logging.getLogger(__name__)
Indices = npt.NDArray[np.int32]
Pair = tuple[Indices, Indices]
Check = Callable[[TensorGroup, Indices, Indices], Pair]
Rule = Callable[[TensorGroup, Indices, Indices], WritePlan]
_I32 = np.dtype(np.int32)


def _in_range(idx: Indices, limit: int) -> bool:
    if idx.size == 1:
        return 0 <= int(idx.flat[0]) < limit
    if idx.size == 0:
        return True
    if idx.dtype == _I32 and limit <= 2**31:
        return int(idx.view(np.uint32).max()) < limit
    return int(idx.min()) >= 0 and int(idx.max()) < limit


def check_indices(idx: Indices, limit: int, what: str) -> None:
    """Every index must address an existing item: ``0 <= idx < limit`` (as uint32, a negative int32
    index is larger than any limit, so one ``max`` checks both bounds)."""
    if _in_range(idx, limit):
        return
    pos = int(np.argmax((idx < 0) | (idx >= limit)))
    raise PlanError(
        f"{what} index {int(idx[pos])} at position {pos} is outside the region (0 <= index < {limit})"
    )


def _slot(group: TensorGroup, src: Indices, dst: Indices) -> Pair:
    """One item per request on each side (mamba slot, aux slot)."""
    if src.size != 1 or dst.size != 1:
        raise PlanError(
            f"{group.name}: a {group.rule.value} component needs exactly one index on each side, "
            f"got {src.size} on prefill and {dst.size} on decode"
        )
    return src, dst


def _paged(group: TensorGroup, src: Indices, dst: Indices) -> Pair:
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
    return src, dst


def _positional(group: TensorGroup, src: Indices, dst: Indices) -> Pair:
    """Items paired by position (ring buffers, compressed blocks): any length mismatch misaligns rows."""
    if src.size != dst.size:
        raise PlanError(
            f"{group.name}: {src.size} items on prefill but {dst.size} on decode; "
            "positional state needs equal lengths"
        )
    return src, dst


CHECKS: dict[SendRule, Check] = {
    SendRule.SLOT: _slot,
    SendRule.PAGED: _paged,
    SendRule.POSITIONAL: _positional,
}


def checked(group: TensorGroup, src: Indices, dst: Indices) -> Pair:
    """The group's rule, then every index against its side's item count (both registered regions)."""
    src, dst = CHECKS[group.rule](group, src, dst)
    _check_sides(group, src, dst)
    return src, dst


def _check_sides(group: TensorGroup, src: Indices, dst: Indices) -> None:
    if not _in_range(src, group.local_limit):
        check_indices(src, group.local_limit, f"{group.name}: prefill")
    if not _in_range(dst, group.remote_limit):
        check_indices(dst, group.remote_limit, f"{group.name}: decode")


Runs = tuple[npt.NDArray[np.integer], npt.NDArray[np.integer]]


def checked_runs(group: TensorGroup, src: Indices, dst: Indices) -> Runs:
    """``checked`` plus the contiguous runs of a whole-item group: ``((2, runs) starts, lengths)``.

    For 1-D int32 indices both sides go into one interleaved buffer: one ``max`` over it (as uint32,
    so a negative index is huge) against the smaller limit clears both sides at once; only when it
    does not are the sides checked one by one, which raises the specific error or passes an index
    that is only beyond the other side's limit."""
    src, dst = CHECKS[group.rule](group, src, dst)
    limit = min(group.local_limit, group.remote_limit)
    if not (src.dtype == _I32 and dst.dtype == _I32 and src.ndim == 1 and dst.ndim == 1 and src.size > 1):
        _check_sides(group, src, dst)
        return paired_runs(src, dst)
    buf = interleaved(src, dst)
    if limit > 2**31 or int(buf.view(np.uint32).max()) >= limit:
        _check_sides(group, src, dst)
    starts, lengths = word_runs(buf)
    return starts.T, lengths


def _rule(check: Check) -> Rule:
    def plan(group: TensorGroup, src: Indices, dst: Indices) -> WritePlan:
        return assemble(Tables.build([group.table]), [(0, *checked(group, src, dst))])

    plan.__doc__ = check.__doc__
    return plan


RULES: dict[SendRule, Rule] = {rule: _rule(check) for rule, check in CHECKS.items()}


def plan_group(group: TensorGroup, src: Indices, dst: Indices) -> WritePlan:
    """Plan one group by its rule; a group with no paired tensors plans nothing."""
    if not len(group):
        return WritePlan.empty()
    return RULES[group.rule](group, src, dst)
