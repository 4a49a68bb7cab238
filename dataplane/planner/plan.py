"""``WritePlan``: the planner's output, one row per one-sided write, as parallel numpy arrays.

Transports consume the arrays directly (region ids index the canonical region order of each side:
``RoleSchema.regions()`` locally, ``PeerLayout.regions()`` remotely), so a plan of thousands of
writes costs a handful of array allocations, never a Python object per write.

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
    """

    local_region: npt.NDArray[np.int32]
    local_offset: npt.NDArray[np.int64]
    remote_region: npt.NDArray[np.int32]
    remote_offset: npt.NDArray[np.int64]
    size: npt.NDArray[np.int64]
    component: npt.NDArray[np.int16]

    def check(self) -> WritePlan:
        """Raise ``ValueError`` unless every column is 1-D, of its canonical dtype and of one length."""
        n = len(self.size)
        for name, dtype in _FIELDS:
            arr = getattr(self, name)
            if arr.dtype != dtype or arr.ndim != 1 or len(arr) != n:
                raise ValueError(f"WritePlan.{name} must be a 1-D {np.dtype(dtype)} array of length {n}")
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
    ) -> WritePlan:
        """The planner's own, correctly typed arrays, without the dataclass ``__init__`` (its six
        frozen-field assignments cost about as much as a numpy call on the per-request path)."""
        plan = object.__new__(cls)
        fields = plan.__dict__
        fields["local_region"] = local_region
        fields["local_offset"] = local_offset
        fields["remote_region"] = remote_region
        fields["remote_offset"] = remote_offset
        fields["size"] = size
        fields["component"] = component
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
        return cls.trusted(*(np.concatenate([getattr(p, name) for p in parts]) for name in _NAMES))

    def __len__(self) -> int:
        return len(self.size)

    @property
    def total_bytes(self) -> int:
        return int(self.size.sum())

    def bytes_by_component(self) -> dict[int, int]:
        """Bytes planned per component id (KV_COMPONENT, AUX_COMPONENT or a component index)."""
        ids, inverse = np.unique(self.component, return_inverse=True)
        sums = np.zeros(len(ids), dtype=np.int64)
        np.add.at(sums, inverse, self.size)
        return {int(c): int(s) for c, s in zip(ids, sums, strict=True)}

    def writes_by_component(self) -> dict[int, int]:
        ids, counts = np.unique(self.component, return_counts=True)
        return {int(c): int(n) for c, n in zip(ids, counts, strict=True)}

    def select(self, mask: npt.NDArray[np.bool_]) -> WritePlan:
        return WritePlan(*(getattr(self, name)[mask] for name in _NAMES))

    def rows(self) -> list[tuple[int, int, int, int, int, int]]:
        """Plain tuples, for tests and debugging output (not for the hot path)."""
        cols: Sequence[npt.NDArray[np.generic]] = [getattr(self, name) for name, _ in _FIELDS]
        return [tuple(int(x) for x in row) for row in zip(*cols, strict=True)]  # type: ignore[misc]
