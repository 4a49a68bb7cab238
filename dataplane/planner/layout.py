"""What the planner knows of each side of a request: the peer's registered layout and the indices.

``PeerLayout`` is the decode rank's registration reduced to what planning needs — region sizes in
canonical order, TP, item lengths, TP dims and layer ids — with no codec types in it, so tests and the
agent can build one from a ``RoleSchema`` or from a decoded registration alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from ..errors import PlanError
from ..schema import AUX_COMPONENT, KV_COMPONENT, RoleSchema

IndexArray = npt.NDArray[np.int32]


@dataclass(frozen=True)
class PeerRegion:
    """One registered remote buffer: ``num_items`` items of ``item_len`` bytes."""

    item_len: int
    num_items: int

    def __post_init__(self) -> None:
        if self.item_len <= 0 or self.num_items < 0:
            raise PlanError(f"peer region item_len {self.item_len} / num_items {self.num_items} out of range")

    @property
    def size(self) -> int:
        return self.item_len * self.num_items


@dataclass(frozen=True)
class PeerComponent:
    """A peer's state component: its tensors' regions, TP dims (mamba only) and layer ids."""

    regions: tuple[PeerRegion, ...]
    dims: tuple[int, ...] = ()
    layer_ids: tuple[int, ...] = ()
    state_type: str | None = None
    """Known only when the peer sent our manifest; sglang's wire does not carry it."""

    @property
    def item_lens(self) -> tuple[int, ...]:
        return tuple(r.item_len for r in self.regions)


@dataclass(frozen=True)
class PeerLayout:
    """The decode rank's registered memory, in canonical region order: KV, aux, then components."""

    tp_size: int
    """The decode engine's attention-TP size."""
    tp_rank: int
    """The decode rank as its registration names it: sglang's engine rank, which with DP attention is
    at or above ``tp_size``; planning uses ``attn_tp_rank``."""
    kv: tuple[PeerRegion, ...]
    kv_layer_ids: tuple[int, ...] = ()
    aux: tuple[PeerRegion, ...] = ()
    components: tuple[PeerComponent, ...] = ()
    _bases: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.tp_size <= 0 or self.tp_rank < 0:
            raise PlanError(f"peer tp_rank {self.tp_rank} / tp_size {self.tp_size} out of range")
        if self.kv_layer_ids and len(self.kv_layer_ids) != len(self.kv):
            raise PlanError(
                f"peer kv_layer_ids has {len(self.kv_layer_ids)} entries for {len(self.kv)} KV buffers"
            )
        bases, n = [], len(self.kv) + len(self.aux)
        for comp in self.components:
            bases.append(n)
            n += len(comp.regions)
        object.__setattr__(self, "_bases", tuple(bases))

    @property
    def attn_tp_rank(self) -> int:
        """The rank within the decode attention-TP group (``tp_rank % tp_size``, as sglang uses it)."""
        return self.tp_rank % self.tp_size

    def region_base(self, component: int) -> int:
        """Index of the first region of ``component`` in canonical order."""
        if component == KV_COMPONENT:
            return 0
        if component == AUX_COMPONENT:
            return len(self.kv)
        return self._bases[component]

    def regions(self) -> tuple[PeerRegion, ...]:
        return self.kv + self.aux + tuple(r for c in self.components for r in c.regions)

    @classmethod
    def from_schema(cls, schema: RoleSchema) -> PeerLayout:
        """The layout a peer running ``schema`` registers (tests, loopback demos)."""
        kv = tuple(PeerRegion(schema.kv.item_len, schema.kv.num_pages) for _ in schema.kv.layer_ids)
        aux = tuple(PeerRegion(n, schema.aux.num_items) for n in schema.aux.item_lens)
        comps = tuple(
            PeerComponent(
                regions=tuple(PeerRegion(t.item_len, c.num_items) for t in c.tensors),
                dims=tuple(t.tp_dim for t in c.tensors) if c.info.tp_sliceable else (),
                layer_ids=tuple(t.layer_id for t in c.tensors),
                state_type=c.state_type,
            )
            for c in schema.components
        )
        return cls(schema.tp_size, schema.tp_rank, kv, tuple(schema.kv.layer_ids), aux, comps)

    @classmethod
    def from_registration(
        cls,
        *,
        tp_size: int,
        tp_rank: int,
        kv_item_len: int,
        kv_region_sizes: Sequence[int],
        kv_layer_ids: Sequence[int],
        aux_item_lens: Sequence[int],
        aux_region_sizes: Sequence[int],
        state_item_lens: Sequence[Sequence[int]],
        state_region_sizes: Sequence[Sequence[int]],
        state_dim_per_tensor: Sequence[Sequence[int]],
        state_layer_ids: Sequence[Sequence[int]],
        state_types: Sequence[str] | None = None,
    ) -> PeerLayout:
        """From sglang's registration fields plus each registered buffer's byte size."""
        kv = tuple(_region("kv", i, kv_item_len, s) for i, s in enumerate(kv_region_sizes))
        if len(aux_item_lens) != len(aux_region_sizes):
            raise PlanError(
                f"peer has {len(aux_region_sizes)} aux buffers but {len(aux_item_lens)} item lens"
            )
        aux = tuple(
            _region("aux", i, n, s)
            for i, (n, s) in enumerate(zip(aux_item_lens, aux_region_sizes, strict=True))
        )
        comps = []
        for ci, (lens, sizes) in enumerate(zip(state_item_lens, state_region_sizes, strict=False)):
            if len(lens) != len(sizes):
                raise PlanError(f"peer component {ci}: {len(sizes)} buffers but {len(lens)} item lens")
            regions = tuple(
                _region(f"state {ci}", ti, n, s) for ti, (n, s) in enumerate(zip(lens, sizes, strict=True))
            )
            comps.append(
                PeerComponent(
                    regions,
                    dims=tuple(_at(state_dim_per_tensor, ci)),
                    layer_ids=tuple(_at(state_layer_ids, ci)),
                    state_type=state_types[ci] if state_types and ci < len(state_types) else None,
                )
            )
        if len(state_item_lens) != len(state_region_sizes):
            raise PlanError(
                f"peer registered {len(state_region_sizes)} state components "
                f"but {len(state_item_lens)} item-len lists"
            )
        return cls(tp_size, tp_rank, kv, tuple(kv_layer_ids), aux, tuple(comps))


def _region(what: str, i: int, item_len: int, size: int) -> PeerRegion:
    if item_len <= 0 or size < 0 or size % item_len:
        raise PlanError(f"peer {what} buffer {i}: size {size} is not a multiple of item_len {item_len}")
    return PeerRegion(item_len, size // item_len)


def _at(lists: Sequence[Sequence[int]], i: int) -> Sequence[int]:
    return lists[i] if i < len(lists) else ()


@dataclass(frozen=True, init=False)
class RequestIndices:
    """One request's indices on both sides. ``None`` for a component means "nothing to send".

    Built once per request on the agent's hot path, so ``__init__`` fills the instance dict in one
    pass instead of the frozen dataclass's six ``object.__setattr__`` calls (half its cost, about
    a numpy call); the fields, equality, ``repr`` and immutability are the dataclass's."""

    src_kv: IndexArray
    dst_kv: IndexArray
    src_aux: int | None = None
    dst_aux: int | None = None
    src_state: Sequence[IndexArray | None] | None = None
    dst_state: Sequence[IndexArray | None] | None = None

    def __init__(
        self,
        src_kv: IndexArray,
        dst_kv: IndexArray,
        src_aux: int | None = None,
        dst_aux: int | None = None,
        src_state: Sequence[IndexArray | None] | None = None,
        dst_state: Sequence[IndexArray | None] | None = None,
    ) -> None:
        d = self.__dict__
        d["src_kv"] = src_kv
        d["dst_kv"] = dst_kv
        d["src_aux"] = src_aux
        d["dst_aux"] = dst_aux
        d["src_state"] = src_state
        d["dst_state"] = dst_state

    @classmethod
    def of(
        cls,
        src_kv: npt.ArrayLike,
        dst_kv: npt.ArrayLike,
        src_aux: int | None = None,
        dst_aux: int | None = None,
        src_state: Sequence[npt.ArrayLike | None] | None = None,
        dst_state: Sequence[npt.ArrayLike | None] | None = None,
    ) -> RequestIndices:
        """Convenience constructor from lists (tests, CLI)."""
        return cls(
            _as_index(src_kv),
            _as_index(dst_kv),
            src_aux,
            dst_aux,
            _as_indices(src_state),
            _as_indices(dst_state),
        )


def _as_index(values: npt.ArrayLike) -> IndexArray:
    arr = np.asarray(values)
    if arr.size == 0:
        return np.empty(0, dtype=np.int32)
    if arr.dtype.kind not in "iu":
        raise PlanError(f"indices must be integers, got dtype {arr.dtype}")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < np.iinfo(np.int32).min or hi > np.iinfo(np.int32).max:
        raise PlanError(f"index {lo if lo < 0 else hi} does not fit in int32")
    return np.ascontiguousarray(arr.ravel(), dtype=np.int32)


def _as_indices(values: Sequence[npt.ArrayLike | None] | None) -> list[IndexArray | None] | None:
    if values is None:
        return None
    return [None if v is None else _as_index(v) for v in values]
