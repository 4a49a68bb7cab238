"""The common request shape, planned in one pass: paged KV over one family of whole items, and one
index per side for aux and for every component (e.g. Qwen3-Next: KV pages, an aux slot, a mamba slot).

``CommonShape.plan`` writes exactly the rows the general path (``Builder``) writes, in the same order,
after the same checks, but with about twenty numpy calls and no per-part Python objects: one
interleaved buffer for both sides' pages (one ``max`` range-checks both, one word difference finds
the runs), the runs' ``[src; dst; length]`` gathered once into a small array and scaled by the item
length, then broadcast over every KV buffer; every single-index row (aux, components) comes from one
gather of a per-request ``[src...; dst...; 1]`` vector and one multiply by the per-peer table.
Where numba is installed the same rows come from one compiled call instead (``kernel.KERNEL``, about
half the time: the numpy calls' fixed costs, not the rows, dominate); ``plan_numpy`` keeps the numpy
path callable, and the tests hold the two to the general path and to each other.

Anything outside the shape (another dtype, a page drift, a missing index, an index beyond the
smaller of the two sides' limits) returns ``None``: the general path then plans it or raises the
specific error. Only the per-peer tables are precomputed; every row is computed per request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import numpy.typing as npt

from ..schema import KV_COMPONENT, SendRule
from . import kernel as _kernel
from .layout import RequestIndices
from .plan import WritePlan
from .runs import word_edges
from .tables import Tables

if TYPE_CHECKING:
    from .pairing import TensorGroup

__all__ = ["CommonShape"]

_I32 = np.dtype(np.int32)
_ONE = (1,)
_A = TypeVar("_A", bound=np.ndarray[Any, Any])
_Slots = tuple[int, int, npt.NDArray[np.int32], npt.NDArray[np.int32]]
"""Each side's aux slot, then each side's state slots (``CommonShape._slots``)."""
_States = Sequence[Any]
_Aux = tuple[int, int, _States, _States]
"""Each side's aux slot and state indices, once checked (``CommonShape._one_aux_each``)."""


@dataclass(frozen=True, eq=False)
class CommonShape:
    """Per-peer tables for the common shape. ``aux_limits`` and ``state_limits`` are the single-index
    groups' (prefill, decode) item counts; ``gather`` to ``component`` cover the rows after KV, in
    canonical group order (aux, then the components)."""

    item: int
    """KV item length: both sides' item and every write's size per page (a whole-item family)."""
    blocks: int
    kv_limit: int
    kv_regions: npt.NDArray[np.int32]
    """``(2, blocks, 1)``: each KV buffer's (prefill, decode) region, broadcast over the runs."""
    aux_limits: tuple[int, int]
    state_limits: tuple[tuple[int, int], ...]
    gather: npt.NDArray[np.intp]
    """``(3, rows)``: each row's position in the request's ``[src...; dst...; 1]`` vector."""
    scale: npt.NDArray[np.int64]
    bases: npt.NDArray[np.int64] | None
    regions: npt.NDArray[np.int32]
    component: npt.NDArray[np.int16]
    table: npt.NDArray[np.int64]
    """All of the above, packed for the compiled kernel (``kernel.pack_table``)."""

    @classmethod
    def build(cls, kv: TensorGroup, singles: Sequence[TensorGroup], tables: Tables) -> CommonShape | None:
        """The shape's tables, or ``None`` when this pairing cannot take the shape (KV buffers of
        several item lengths or with bases, a group with nothing paired, a non-slot aux, a strided
        single-index group)."""
        g = kv.table
        limit = min(kv.local_limit, kv.remote_limit)
        if not (len(kv) and g.whole and g.family is not None and not g.based and 0 < limit <= 2**31):
            return None
        if not singles or singles[0].rule is not SendRule.SLOT or not all(len(s) for s in singles):
            return None
        if any(s.table.strided for s in singles):
            return None
        lo, n = tables.start[1], len(singles)
        group = tables.row_group[lo:] - 1
        gather = np.stack((group, group + n, np.full_like(group, 2 * n)))
        item, kv_regions = int(g.family[0, 0]), _frozen(g.regions[:, :, None].copy())
        scale, regions = _frozen(tables.scale[:, lo:].copy()), _frozen(tables.regions[:, lo:].copy())
        bases = _frozen(tables.bases[:, lo:].copy()) if tables.based else None
        component = _frozen(tables.component[lo:].copy())
        # A state slot beyond int32 (of an item count that large) is left to the general path.
        state_limits = tuple((min(s.local_limit, 2**31), min(s.remote_limit, 2**31)) for s in singles[1:])
        return cls(
            item,
            g.blocks,
            limit,
            kv_regions,
            (singles[0].local_limit, singles[0].remote_limit),
            state_limits,
            _frozen(gather),
            scale,
            bases,
            regions,
            component,
            _kernel.pack_table(
                limit,
                item,
                kv_regions,
                scale,
                gather,
                bases,
                regions,
                component,
                np.array(state_limits, np.int64).reshape(-1, 2).T,
            ),
        )

    def plan(self, req: RequestIndices) -> WritePlan | None:
        """Every write of ``req`` if it has the common shape and passes the combined range check;
        ``None`` otherwise (nothing is planned, nothing raised). Planned by the compiled kernel
        where there is one (``kernel.KERNEL``), else in numpy (``plan_numpy``): the same rows.
        The kernel is called without numba's type matching (``kernel.entry_point``): the dtype and
        dimensions of every array it takes are checked here (``_slots``), before the call."""
        src, dst = req.src_kv, req.dst_kv
        n = src.size
        if n < 1 or dst.size != n or src.dtype != _I32 or dst.dtype != _I32 or src.ndim != 1 or dst.ndim != 1:
            return None
        compiled = _kernel.KERNEL
        if compiled is None:
            picks = self._singles(req)
            return None if picks is None else self._numpy(src, dst, picks)
        singles = self._slots(req)
        if singles is None:
            return None
        aux_s, aux_d, slots_s, slots_d = singles
        i64, i32, i16 = compiled(src, dst, self.table, aux_s, aux_d, slots_s, slots_d)
        if not len(i16):
            return None
        return WritePlan.trusted(i32[0], i64[0], i32[1], i64[1], i64[2], i16)

    def plan_numpy(self, req: RequestIndices) -> WritePlan | None:
        """``plan`` without the compiled kernel (what runs where numba is not installed)."""
        src, dst = req.src_kv, req.dst_kv
        n = src.size
        if n < 1 or dst.size != n or src.dtype != _I32 or dst.dtype != _I32 or src.ndim != 1 or dst.ndim != 1:
            return None
        picks = self._singles(req)
        return None if picks is None else self._numpy(src, dst, picks)

    def _numpy(
        self, src: npt.NDArray[np.int32], dst: npt.NDArray[np.int32], picks: list[int]
    ) -> WritePlan | None:
        n = src.size
        buf = np.empty((n, 2), dtype=np.int32)
        buf[:, 0] = src
        buf[:, 1] = dst
        if int(buf.view(np.uint32).max()) >= self.kv_limit:
            return None
        edges = word_edges(buf)
        starts = edges[:-1]
        runs, blocks = len(starts), self.blocks
        kv_rows = blocks * runs
        rows = kv_rows + self.scale.shape[1]
        i64 = np.empty((3, rows), dtype=np.int64)
        i32 = np.empty((2, rows), dtype=np.int32)
        i16 = np.empty(rows, dtype=np.int16)
        one = np.empty((3, runs), dtype=np.int64)
        one[0:2] = buf.take(starts, axis=0).T
        np.subtract(edges[1:], starts, out=one[2])
        one *= self.item
        i64[:, :kv_rows].reshape(3, blocks, runs)[...] = one[:, None, :]
        i32[:, :kv_rows].reshape(2, blocks, runs)[...] = self.kv_regions
        i16[:kv_rows].fill(KV_COMPONENT)
        single = i64[:, kv_rows:]
        np.multiply(self.scale, np.array(picks, dtype=np.int64)[self.gather], out=single)
        if self.bases is not None:
            single[0:2] += self.bases
        i32[:, kv_rows:] = self.regions
        i16[kv_rows:] = self.component
        return WritePlan.trusted(i32[0], i64[0], i32[1], i64[1], i64[2], i16)

    def _slots(self, req: RequestIndices) -> _Slots | None:
        """Each side's aux slot and state slots (a 1-D int32 array, one per component), for the
        kernel, when aux has one in-range integer index on each side and every component one index
        on each side; ``None`` otherwise. The kernel checks the state slots' range; a decoded
        message's one-slot array (int32) passes as it is, anything else through ``_picks``."""
        one = self._one_aux_each(req)
        if one is None:
            return None
        src, dst, src_state, dst_state = one
        if len(src_state) == 1:
            one_s, one_d = src_state[0], dst_state[0]
            if (
                type(one_s) is np.ndarray
                and type(one_d) is np.ndarray
                and one_s.shape == _ONE
                and one_d.shape == _ONE
                and one_s.dtype == _I32
                and one_d.dtype == _I32
            ):
                return src, dst, one_s, one_d
        picks = self._picks(src, dst, src_state, dst_state)
        if picks is None:
            return None
        c = len(src_state)
        return src, dst, np.array(picks[1 : c + 1], _I32), np.array(picks[c + 2 : 2 * c + 2], _I32)

    def _singles(self, req: RequestIndices) -> list[int] | None:
        """``[src per group..., dst per group..., 1]`` when aux and every component have exactly one
        in-range integer index on each side; ``None`` otherwise."""
        one = self._one_aux_each(req)
        if one is None:
            return None
        src, dst, src_state, dst_state = one
        return self._picks(src, dst, src_state, dst_state)

    def _one_aux_each(self, req: RequestIndices) -> _Aux | None:
        """(src aux, dst aux, src state, dst state) when aux has one in-range integer index on each
        side and each side names every component; ``None`` otherwise."""
        src, dst, src_state, dst_state = req.src_aux, req.dst_aux, req.src_state, req.dst_state
        (src_limit, dst_limit), n = self.aux_limits, len(self.state_limits)
        if (
            type(src) is not int
            or type(dst) is not int
            or not (0 <= src < src_limit and 0 <= dst < dst_limit)
            or src_state is None
            or dst_state is None
            or len(src_state) != n
            or len(dst_state) != n
        ):
            return None
        return src, dst, src_state, dst_state

    def _picks(self, src: int, dst: int, src_state: _States, dst_state: _States) -> list[int] | None:
        """``_singles`` of what ``_one_aux_each`` passed: each component's one index per side, in range."""
        limits = self.state_limits
        if len(limits) == 1:  # one component (Qwen3-Next's mamba): the loop below, unrolled
            one_s, one_d = src_state[0], dst_state[0]
            if (
                type(one_s) is not np.ndarray
                or type(one_d) is not np.ndarray
                or one_s.shape != _ONE
                or one_d.shape != _ONE
            ):
                return None
            slot_s, slot_d = one_s.item(), one_d.item()
            ((src_limit, dst_limit),) = limits
            if (
                type(slot_s) is not int
                or type(slot_d) is not int
                or not (0 <= slot_s < src_limit and 0 <= slot_d < dst_limit)
            ):
                return None
            return [src, slot_s, dst, slot_d, 1]
        srcs, dsts = [src], [dst]
        for s, d, (src_limit, dst_limit) in zip(src_state, dst_state, limits, strict=True):
            if type(s) is not np.ndarray or type(d) is not np.ndarray or s.shape != _ONE or d.shape != _ONE:
                return None
            src, dst = s.item(), d.item()
            if (
                type(src) is not int
                or type(dst) is not int
                or not (0 <= src < src_limit and 0 <= dst < dst_limit)
            ):
                return None
            srcs.append(src)
            dsts.append(dst)
        return [*srcs, *dsts, 1]


def _frozen(arr: _A) -> _A:
    arr.setflags(write=False)
    return arr
