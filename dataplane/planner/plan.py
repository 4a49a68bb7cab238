"""``WritePlan``: the planner's output, one row per one-sided write, as parallel numpy arrays.

Transports consume the arrays directly (region ids index the canonical region order of each side:
``RoleSchema.regions()`` locally, ``PeerLayout.regions()`` remotely), so a plan of thousands of
writes costs a handful of array allocations, never a Python object per write.

A TP-sliced component is planned compact: its rows carry ``repeat`` (a count and a stride per side),
so a head slice of every token of a run of pages is one row, not one per token. ``expanded`` gives
the same writes one per row, for consumers that take nothing else.

The constructor trusts its arrays (the planner's own are correctly typed by construction); ``build``
is the checked entry point for anything else.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..schema import AUX_COMPONENT, KV_COMPONENT

__all__ = ["AUX_COMPONENT", "KV_COMPONENT", "WritePlan"]

_FIELDS: tuple[tuple[str, type[np.generic]], ...] = (
    ("local_region", np.int32),
    ("local_offset", np.int64),
    ("remote_region", np.int32),
    ("remote_offset", np.int64),
    ("size", np.int64),
    ("component", np.int16),
)
_NAMES = tuple(name for name, _ in _FIELDS)


@dataclass(frozen=True, eq=False)
class WritePlan:
    """Writes ``size`` bytes from ``local_region[local_offset:]`` to ``remote_region[remote_offset:]``.

    ``component`` is ``KV_COMPONENT`` (-1), ``AUX_COMPONENT`` (-2) or the state component's index, so
    metrics can be split per component without re-deriving it from region ids.

    ``repeat`` (``None``: one write per row) is ``(3, rows)`` ``[count; local stride; remote stride]``:
    row ``i`` then stands for ``count[i]`` writes of ``size[i]`` bytes, the ``k``-th at
    ``offset + k * stride`` on each side. ``len`` counts rows; ``writes`` counts writes.
    """

    local_region: npt.NDArray[np.int32]
    local_offset: npt.NDArray[np.int64]
    remote_region: npt.NDArray[np.int32]
    remote_offset: npt.NDArray[np.int64]
    size: npt.NDArray[np.int64]
    component: npt.NDArray[np.int16]
    repeat: npt.NDArray[np.int64] | None = None

    def check(self) -> WritePlan:
        """Raise ``ValueError`` unless every column is 1-D, of its canonical dtype and of one length
        (and ``repeat``, if any, ``(3, rows)`` int64 with every count at least 1)."""
        n = len(self.size)
        for name, dtype in _FIELDS:
            arr = getattr(self, name)
            if arr.dtype != dtype or arr.ndim != 1 or len(arr) != n:
                raise ValueError(f"WritePlan.{name} must be a 1-D {np.dtype(dtype)} array of length {n}")
        rep = self.repeat
        if rep is not None and (rep.dtype != np.int64 or rep.shape != (3, n) or (n and rep[0].min() < 1)):
            raise ValueError(f"WritePlan.repeat must be a (3, {n}) int64 array with counts of at least 1")
        return self

    @classmethod
    def build(
        cls,
        local_region: npt.ArrayLike,
        local_offset: npt.ArrayLike,
        remote_region: npt.ArrayLike,
        remote_offset: npt.ArrayLike,
        size: npt.ArrayLike,
        component: npt.ArrayLike,
    ) -> WritePlan:
        """Broadcast scalars and cast to the canonical dtypes (scalars repeat for every write)."""
        values = (local_region, local_offset, remote_region, remote_offset, size, component)
        n = max((np.size(v) for v in values if np.ndim(v)), default=1)
        arrays = [
            np.broadcast_to(np.asarray(v, dtype=dtype), (n,)).copy()
            for v, (_, dtype) in zip(values, _FIELDS, strict=True)
        ]
        return cls(*arrays).check()

    @classmethod
    def trusted(
        cls,
        local_region: npt.NDArray[np.int32],
        local_offset: npt.NDArray[np.int64],
        remote_region: npt.NDArray[np.int32],
        remote_offset: npt.NDArray[np.int64],
        size: npt.NDArray[np.int64],
        component: npt.NDArray[np.int16],
        repeat: npt.NDArray[np.int64] | None = None,
    ) -> WritePlan:
        """The planner's own, correctly typed arrays, without the dataclass ``__init__`` (its seven
        frozen-field assignments cost about as much as a numpy call on the per-request path): the
        fields go into the instance dict in one update (seven stores into it cost twice that)."""
        plan = object.__new__(cls)
        plan.__dict__.update(
            local_region=local_region,
            local_offset=local_offset,
            remote_region=remote_region,
            remote_offset=remote_offset,
            size=size,
            component=component,
            repeat=repeat,
        )
        return plan

    @classmethod
    def empty(cls) -> WritePlan:
        return cls(*(np.empty(0, dtype=dtype) for _, dtype in _FIELDS))

    @classmethod
    def concat(cls, plans: Iterable[WritePlan]) -> WritePlan:
        parts = [p for p in plans if len(p)]
        if not parts:
            return cls.empty()
        if len(parts) == 1:
            return parts[0]
        lr, lo, rr, ro, size, comp = (np.concatenate([getattr(p, name) for p in parts]) for name in _NAMES)
        if all(p.repeat is None for p in parts):
            return cls.trusted(lr, lo, rr, ro, size, comp)
        return cls.trusted(lr, lo, rr, ro, size, comp, np.concatenate([p._repeat() for p in parts], axis=1))

    def __len__(self) -> int:
        return len(self.size)

    @property
    def writes(self) -> int:
        """Writes planned (rows times their counts)."""
        return len(self.size) if self.repeat is None else int(self.repeat[0].sum())

    @property
    def total_bytes(self) -> int:
        return int(self._bytes().sum())

    def bytes_by_component(self) -> dict[int, int]:
        """Bytes planned per component id (KV_COMPONENT, AUX_COMPONENT or a component index)."""
        return self._by_component(self._bytes())

    def writes_by_component(self) -> dict[int, int]:
        if self.repeat is None:
            ids, counts = np.unique(self.component, return_counts=True)
            return {int(c): int(n) for c, n in zip(ids, counts, strict=True)}
        return self._by_component(self.repeat[0])

    def select(self, mask: npt.NDArray[np.bool_]) -> WritePlan:
        lr, lo, rr, ro, size, comp = (getattr(self, name)[mask] for name in _NAMES)
        return WritePlan(lr, lo, rr, ro, size, comp, None if self.repeat is None else self.repeat[:, mask])

    def expanded(self) -> WritePlan:
        """The same writes one per row (``self`` when it already is): each row's ``count`` writes in
        place of it, in stride order."""
        rep = self.repeat
        if rep is None:
            return self
        count = rep[0]
        row = np.repeat(np.arange(len(count)), count)
        first = np.cumsum(count) - count
        step = np.arange(len(row), dtype=np.int64) - first[row]
        return WritePlan.trusted(
            self.local_region[row],
            self.local_offset[row] + step * rep[1, row],
            self.remote_region[row],
            self.remote_offset[row] + step * rep[2, row],
            self.size[row],
            self.component[row],
        )

    def rows(self) -> list[tuple[int, int, int, int, int, int]]:
        """Plain tuples, one per write, for tests and debugging output (not for the hot path)."""
        plan = self.expanded()
        cols: Sequence[npt.NDArray[np.generic]] = [getattr(plan, name) for name, _ in _FIELDS]
        return [tuple(int(x) for x in row) for row in zip(*cols, strict=True)]  # type: ignore[misc]

    def _bytes(self) -> npt.NDArray[np.int64]:
        return self.size if self.repeat is None else self.size * self.repeat[0]

    def _repeat(self) -> npt.NDArray[np.int64]:
        if self.repeat is not None:
            return self.repeat
        rep = np.zeros((3, len(self.size)), dtype=np.int64)
        rep[0] = 1
        return rep

    def _by_component(self, weights: npt.NDArray[np.int64]) -> dict[int, int]:
        ids, inverse = np.unique(self.component, return_inverse=True)
        sums = np.zeros(len(ids), dtype=np.int64)
        np.add.at(sums, inverse, weights)
        return {int(c): int(s) for c, s in zip(ids, sums, strict=True)}
