"""Per-peer preparation: which local buffer writes to which remote buffer, and which byte blocks of an
item move. Computed once per (local schema, peer layout) pair, so each request only multiplies indices.

KV buffers and state tensors are paired by layer id (k-th occurrence with k-th occurrence, since K and
V, or conv and temporal state, share a layer id), as sglang's ``build_transfer_entry_pairs`` does;
positionally when the peer sent no layer ids. Item-length and TP checks that do not depend on a request
happen here, with messages naming the component, tensor and layer. A decode rank slices by its rank in
the attention-TP group (``PeerLayout.attn_tp_rank``): with DP attention sglang registers its engine rank,
at or above the attention-TP size, and uses it modulo that size.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from ..errors import PlanError
from ..schema import AUX_COMPONENT, KV_COMPONENT, Component, RoleSchema, SendRule
from .layout import PeerComponent, PeerLayout
from .shape import CommonShape
from .slicing import Block, slice_byte_blocks
from .tables import GroupTable, Tables

__all__ = ["Pairing", "TensorGroup", "pair_entries"]

_MAX_REGION = 1 << 62
"""Regions at most this large keep every ``offset + size`` inside int64."""
I64 = npt.NDArray[np.int64]


def pair_entries(
    src_ids: Sequence[int], dst_ids: Sequence[int], n_dst: int, what: str
) -> list[tuple[int, int]]:
    """Pair local entries with the peer's by layer id occurrence, or by position without ids."""
    if not dst_ids:
        if n_dst != len(src_ids):
            raise PlanError(f"{what}: {len(src_ids)} local buffers but {n_dst} on the peer, and no layer ids")
        return [(i, i) for i in range(n_dst)]
    free: dict[int, deque[int]] = defaultdict(deque)
    for j, lid in enumerate(dst_ids):
        free[lid].append(j)
    pairs = []
    for i, lid in enumerate(src_ids):
        if not free[lid]:
            raise PlanError(f"{what}: the peer has no (further) buffer for layer {lid} (local buffer {i})")
        pairs.append((i, free[lid].popleft()))
    return pairs


@dataclass(frozen=True, eq=False)
class TensorGroup:
    """The paired buffers of KV, aux or one component, and the blocks of an item each pair moves.

    Every block lies inside its item on both sides (checked here, once), and the limits are the
    smallest item counts of the paired regions, so a request whose indices pass ``0 <= i < limit``
    can only produce writes inside both registered regions.

    ``whole`` groups move whole items (so contiguous runs coalesce); others move ``block_*`` byte blocks
    of each item (TP slicing), one write per block per item. A block that recurs at a fixed stride
    within the item (a head slice per token) is kept once, with its ``block_count`` per item.
    """

    name: str
    component: int
    rule: SendRule
    local_region: npt.NDArray[np.int32]
    remote_region: npt.NDArray[np.int32]
    local_item: I64
    remote_item: I64
    local_limit: int
    remote_limit: int
    whole: bool
    block_tensor: npt.NDArray[np.intp]
    block_src: I64
    block_dst: I64
    block_size: I64
    block_local_region: npt.NDArray[np.int32]
    block_remote_region: npt.NDArray[np.int32]
    block_local_item: I64
    block_remote_item: I64
    block_count: I64
    table: GroupTable = field(init=False, repr=False)

    def __post_init__(self) -> None:
        table = GroupTable.build(
            (self.block_local_region, self.block_remote_region),
            (self.block_local_item, self.block_remote_item),
            (self.block_src, self.block_dst),
            self.block_size,
            self.component,
            self.whole,
            self.block_count,
        )
        object.__setattr__(self, "table", table)

    @classmethod
    def build(
        cls,
        name: str,
        component: int,
        rule: SendRule,
        regions: tuple[Sequence[int], Sequence[int]],
        items: tuple[Sequence[int], Sequence[int]],
        limits: tuple[int, int],
        blocks: Sequence[list[Block]],
    ) -> TensorGroup:
        whole = all(b == [(0, 0, li)] and li == ri for b, li, ri in zip(blocks, *items, strict=True))
        flat = [(t, *blk) for t, bs in enumerate(blocks) for blk in bs]
        t, b_src, b_dst, b_size = np.array(flat, dtype=np.int64).reshape(-1, 4).T
        t = t.astype(np.intp)
        l_reg, r_reg = np.asarray(regions[0], np.int32), np.asarray(regions[1], np.int32)
        l_item, r_item = np.asarray(items[0], np.int64), np.asarray(items[1], np.int64)
        outside = (b_src < 0) | (b_dst < 0) | (b_size <= 0)
        outside |= (b_src + b_size > l_item[t]) | (b_dst + b_size > r_item[t])
        if outside.any():
            k = int(np.argmax(outside))
            raise PlanError(
                f"{name}: block {flat[k][1:]} of tensor {int(t[k])} leaves its item "
                f"({int(l_item[t[k]])} bytes on prefill, {int(r_item[t[k]])} on decode)"
            )
        strided = [
            (bs, 1) if whole else _strided(bs, li, ri) for bs, li, ri in zip(blocks, *items, strict=True)
        ]
        kept = [(k, *blk, c) for k, (bs, c) in enumerate(strided) for blk in bs]
        t, b_src, b_dst, b_size, b_count = np.array(kept, dtype=np.int64).reshape(-1, 5).T
        t = t.astype(np.intp)
        return cls(
            name,
            component,
            rule,
            l_reg,
            r_reg,
            l_item,
            r_item,
            limits[0],
            limits[1],
            whole,
            t,
            b_src.copy(),
            b_dst.copy(),
            b_size.copy(),
            l_reg[t],
            r_reg[t],
            l_item[t],
            r_item[t],
            b_count.copy(),
        )

    def __len__(self) -> int:
        return len(self.local_region)


def _strided(blocks: list[Block], local_item: int, remote_item: int) -> tuple[list[Block], int]:
    """``blocks`` as their fewest leading blocks and how many times those recur per item, each time
    an item over the count further on each side (``(blocks, 1)`` when they do not recur): a head
    slice of each of a page's tokens is one block recurring once per token."""
    m = len(blocks)
    for lead in range(1, m // 2 + 1):
        count = m // lead
        if m % lead or local_item % count or remote_item % count:
            continue
        ls, rs = local_item // count, remote_item // count
        if all(
            blocks[k]
            == (
                blocks[k % lead][0] + k // lead * ls,
                blocks[k % lead][1] + k // lead * rs,
                blocks[k % lead][2],
            )
            for k in range(m)
        ):
            return blocks[:lead], count
    return blocks, 1


def _equal_items(what: str, local: int, remote: int, tp: str) -> list[Block]:
    if local != remote:
        raise PlanError(f"{what}: item length {local} bytes on prefill but {remote} on decode ({tp})")
    return [(0, 0, local)]


@dataclass(frozen=True, eq=False)
class Pairing:
    """Everything request-independent about planning from ``local`` to ``peer``."""

    local: RoleSchema
    peer: PeerLayout
    kv: TensorGroup
    aux: TensorGroup
    components: tuple[TensorGroup, ...]
    local_sizes: I64
    remote_sizes: I64
    tables: Tables = field(init=False, repr=False)
    """Every group's table in canonical order: KV, aux, then the components."""
    common: CommonShape | None = field(init=False, repr=False)
    """The one-pass tables for the common request shape, when this pairing can take it."""

    def __post_init__(self) -> None:
        groups = (self.kv, self.aux, *self.components)
        tables = Tables.build([g.table for g in groups])
        object.__setattr__(self, "tables", tables)
        object.__setattr__(self, "common", CommonShape.build(self.kv, groups[1:], tables))

    @classmethod
    def build(cls, local: RoleSchema, peer: PeerLayout) -> Pairing:
        if len(local.components) != len(peer.components):
            raise PlanError(
                f"component count mismatch: prefill declares {len(local.components)} "
                f"({', '.join(local.state_types) or 'none'}), decode registered {len(peer.components)}"
            )
        sizes = _region_sizes("prefill", [r.size for r in local.regions()])
        remote = _region_sizes("decode", [r.size for r in peer.regions()])
        comps = tuple(_component_group(local, peer, ci) for ci in range(len(local.components)))
        return cls(local, peer, _kv_group(local, peer), _aux_group(local, peer), comps, sizes, remote)


def _tp_label(local: RoleSchema, peer: PeerLayout) -> str:
    if local.tp_size == peer.tp_size:
        return f"equal TP {local.tp_size}"
    return f"prefill TP {local.tp_size}, decode TP {peer.tp_size}"


def _region_sizes(side: str, sizes: list[int]) -> I64:
    for i, size in enumerate(sizes):
        if size >= _MAX_REGION:
            raise PlanError(f"{side} region {i} is {size} bytes, larger than the 2**62 the planner accepts")
    return np.array(sizes, dtype=np.int64)


def _kv_group(local: RoleSchema, peer: PeerLayout) -> TensorGroup:
    kv, tp = local.kv, _tp_label(local, peer)
    pairs = pair_entries(kv.layer_ids, peer.kv_layer_ids, len(peer.kv), "kv")
    blocks = []
    for i, j in pairs:
        what, remote_len = f"kv buffer {i} (layer {kv.layer_ids[i]})", peer.kv[j].item_len
        if local.tp_size == peer.tp_size or kv.layout == "mla":
            blocks.append(_equal_items(what, kv.item_len, remote_len, tp))
        else:
            if kv.item_len % kv.page_size or remote_len % kv.page_size:
                raise PlanError(
                    f"{what}: item lengths {kv.item_len}/{remote_len} not divisible by page {kv.page_size}"
                )
            blocks.append(
                _sliced(
                    what,
                    local,
                    peer,
                    kv.item_len,
                    remote_len,
                    kv.item_len // kv.page_size,
                    remote_len // kv.page_size,
                    kv.page_size,
                    None,
                )
            )
    return TensorGroup.build(
        "kv",
        KV_COMPONENT,
        SendRule.PAGED,
        ([i for i, _ in pairs], [j for _, j in pairs]),
        ([kv.item_len] * len(pairs), [peer.kv[j].item_len for _, j in pairs]),
        (kv.num_pages, min((peer.kv[j].num_items for _, j in pairs), default=0)),
        blocks,
    )


def _sliced(
    what: str,
    local: RoleSchema,
    peer: PeerLayout,
    src_len: int,
    dst_len: int,
    src_dim: int,
    dst_dim: int,
    outer: int,
    groups: Sequence[int] | None,
) -> list[Block]:
    try:
        return slice_byte_blocks(
            src_item_len=src_len,
            dst_item_len=dst_len,
            src_dim=src_dim,
            dst_dim=dst_dim,
            outer_count=outer,
            src_tp=local.tp_size,
            dst_tp=peer.tp_size,
            dst_rank=peer.attn_tp_rank,
            local_rank=local.tp_rank,
            conv_shard_groups=groups,
        )
    except PlanError as exc:
        raise PlanError(f"{what}: {exc}") from None


def _aux_group(local: RoleSchema, peer: PeerLayout) -> TensorGroup:
    n = len(local.aux.item_lens)
    if len(peer.aux) < n:
        raise PlanError(f"aux: prefill has {n} aux buffers, decode registered {len(peer.aux)}")
    blocks = [
        _equal_items(f"aux buffer {i}", ln, peer.aux[i].item_len, "aux")
        for i, ln in enumerate(local.aux.item_lens)
    ]
    base_l, base_r = local.region_base(AUX_COMPONENT), peer.region_base(AUX_COMPONENT)
    return TensorGroup.build(
        "aux",
        AUX_COMPONENT,
        SendRule.SLOT,
        ([base_l + i for i in range(n)], [base_r + i for i in range(n)]),
        (list(local.aux.item_lens), [peer.aux[i].item_len for i in range(n)]),
        (local.aux.num_items, min((peer.aux[i].num_items for i in range(n)), default=0)),
        blocks,
    )


def _component_group(local: RoleSchema, peer: PeerLayout, ci: int) -> TensorGroup:
    comp, pc = local.components[ci], peer.components[ci]
    label = f"component {ci} {comp.name!r} ({comp.state_type})"
    if pc.state_type is not None and pc.state_type != comp.state_type:
        raise PlanError(f"{label}: decode declares state type {pc.state_type!r} at this position")
    pairs = pair_entries([t.layer_id for t in comp.tensors], pc.layer_ids, len(pc.regions), label)
    blocks = [_tensor_blocks(local, peer, comp, pc, i, j, label) for i, j in pairs]
    base_l, base_r = local.region_base(ci), peer.region_base(ci)
    return TensorGroup.build(
        comp.name,
        ci,
        comp.info.rule,
        ([base_l + i for i, _ in pairs], [base_r + j for _, j in pairs]),
        ([comp.tensors[i].item_len for i, _ in pairs], [pc.regions[j].item_len for _, j in pairs]),
        (comp.num_items, min((pc.regions[j].num_items for _, j in pairs), default=0)),
        blocks,
    )


def _tensor_blocks(
    local: RoleSchema, peer: PeerLayout, comp: Component, pc: PeerComponent, i: int, j: int, label: str
) -> list[Block]:
    t, remote_len = comp.tensors[i], pc.regions[j].item_len
    what, tp = (
        f"{label} tensor {i} (layer {t.layer_id})",
        f"prefill TP {local.tp_size}, decode TP {peer.tp_size}",
    )
    if local.tp_size == peer.tp_size:
        return _equal_items(what, t.item_len, remote_len, f"equal TP {local.tp_size}")
    if comp.info.tp_sliceable and pc.dims:
        if j >= len(pc.dims):
            raise PlanError(f"{what}: decode sent {len(pc.dims)} TP dims for {len(pc.regions)} tensors")
        return _sliced(
            what,
            local,
            peer,
            t.item_len,
            remote_len,
            t.tp_dim,
            pc.dims[j],
            t.outer_count,
            t.conv_shard_groups or None,
        )
    if not comp.info.tp_sliceable and local.kv.layout == "mha":
        raise PlanError(
            f"{what}: {comp.state_type} state cannot move between different TP sizes ({tp}) with MHA KV"
        )
    return _equal_items(what, t.item_len, remote_len, tp)
