"""TP slicing of one item (a mamba slot, a KV token row) between different attention-TP sizes.

Semantics of sglang 0.5.23's ``compute_mamba_state_slice_byte_blocks``: each rank holds ``dim`` rows of
the split dimension (``outer_count`` leading blocks of them per item).

- Scatter (decode TP > prefill TP): this prefill rank holds several decode ranks' rows; it writes the
  decode rank's share of each block.
- Aggregation (prefill TP > decode TP): several prefill ranks write their rows side by side into one
  decode item.
- GDN conv state (``conv_shard_groups``: q, k, v sub-blocks, each split by TP on its own): one block
  per sub-block, so channels land in ``[q0 q1 … | k0 k1 … | v0 v1 …]`` order.
- Replicated tensors (dim 0): the whole item, written by one elected prefill rank per decode rank.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import PlanError

__all__ = ["should_send_replicated", "slice_byte_blocks", "target_ranks"]

Block = tuple[int, int, int]


def _check_tp(src_tp: int, dst_tp: int, local_rank: int) -> None:
    if src_tp <= 0 or dst_tp <= 0:
        raise PlanError(f"attention TP sizes must be positive, got prefill {src_tp}, decode {dst_tp}")
    if max(src_tp, dst_tp) % min(src_tp, dst_tp):
        raise PlanError(f"one TP size must divide the other: prefill {src_tp}, decode {dst_tp}")
    if not 0 <= local_rank < src_tp:
        raise PlanError(f"prefill TP rank {local_rank} out of range for TP size {src_tp}")


def target_ranks(src_tp: int, dst_tp: int, src_rank: int) -> range:
    """The decode ranks prefill rank ``src_rank`` writes its split state to."""
    _check_tp(src_tp, dst_tp, src_rank)
    if dst_tp >= src_tp:
        fan = dst_tp // src_tp
        return range(src_rank * fan, (src_rank + 1) * fan)
    return range(src_rank // (src_tp // dst_tp), src_rank // (src_tp // dst_tp) + 1)


def should_send_replicated(src_tp: int, dst_tp: int, local_rank: int) -> bool:
    """Whether this prefill rank is the elected writer of a replicated item."""
    _check_tp(src_tp, dst_tp, local_rank)
    return src_tp <= dst_tp or local_rank % (src_tp // dst_tp) == 0


def _logical_blocks(
    src_dim: int,
    dst_dim: int,
    src_tp: int,
    dst_tp: int,
    dst_rank: int,
    local_rank: int,
    groups: Sequence[int] | None,
) -> list[Block]:
    """``(src_row, dst_row, rows)`` triples in units of the split dimension."""
    per_group = bool(groups) and sum(groups or ()) == src_dim * src_tp
    subs = [(g // src_tp, g // dst_tp) for g in groups or ()] if per_group else [(src_dim, dst_dim)]
    blocks: list[Block] = []
    src_off = dst_off = 0
    for src_sub, dst_sub in subs:
        if src_tp > dst_tp:
            writer = local_rank % (src_tp // dst_tp)
            blocks.append((src_off, dst_off + writer * src_sub, src_sub))
        else:
            blocks.append((src_off + (dst_rank * dst_sub) % src_sub, dst_off, dst_sub))
        src_off += src_sub
        dst_off += dst_sub
    return blocks


def slice_byte_blocks(
    *,
    src_item_len: int,
    dst_item_len: int,
    src_dim: int,
    dst_dim: int,
    outer_count: int,
    src_tp: int,
    dst_tp: int,
    dst_rank: int,
    local_rank: int,
    conv_shard_groups: Sequence[int] | None = None,
) -> list[Block]:
    """``(src_byte_offset, dst_byte_offset, size)`` within one item, as sglang 0.5.23 computes them."""
    if dst_rank not in target_ranks(src_tp, dst_tp, local_rank):
        raise PlanError(
            f"decode rank {dst_rank} (TP {dst_tp}) is not a target of "
            f"prefill rank {local_rank} (TP {src_tp}); "
            f"its targets are {list(target_ranks(src_tp, dst_tp, local_rank))}"
        )
    if (src_dim == 0) != (dst_dim == 0):
        raise PlanError(f"TP dim is replicated on one side only: prefill dim {src_dim}, decode dim {dst_dim}")
    if src_dim == 0:
        if src_item_len != dst_item_len:
            raise PlanError(f"replicated item lengths differ: prefill {src_item_len}, decode {dst_item_len}")
        return [(0, 0, src_item_len)] if should_send_replicated(src_tp, dst_tp, local_rank) else []
    if src_dim * src_tp != dst_dim * dst_tp:
        raise PlanError(
            f"split dimension totals differ: prefill {src_dim} x TP {src_tp}, decode {dst_dim} x TP {dst_tp}"
        )
    if src_item_len % (src_dim * outer_count) or dst_item_len % (dst_dim * outer_count):
        raise PlanError(
            f"item lengths {src_item_len}/{dst_item_len} do not divide into {outer_count} x dim rows"
        )
    src_row = src_item_len // (src_dim * outer_count)
    dst_row = dst_item_len // (dst_dim * outer_count)
    if src_row != dst_row:
        raise PlanError(f"bytes per split row differ: prefill {src_row}, decode {dst_row}")
    logical = _logical_blocks(src_dim, dst_dim, src_tp, dst_tp, dst_rank, local_rank, conv_shard_groups)
    return [
        (o * src_dim * src_row + s * src_row, o * dst_dim * dst_row + d * dst_row, n * src_row)
        for o in range(outer_count)
        for s, d, n in logical
    ]
