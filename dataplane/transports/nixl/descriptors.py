"""How a batch of writes becomes NIXL requests: descriptor lists prepared once, indices per request.

For a batch whose offsets and sizes share a block size ``g``, every region is prepared once (per side,
per ``g``) as a strided list of ``g``-byte blocks, and each request is just two index arrays for
``make_prepped_xfer`` (NIXL merges adjacent blocks back into large transfers). A compact plan's
strided entries (``Writes.repeat``: a TP-sliced head slice of every token) go the same way, their
strides in ``g``: the indices are worked out from the entries, the lists are the ones every room of
that block size shares. A small batch of mixed sizes (a room: KV pages, a state slot, a 64-byte aux
slot) uses lists that cut each region by its own grain instead (``Cut``, ``blocks.settle_grains``):
one index per item, no descriptors built per request — on the 2-vCPU dev VM a 12-write request cost
64-68 µs to make, post and finish as exact descriptors and 42 µs this way. Batches neither way fits
(lists too long, or far more indices than writes) go as exact descriptors (``initialize_xfer``).
"""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import blocks
from ..base import SMALL, Writes
from .sdk import MemType

log = logging.getLogger(__name__)

INDICES_PER_ROW = 8
"""A batch whose common block size would need more prepared-list indices than this per write (plus
64) goes as exact descriptors, one per write: a mixed batch's block is its smallest write's."""
GRAIN_REFUSALS = 16
"""A peer whose small batches this many times could not be cut by grain (lists over ``prep_limit``)
stops trying: its batches go the other ways without the attempt's cost."""


@dataclass(eq=False)
class Cut:
    """One side's regions, each cut in blocks of its own grain, as one prepared list per memory kind
    (``blocks.settle_grains``). A grain only ever shrinks (to a divisor), and a kind's list is remade
    when one of its grains does; the lists it replaces stay alive until the side goes (``close``,
    ``disconnect``), since transfers made from them may still run."""

    agent: str
    grains: list[int]
    lists: dict[MemType, tuple[Any, list[int]]] = field(default_factory=dict)
    """kind → (prepared list, each region's first index in it; -1: not in it)"""
    retired: list[Any] = field(default_factory=list)
    refusals: int = 0

    def handles(self) -> list[Any]:
        return [h for h, _ in self.lists.values()] + self.retired


@dataclass(eq=False)
class Side:
    """One side's registered regions as NIXL sees them, and the lists prepared over them."""

    agent: str
    """The NIXL agent that owns the regions ("" for this process's own)."""
    descs: np.ndarray
    """(addr, size, device) per region, uint64."""
    mem: tuple[MemType, ...]
    table: list[list[int]] = field(default_factory=list)
    """``descs`` as Python lists (a room's few exact descriptors are built faster from them)."""
    sizes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    prepped: dict[tuple[MemType, int], Any] = field(default_factory=dict)
    bases: dict[tuple[MemType, int], np.ndarray] = field(default_factory=dict)
    """(kind, block) → first block index of each region in that prepared list (``blocks.layout``)."""
    cut: Cut | None = None
    one_kind: bool = True
    """Every region of one memory kind: a batch needs no split by kind (``by_memory``)."""

    @classmethod
    def of(cls, agent: str, rows: list[tuple[int, int, int]], mem: tuple[MemType, ...]) -> Side:
        descs = np.array(rows, dtype=np.uint64).reshape(-1, 3)
        sizes = descs[:, 1].astype(np.int64)
        return cls(agent, descs, mem, descs.tolist(), sizes, cut=Cut(agent, [0] * len(rows)),
                   one_kind=len(set(mem)) <= 1)

    def handles(self) -> list[Any]:
        """Every list prepared over this side (released when it goes)."""
        return [*self.prepped.values(), *(self.cut.handles() if self.cut else [])]

    def forget(self) -> None:
        self.prepped.clear()
        self.cut = None


def by_memory(local: Side, remote: Side, writes: Writes) -> list[tuple[Writes, MemType, MemType]]:
    """The batch cut by (local, remote) memory kind: one NIXL request per pair. Both sides of one
    kind (the usual case) skip the per-write split, which dominated small requests' posting."""
    if local.one_kind and remote.one_kind:
        return [(writes, local.mem[0], remote.mem[0])]
    lmem, rmem = np.array(local.mem)[writes.local_region], np.array(remote.mem)[writes.remote_region]
    pairs = sorted(set(zip(lmem.tolist(), rmem.tolist(), strict=True)))
    return [(writes.subset((lmem == lm) & (rmem == rm)), lm, rm) for lm, rm in pairs]


class Descriptions:
    """Makes one NIXL request handle per (batch, memory-kind pair) on ``agent``, choosing the way
    (``paths``) and preparing lists as they are first needed."""

    def __init__(self, agent: Any, prep_limit: int):
        self.agent = agent
        self.prep_limit = prep_limit
        """Most blocks one prepared list may hold; beyond it, exact descriptors are cheaper."""
        self.paths: collections.Counter[str] = collections.Counter()
        """Engine requests made so far by how they were described: ``grain`` (lists cut by grain),
        ``block`` (lists cut in one block size, compact plans included), ``exact`` (descriptors built
        for the request)."""

    def requests(self, local: Side, remote: Side, writes: Writes) -> list[Any]:
        return [self.prepare(local, remote, w, lm, rm) for w, lm, rm in by_memory(local, remote, writes)]

    def prepare(self, local: Side, remote: Side, w: Writes, lm: MemType, rm: MemType) -> Any:
        if w.repeat is not None:
            return self._strided(local, remote, w, lm, rm)
        if len(w) <= SMALL:
            handle = self._by_grains(local, remote, w, lm, rm)
            if handle is not None:
                self.paths["grain"] += 1
                return handle
        g = blocks.block_size(w, local.sizes, remote.sizes, self.prep_limit)
        if g is not None and w.nbytes // g > INDICES_PER_ROW * len(w) + 64:
            g = None  # e.g. one room's 1 MiB page and 64 B aux slot: 16K indices, or two exact rows
        if g is None:
            return self._exact(local, remote, w, lm, rm)
        lidx = blocks.block_indices(w.local_region, w.local_offset, w.size, self._bases(local, lm, g), g)
        ridx = blocks.block_indices(w.remote_region, w.remote_offset, w.size, self._bases(remote, rm, g), g)
        self.paths["block"] += 1
        return self.agent.make_prepped_xfer(
            "WRITE", self._prepped(local, lm, g), lidx, self._prepped(remote, rm, g), ridx
        )

    def _strided(self, local: Side, remote: Side, w: Writes, lm: MemType, rm: MemType) -> Any:
        """A compact batch as indices into the lists of its block size (strides included), each
        entry's writes worked out from its count and strides; exact descriptors where no such lists
        fit (the batch expanded first)."""
        rep = w.repeat
        assert rep is not None
        g = blocks.strided_block_size(w, local.sizes, remote.sizes, self.prep_limit)
        if g is None or w.nbytes // g > INDICES_PER_ROW * w.count + 64:
            return self._exact(local, remote, w.expanded(), lm, rm)
        lidx = blocks.strided_block_indices(
            w.local_region, w.local_offset, rep[0], rep[1], w.size, self._bases(local, lm, g), g
        )
        ridx = blocks.strided_block_indices(
            w.remote_region, w.remote_offset, rep[0], rep[2], w.size, self._bases(remote, rm, g), g
        )
        self.paths["block"] += 1
        return self.agent.make_prepped_xfer(
            "WRITE", self._prepped(local, lm, g), lidx, self._prepped(remote, rm, g), ridx
        )

    def _exact(self, local: Side, remote: Side, w: Writes, lm: MemType, rm: MemType) -> Any:
        lrows = self.agent.get_xfer_descs(exact_rows(local, w, remote=False), lm)
        rrows = self.agent.get_xfer_descs(exact_rows(remote, w, remote=True), rm)
        self.paths["exact"] += 1
        return self.agent.initialize_xfer("WRITE", lrows, rrows, remote.agent)

    def _by_grains(self, local_side: Side, remote_side: Side, w: Writes, lm: MemType, rm: MemType) -> Any:
        """A small batch as indices into both sides' lists cut by grain, re-cutting a side whose
        grains it does not fit; None: it goes another way (lists would pass ``prep_limit``, or it
        needs far more indices than writes, e.g. a 1 MiB write into a region cut in 64-byte blocks)."""
        local, remote = local_side.cut, remote_side.cut
        if local is None or remote is None or remote.refusals >= GRAIN_REFUSALS:
            return None
        lists = w.lists
        settled = blocks.settle_grains(lists, local.grains, remote.grains)
        if settled is None:
            return None
        new_l, new_r = settled
        lg = local.grains if not new_l else [new_l.get(r, g) for r, g in enumerate(local.grains)]
        rg = remote.grains if not new_r else [new_r.get(r, g) for r, g in enumerate(remote.grains)]
        if sum(s // lg[a] for a, s in zip(lists[0], lists[4], strict=True)) > INDICES_PER_ROW * len(w) + 64:
            return None
        if (new_l or new_r) and not self._recut(local_side, remote_side, (new_l, lg), (new_r, rg)):
            return None
        lhandle, lbases = local.lists[lm]
        rhandle, rbases = remote.lists[rm]
        li, ri = blocks.grain_indices(lists, local.grains, lbases, rbases)
        return self.agent.make_prepped_xfer("WRITE", lhandle, li, rhandle, ri)

    def _recut(
        self, local_side: Side, remote_side: Side,
        lnew: tuple[dict[int, int], list[int]], rnew: tuple[dict[int, int], list[int]],
    ) -> bool:
        """Adopt new grains on both sides — (changed regions, every region's grain) each — remaking
        the lists of the memory kinds they touch, all or nothing; False (nothing changed) when a
        list would pass ``prep_limit`` (counted against the peer) or NIXL cannot prepare one (the
        peer then stops trying)."""
        local, remote = local_side.cut, remote_side.cut
        assert local is not None and remote is not None
        plans = []
        for cut, side, (changed, grains) in ((local, local_side, lnew), (remote, remote_side, rnew)):
            for kind in sorted({side.mem[r] for r in changed}):
                mask = np.array(side.mem) == kind
                if blocks.cut_entries(side.sizes.tolist(), grains, mask.tolist()) > self.prep_limit:
                    remote.refusals += 1
                    return False
                plans.append((cut, kind, side.descs, mask, grains))
        made: list[tuple[Cut, MemType, Any, list[int]]] = []
        try:
            for cut, kind, descs, mask, grains in plans:
                rows, bases = blocks.cut_rows(descs, grains, mask)
                made.append((cut, kind, self.agent.prep_xfer_dlist(cut.agent, rows, kind), bases))
        except Exception as exc:
            log.warning("nixl: cannot prepare lists cut by grain for %r, not trying again: %s",
                        remote_side.agent, exc)
            for _, _, handle, _ in made:
                quietly(handle.release)
            remote.refusals = GRAIN_REFUSALS
            return False
        local.grains, remote.grains = lnew[1], rnew[1]
        for cut, kind, handle, bases in made:
            old = cut.lists.get(kind)
            if old is not None:
                cut.retired.append(old[0])
            cut.lists[kind] = (handle, bases)
        return True

    def _prepped(self, side: Side, kind: MemType, block: int) -> Any:
        """The prepared list of the side's ``kind`` regions cut in ``block``-byte blocks, made once."""
        if (kind, block) not in side.prepped:
            rows = blocks.strided_rows(side.descs, np.array(side.mem) == kind, block)
            side.prepped[kind, block] = self.agent.prep_xfer_dlist(side.agent, rows, kind)
        return side.prepped[kind, block]

    @staticmethod
    def _bases(side: Side, kind: MemType, block: int) -> np.ndarray:
        """``blocks.layout`` of the side's ``kind`` regions, computed once per (kind, block)."""
        if (kind, block) not in side.bases:
            side.bases[kind, block] = blocks.layout(side.sizes, np.array(side.mem) == kind, block)
        return side.bases[kind, block]


def exact_rows(side: Side, w: Writes, *, remote: bool) -> np.ndarray | list[tuple[int, int, int]]:
    """(addr, len, dev) rows for exactly the given writes' local (or remote) side: tuples for a few
    (a room's), else Nx3."""
    if len(w) <= SMALL:
        lr, lo, rr, ro, sizes = w.lists
        ids, offs = (rr, ro) if remote else (lr, lo)
        table = side.table
        return [(table[r][0] + off, n, table[r][2]) for r, off, n in zip(ids, offs, sizes, strict=True)]
    region, offset = (w.remote_region, w.remote_offset) if remote else (w.local_region, w.local_offset)
    rows = np.empty((len(w), 3), dtype=np.uint64)
    rows[:, 0] = side.descs[region, 0] + offset.astype(np.uint64)
    rows[:, 1] = w.size
    rows[:, 2] = side.descs[region, 2]
    return rows


def quietly(fn: Any, *args: Any) -> Exception | None:
    """Run ``fn`` for cleanup: its exception is returned, not raised."""
    try:
        fn(*args)
    except Exception as exc:
        return exc
    return None


__all__ = ["GRAIN_REFUSALS", "INDICES_PER_ROW", "Cut", "Descriptions", "Side", "by_memory", "exact_rows"]
