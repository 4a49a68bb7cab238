"""sglang's ``KVArgs`` as PDPair's schema: the pools an sglang rank registers, at their real size.

sglang describes its memory as parallel lists (``kv_data_ptrs``/``lens``/``item_lens``,
``aux_*``, and per state component ``state_types``, ``state_data_ptrs``, ``state_item_lens``,
``state_layer_ids``, ``state_dim_per_tensor``, ``state_slice_outer_counts``,
``state_conv_shard_groups``). ``layout_from_kvargs`` turns them into a ``RoleSchema`` whose canonical
region order is sglang's own descriptor order, plus the (pointer, bytes) of every region in that order,
which ``memory`` shares with the agent. Anything PDPair's schema cannot carry is refused here with one
line naming it, so an engine fails at start-up, never mid-request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import BadInput, SchemaError
from ..schema import AuxSpec, Component, KVSpec, RoleSchema, TensorSpec, sglang_state_type

KV_DTYPES = {
    "auto": "bfloat16", "bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16",
    "fp16": "float16", "half": "float16", "float32": "float32", "fp8_e4m3": "float8_e4m3fn",
    "float8_e4m3fn": "float8_e4m3fn",
}
"""sglang's ``kv_cache_dtype_str`` → the manifest's dtype; any other (fp8_e5m2, fp4, …) is carried as
opaque ``uint8`` bytes: both roles of one deployment name the same setting either way."""


class Unsupported(BadInput):
    """sglang asked for something the pdpair backend does not carry (one line: what, and the fix)."""


@dataclass(frozen=True)
class Layout:
    schema: RoleSchema
    buffers: tuple[tuple[int, int], ...]
    """(pointer, registered bytes) of every region of ``schema.regions()``, in that order."""


def layout_from_kvargs(
    kv_args: Any, *, model: str, tp_size: int, tp_rank: int, is_mla: bool
) -> Layout:
    """The schema and region pointers of one sglang rank (``tp_size``/``tp_rank``: attention TP)."""
    if getattr(kv_args, "mla_compression_ratios", None):
        raise Unsupported("pdpair: compressed-MLA pools (DeepSeek-V4) are not supported; use another backend")
    try:
        kv, kv_bufs = _kv(kv_args, is_mla)
        aux, aux_bufs = _aux(kv_args)
        comps, comp_bufs = _components(kv_args)
        schema = RoleSchema(model[:256] or "sglang", tp_size, tp_rank, kv, comps, aux)
    except SchemaError as exc:
        raise Unsupported(f"pdpair: sglang's KV pools do not fit PDPair's schema: {exc}") from None
    return Layout(schema, tuple(kv_bufs + aux_bufs + comp_bufs))


def _items(what: str, lens: Sequence[int], item_lens: Sequence[int]) -> int:
    """The common item count of parallel buffers (each ``len // item_len``)."""
    if len(lens) != len(item_lens) or not lens:
        raise Unsupported(f"pdpair: {what}: {len(lens)} buffers but {len(item_lens)} item lengths")
    counts = {int(n) // int(i) for n, i in zip(lens, item_lens, strict=True) if int(i) > 0}
    if len(counts) != 1 or min(int(i) for i in item_lens) <= 0:
        raise Unsupported(f"pdpair: {what}: buffers hold different item counts {sorted(counts)}")
    return counts.pop()


def _kv(kv_args: Any, is_mla: bool) -> tuple[KVSpec, list[tuple[int, int]]]:
    ptrs, lens, item_lens = kv_args.kv_data_ptrs, kv_args.kv_data_lens, kv_args.kv_item_lens
    if len(set(item_lens)) != 1:
        raise Unsupported(
            f"pdpair: KV buffers of different page sizes {sorted(set(item_lens))} (a draft model's KV "
            "beside the target's, say) are not supported; run without speculative decoding"
        )
    pages = _items("kv", lens, item_lens)
    layer_ids = tuple(int(i) for i in kv_args.kv_layer_ids) or _positional(kv_args, len(ptrs), is_mla)
    if len(layer_ids) != len(ptrs):
        raise Unsupported(f"pdpair: {len(ptrs)} KV buffers but {len(layer_ids)} kv_layer_ids")
    dtype = KV_DTYPES.get(str(kv_args.kv_cache_dtype_str), "uint8")
    page = int(kv_args.page_size)
    spec = KVSpec(int(item_lens[0]), pages, layer_ids, page, dtype, "mla" if is_mla else "mha")
    return spec, [(int(p), spec.item_len * pages) for p in ptrs]


def _positional(kv_args: Any, buffers: int, is_mla: bool) -> tuple[int, ...]:
    """sglang's ``build_kv_layer_ids`` returns ``[]`` for pools that pair positionally (every pool but the
    hybrid ones): K per layer then V per layer (MHA), one buffer per layer (MLA), from the first layer
    this rank transfers."""
    groups = 1 if is_mla else 2
    if buffers % groups:
        raise Unsupported(f"pdpair: {buffers} MHA KV buffers are not K and V per layer")
    start = int(getattr(kv_args, "prefill_start_layer", 0) or 0)
    return tuple(start + i for i in range(buffers // groups)) * groups


def _aux(kv_args: Any) -> tuple[AuxSpec, list[tuple[int, int]]]:
    lens, item_lens = kv_args.aux_data_lens, kv_args.aux_item_lens
    n = _items("aux", lens, item_lens)
    spec = AuxSpec(tuple(int(i) for i in item_lens), n)
    return spec, [(int(p), int(i) * n) for p, i in zip(kv_args.aux_data_ptrs, item_lens, strict=True)]


def _components(kv_args: Any) -> tuple[tuple[Component, ...], list[tuple[int, int]]]:
    comps: list[Component] = []
    bufs: list[tuple[int, int]] = []
    seen: dict[str, int] = {}
    for ci, raw in enumerate(kv_args.state_types):
        st = sglang_state_type(_name(raw)).name
        ptrs, lens, item_lens = (kv_args.state_data_ptrs[ci], kv_args.state_data_lens[ci],
                                 kv_args.state_item_lens[ci])
        n = _items(f"state component {ci} ({st})", lens, item_lens)
        tensors = tuple(_tensor(kv_args, ci, ti, int(item_len)) for ti, item_len in enumerate(item_lens))
        seen[st] = seen.get(st, 0) + 1
        name = st if seen[st] == 1 else f"{st}{seen[st]}"
        comps.append(Component(name, st, tensors, n, "uint8"))
        bufs += [(int(p), int(i) * n) for p, i in zip(ptrs, item_lens, strict=True)]
    return tuple(comps), bufs


def _tensor(kv_args: Any, ci: int, ti: int, item_len: int) -> TensorSpec:
    def at(table: str) -> Any:
        rows = getattr(kv_args, table, None) or []
        row = rows[ci] if ci < len(rows) else None
        return row[ti] if row and ti < len(row) else None

    groups = at("state_conv_shard_groups")
    return TensorSpec(
        item_len,
        layer_id=int(at("state_layer_ids") or 0),
        tp_dim=int(at("state_dim_per_tensor") or 0),
        outer_count=int(at("state_slice_outer_counts") or 1),
        conv_shard_groups=tuple(int(g) for g in groups) if groups else (),
    )


def _name(state_type: Any) -> str:
    """A ``StateType`` member or its plain value."""
    return str(getattr(state_type, "value", state_type))
