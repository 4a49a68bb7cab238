"""The schema an engine brings: its ``Hello`` manifest and ``RegisterPools`` regions → a ``RoleSchema``.

An agent whose config names no model layout (``model.profile: null`` and no ``model.kvItemLen``)
adopts the engine's: the manifest says what each buffer holds (item lengths, TP dimensions, layer
ids, state types), the regions say how many items each pool has (its size over its item length).
Both are the engine's word, so both are hostile input here: counts are bounded, every number is
checked for what the schema needs, and each region must hold a whole number of items of the length
the manifest gives. A problem is one ``LocalApiError`` naming it (``incompatible`` or ``bad_request``).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..codec.manifest import ComponentSummary, Manifest
from ..errors import LocalApiError, SchemaError, UnknownStateType
from ..schema import KV_COMPONENT, AuxSpec, Component, KVSpec, RoleSchema, TensorSpec
from .messages import MAX_COMPONENTS, PoolRegion

MAX_TENSORS = 4096
"""Buffers per component (and KV buffers) an engine may declare: 2 x 2048 layers."""
MAX_AUX = 64
MAX_ITEM_BYTES = 1 << 40
MAX_ITEMS = 1 << 32


def _bad(message: str) -> LocalApiError:
    return LocalApiError("bad_request", f"engine manifest: {message}")


def check_manifest_bounds(m: Manifest) -> None:
    """Counts and sizes a schema can hold, before anything is built from them."""
    if len(m.components) > MAX_COMPONENTS:
        raise _bad(f"{len(m.components)} components, at most {MAX_COMPONENTS}")
    if not 0 < m.kv.num_layers <= MAX_TENSORS:
        raise _bad(f"{m.kv.num_layers} KV buffers, need 1..{MAX_TENSORS}")
    if len(m.aux_item_lens) > MAX_AUX:
        raise _bad(f"{len(m.aux_item_lens)} aux buffers, at most {MAX_AUX}")
    lens = [m.kv.item_len, *m.aux_item_lens]
    for c in m.components:
        if len(c.item_lens) > MAX_TENSORS:
            raise _bad(f"component `{c.name}` has {len(c.item_lens)} tensors, at most {MAX_TENSORS}")
        if c.num_items > MAX_ITEMS:
            raise _bad(f"component `{c.name}` has {c.num_items} items, at most {MAX_ITEMS}")
        lens += c.item_lens
    if max(lens) > MAX_ITEM_BYTES:
        raise _bad(f"an item of {max(lens)} bytes, at most {MAX_ITEM_BYTES}")
    if m.aux_num_items > MAX_ITEMS:
        raise _bad(f"{m.aux_num_items} aux items, at most {MAX_ITEMS}")


def schema_from_engine(m: Manifest, regions: Sequence[PoolRegion]) -> RoleSchema:
    """The schema the engine's manifest and regions describe (call ``check_manifest_bounds`` first)."""
    if not m.aux_item_lens or not m.aux_num_items:
        raise _bad("no aux buffers described (aux_item_lens / aux_num_items): the agent names no model "
                   "layout, so the engine's manifest must describe every buffer")
    kv_pages = _items(regions, KV_COMPONENT, m.kv.item_len, "kv")
    try:
        kv = KVSpec(
            m.kv.item_len, kv_pages, tuple(m.kv.layer_ids) or tuple(range(m.kv.num_layers)),
            m.page_size, m.kv.dtype, m.kv.layout,
        )
        comps = tuple(_component(c) for c in m.components)
        return RoleSchema(
            m.model, m.tp_size, m.tp_rank, kv, comps, AuxSpec(tuple(m.aux_item_lens), m.aux_num_items)
        )
    except (SchemaError, UnknownStateType) as exc:
        raise LocalApiError("incompatible", f"engine manifest: {exc}") from None


def _component(c: ComponentSummary) -> Component:
    n = len(c.item_lens)
    ids = c.layer_ids or tuple(range(n))
    outer = c.outer_counts or (1,) * n
    groups = c.conv_shard_groups or ((),) * n
    tensors = tuple(
        TensorSpec(length, lid, tp_dim=dim, outer_count=o, conv_shard_groups=tuple(g))
        for length, lid, dim, o, g in zip(c.item_lens, ids, c.tp_dims, outer, groups, strict=True)
    )
    return Component(c.name, c.state_type, tensors, c.num_items, c.dtype)


def _items(regions: Sequence[PoolRegion], component: int, item_len: int, what: str) -> int:
    """Items in the first region of ``component``: its size over ``item_len``, which must divide it."""
    first = next((r for r in regions if r.component == component), None)
    if first is None:
        raise LocalApiError("incompatible", f"engine registered no {what} region")
    if not first.size or first.size % item_len:
        raise LocalApiError(
            "incompatible",
            f"{first.name}: {first.size} bytes is not a whole number of {item_len}-byte items",
        )
    items = first.size // item_len
    if items > MAX_ITEMS:
        raise _bad(f"{first.name}: {items} items, at most {MAX_ITEMS}")
    return items


__all__ = ["MAX_TENSORS", "check_manifest_bounds", "schema_from_engine"]
