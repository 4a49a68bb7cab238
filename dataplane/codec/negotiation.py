"""Negotiation: can this prefill manifest be paired with that decode manifest?

``incompatibilities`` lists every reason, in a human-readable sentence each; ``check_compatible`` raises
``IncompatiblePeer`` with all of them joined. Rules (DESIGN §3):

- roles, model, page size, KV dtype/layout/buffer count must match; generations must match when both
  sides set one (an empty generation means "not pinned");
- KV item lengths must match when attention-TP sizes match or the layout is MLA (replicated); with MHA
  and different TP sizes one per-rank page must be a whole multiple of the other (head slicing);
- components are paired by position: same count, names, state types, dtypes and tensor counts;
- TP-sliceable types (mamba): with equal TP sizes item lengths must be equal; with different TP sizes a
  split tensor's item length and TP dimension must scale inversely with the TP size (same full size),
  and a replicated tensor (tp dim 0) must be equal;
- non-MLA ``swa`` with mismatched TP is rejected; other types need equal item lengths;
- unknown state types are a reason, never a crash.
"""

from __future__ import annotations

from ..errors import IncompatiblePeer, UnknownStateType
from ..schema import state_type
from .manifest import ComponentSummary, Manifest


def check_compatible(prefill: Manifest, decode: Manifest) -> None:
    """Raise ``IncompatiblePeer`` naming every mismatch; return None when the pair can transfer."""
    reasons = incompatibilities(prefill, decode)
    if reasons:
        raise IncompatiblePeer("; ".join(reasons))


def incompatibilities(prefill: Manifest, decode: Manifest) -> list[str]:
    reasons: list[str] = []
    if prefill.role != "prefill" or decode.role != "decode":
        reasons.append(f"expected a prefill and a decode manifest, got {prefill.role} and {decode.role}")
    if prefill.generation and decode.generation and prefill.generation != decode.generation:
        reasons.append(f"prefill generation {prefill.generation} ≠ decode generation {decode.generation}")
    for what, p, d in (
        ("model", prefill.model, decode.model),
        ("page size", prefill.page_size, decode.page_size),
        ("kv dtype", prefill.kv.dtype, decode.kv.dtype),
        ("kv layout", prefill.kv.layout, decode.kv.layout),
        ("kv buffer count", prefill.kv.num_layers, decode.kv.num_layers),
    ):
        if p != d:
            reasons.append(f"{what} {p} on prefill vs {d} on decode")
    reasons += _kv_item_len(prefill, decode)
    reasons += _components(prefill, decode)
    return reasons


def _kv_item_len(prefill: Manifest, decode: Manifest) -> list[str]:
    p, d = prefill.kv.item_len, decode.kv.item_len
    if prefill.tp_size == decode.tp_size or prefill.kv.layout == "mla":
        if p != d:
            why = "equal TP sizes" if prefill.tp_size == decode.tp_size else "an MLA (replicated) KV cache"
            return [f"kv item length {p} on prefill vs {d} on decode with {why}"]
        return []
    if max(p, d) % min(p, d):
        return [
            f"kv item length {p} on prefill (TP {prefill.tp_size}) and {d} on decode (TP {decode.tp_size}) "
            "cannot be head-sliced: neither is a multiple of the other"
        ]
    return []


def _components(prefill: Manifest, decode: Manifest) -> list[str]:
    reasons: list[str] = []
    pc, dc = prefill.components, decode.components
    if len(pc) != len(dc):
        longer, side, other = (pc, "prefill", "decode") if len(pc) > len(dc) else (dc, "decode", "prefill")
        common = min(len(pc), len(dc))
        missing = ", ".join(f"{i} `{c.name}` ({c.state_type})" for i, c in enumerate(longer) if i >= common)
        reasons.append(
            f"{side} declares {len(longer)} components but {other} {common}; "
            f"{other} lacks component {missing}"
        )
    for i, (p, d) in enumerate(zip(pc, dc, strict=False)):
        reasons += _component(i, p, d, prefill, decode)
    return reasons


def _component(
    i: int, p: ComponentSummary, d: ComponentSummary, prefill: Manifest, decode: Manifest
) -> list[str]:
    for side, c in (("prefill", p), ("decode", d)):
        try:
            state_type(c.state_type)
        except UnknownStateType:
            return [f"component {i} has unknown state type `{c.state_type}` on {side}"]
    if p.state_type != d.state_type:
        return [f"component {i} is `{p.state_type}` on prefill but `{d.state_type}` on decode"]
    reasons = []
    if p.name != d.name:
        reasons.append(f"component {i} is named `{p.name}` on prefill but `{d.name}` on decode")
    if p.dtype != d.dtype:
        reasons.append(f"component {i} (`{p.name}`) dtype {p.dtype} on prefill vs {d.dtype} on decode")
    if len(p.item_lens) != len(d.item_lens):
        reasons.append(
            f"component {i} (`{p.name}`) has {len(p.item_lens)} tensors on prefill "
            f"but {len(d.item_lens)} on decode"
        )
        return reasons
    return reasons + _item_lens(i, p, d, prefill, decode)


def _item_lens(
    i: int, p: ComponentSummary, d: ComponentSummary, prefill: Manifest, decode: Manifest
) -> list[str]:
    ptp, dtp = prefill.tp_size, decode.tp_size
    info = state_type(p.state_type)
    label = f"component {i} (`{p.name}`)"
    if ptp != dtp and p.state_type == "swa" and prefill.kv.layout != "mla":
        return [f"{label}: non-MLA swa with mismatched TP (prefill {ptp}, decode {dtp}) is not supported"]
    reasons = []
    tensors = zip(p.item_lens, d.item_lens, p.tp_dims, d.tp_dims, strict=True)
    for t, (pl, dl, pdim, ddim) in enumerate(tensors):
        where = f"{label} tensor {t}"
        if ptp == dtp or not info.tp_sliceable:
            if pl != dl:
                cond = (
                    f"equal TP sizes ({ptp})"
                    if ptp == dtp
                    else f"TP {ptp} vs {dtp} ({p.state_type} is not TP-sliced)"
                )
                reasons.append(f"{where}: {p.state_type} item length {pl} vs {dl} with {cond}")
        elif bool(pdim) != bool(ddim):
            reasons.append(f"{where}: split on one side (tp dim {pdim}) but replicated on the other ({ddim})")
        elif not pdim and pl != dl:
            reasons.append(f"{where}: replicated {p.state_type} item length {pl} vs {dl}")
        elif pdim and (pl * ptp != dl * dtp or pdim * ptp != ddim * dtp):
            reasons.append(
                f"{where}: {p.state_type} item length {pl} / tp dim {pdim} on prefill (TP {ptp}) "
                f"does not scale to {dl} / {ddim} on decode (TP {dtp})"
            )
    return reasons
