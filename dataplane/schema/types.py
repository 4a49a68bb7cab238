"""Typed description of the memory one rank of one role holds: KV buffers, aux buffers and the
ordered state components. Pure data (msgspec Structs), validated on construction.

Every buffer is a *region*: a contiguous array of ``num_items`` items of ``item_len`` bytes. The
canonical region order — KV buffers, aux buffers, then each component's tensors in order — is the
order of sglang's descriptor lists on the wire, of the planner's region ids, and of the transports'
registrations.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from ..errors import SchemaError
from .registry import StateTypeInfo, canonical_state_type, state_type

Dtype = Literal["bfloat16", "float16", "float32", "float8_e4m3fn", "uint8", "int8"]
DTYPE_BYTES: dict[str, int] = {
    "bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1, "uint8": 1, "int8": 1,
}
KV_COMPONENT = -1
AUX_COMPONENT = -2


class TensorSpec(msgspec.Struct, frozen=True):
    """One tensor of a state component, as this rank holds it."""

    item_len: int
    """Bytes of one item (slot or page) of this tensor on this rank."""
    layer_id: int = 0
    tp_dim: int = 0
    """Size, on this rank, of the dimension TP splits (mamba only); 0 = replicated, not split."""
    outer_count: int = 1
    """Leading blocks outside the split dimension: an item is ``outer_count`` blocks of
    ``tp_dim`` rows each."""
    conv_shard_groups: tuple[int, ...] = ()
    """GDN conv state: the full (unsplit) sizes of the sub-blocks along the split dimension, each split
    by TP separately (sglang's ``conv_shard_groups``); empty for a plain split."""

    def __post_init__(self) -> None:
        if self.item_len <= 0:
            raise SchemaError(f"tensor item_len must be positive, got {self.item_len}")
        if self.tp_dim < 0 or self.outer_count <= 0:
            raise SchemaError(f"tensor tp_dim {self.tp_dim} / outer_count {self.outer_count} out of range")
        if self.tp_dim and self.item_len % (self.tp_dim * self.outer_count):
            raise SchemaError(
                f"tensor item_len {self.item_len} is not a multiple of tp_dim {self.tp_dim} "
                f"x outer_count {self.outer_count}"
            )


class Component(msgspec.Struct, frozen=True):
    """An ordered state component (mamba slot, swa pages, …) with its tensors."""

    name: str
    state_type: str
    """A registered state type; an older name (sglang's ``nsa``) is stored as the current one."""
    tensors: tuple[TensorSpec, ...]
    num_items: int
    """Slots or pages in each tensor's pool."""
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        state_type(self.state_type)
        msgspec.structs.force_setattr(self, "state_type", canonical_state_type(self.state_type))
        if not self.tensors:
            raise SchemaError(f"component {self.name!r} has no tensors")
        if self.num_items <= 0:
            raise SchemaError(f"component {self.name!r} num_items must be positive, got {self.num_items}")
        if self.dtype not in DTYPE_BYTES:
            raise SchemaError(f"component {self.name!r} has unknown dtype {self.dtype!r}")

    @property
    def info(self) -> StateTypeInfo:
        return state_type(self.state_type)


class KVSpec(msgspec.Struct, frozen=True):
    """The paged KV cache: one buffer per entry of ``layer_ids`` (K and V buffers count separately)."""

    item_len: int
    """Bytes of one page of one buffer on this rank."""
    num_pages: int
    layer_ids: tuple[int, ...]
    page_size: int = 64
    dtype: str = "bfloat16"
    layout: Literal["mha", "mla"] = "mha"

    def __post_init__(self) -> None:
        if self.item_len <= 0 or self.num_pages <= 0 or self.page_size <= 0:
            raise SchemaError("kv item_len, num_pages and page_size must be positive")
        if self.dtype not in DTYPE_BYTES:
            raise SchemaError(f"kv has unknown dtype {self.dtype!r}")


class AuxSpec(msgspec.Struct, frozen=True):
    """Per-request auxiliary buffers (first output token, logprobs): one slot per request."""

    item_lens: tuple[int, ...] = (64,)
    num_items: int = 256


class Region(msgspec.Struct, frozen=True):
    """One registered buffer, in canonical order. ``component`` is an index into the schema's
    components, or ``KV_COMPONENT`` / ``AUX_COMPONENT``."""

    name: str
    component: int
    tensor: int
    item_len: int
    num_items: int

    @property
    def size(self) -> int:
        return self.item_len * self.num_items


class RoleSchema(msgspec.Struct, frozen=True):
    """Everything one rank of one role registers and sends."""

    model: str
    tp_size: int
    tp_rank: int
    kv: KVSpec
    components: tuple[Component, ...] = ()
    aux: AuxSpec = AuxSpec()

    def __post_init__(self) -> None:
        if self.tp_size <= 0 or self.tp_size & (self.tp_size - 1):
            raise SchemaError(f"tp_size must be a positive power of two, got {self.tp_size}")
        if not 0 <= self.tp_rank < self.tp_size:
            raise SchemaError(f"tp_rank {self.tp_rank} out of range for tp_size {self.tp_size}")
        names = [c.name for c in self.components]
        if len(set(names)) != len(names):
            raise SchemaError(f"component names must be unique, got {names}")

    def regions(self) -> tuple[Region, ...]:
        """All buffers in canonical (wire) order."""
        out = [
            Region(f"kv/{i}", KV_COMPONENT, i, self.kv.item_len, self.kv.num_pages)
            for i in range(len(self.kv.layer_ids))
        ]
        out += [
            Region(f"aux/{i}", AUX_COMPONENT, i, n, self.aux.num_items)
            for i, n in enumerate(self.aux.item_lens)
        ]
        for ci, comp in enumerate(self.components):
            out += [
                Region(f"{comp.name}/{ti}", ci, ti, t.item_len, comp.num_items)
                for ti, t in enumerate(comp.tensors)
            ]
        return tuple(out)

    def region_base(self, component: int) -> int:
        """Index of the first region of ``component`` (KV_COMPONENT, AUX_COMPONENT or an index)."""
        n_kv, n_aux = len(self.kv.layer_ids), len(self.aux.item_lens)
        if component == KV_COMPONENT:
            return 0
        if component == AUX_COMPONENT:
            return n_kv
        return n_kv + n_aux + sum(len(c.tensors) for c in self.components[:component])

    # sglang's parallel per-component lists, as the registration message carries them.
    @property
    def state_types(self) -> list[str]:
        return [c.state_type for c in self.components]

    @property
    def state_item_lens(self) -> list[list[int]]:
        return [[t.item_len for t in c.tensors] for c in self.components]

    @property
    def state_dim_per_tensor(self) -> list[list[int]]:
        return [[t.tp_dim for t in c.tensors] if c.info.tp_sliceable else [] for c in self.components]

    @property
    def state_layer_ids(self) -> list[list[int]]:
        return [[t.layer_id for t in c.tensors] for c in self.components]
