"""The synthetic engine: deterministic per-request state, so decode can verify every byte it received.

Prefill "computes" a request by filling its source items; decode recomputes the same bytes from the
room id alone and compares. The content of an item depends only on (room, component, tensor, position
of the item within the request) — never on which physical slot or page holds it — so any correct
transfer verifies and any misplaced, stale or torn byte does not.

TP-split tensors (mamba with ``tp_dim``) are generated as the *full* logical item (``outer_count``
blocks of ``tp_dim x tp_size`` rows) and each rank keeps its own rows (per ``conv_shard_groups``
sub-block for GDN conv state), so a prefill at TP 1 and a decode at TP 2 (or the reverse) agree on
every byte exactly when the planner's slicing is right.
"""

from __future__ import annotations

import functools
import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..schema import AUX_COMPONENT, KV_COMPONENT, RoleSchema, SendRule, TensorSpec
from .pools import MemoryPools

SWA_WINDOW_TOKENS = 4096
"""Tokens of the sliding window the synthetic engine assumes for ``swa`` components."""

_M1 = np.uint64(0x9E3779B97F4A7C15)
_M2 = np.uint64(0xBF58476D1CE4E5B9)
_MASK = (1 << 64) - 1


@dataclass(frozen=True)
class ItemCounts:
    """How many items a request owns per component (0 = the component is empty for this request)."""

    kv: int
    aux: int
    state: tuple[int, ...]

    @property
    def empty(self) -> bool:
        return self.kv == 0 and self.aux == 0 and not any(self.state)


@dataclass(frozen=True)
class ComponentCheck:
    """Verification of one component of one request on the receiving side."""

    component: str
    state_type: str
    items: int
    bytes: int
    checksum: int
    """crc32 of the received bytes (in item order)."""
    expected_checksum: int
    ok: bool


def items_for_tokens(schema: RoleSchema, tokens: int) -> ItemCounts:
    """A request of ``tokens`` tokens: KV pages of the sequence, one slot per SLOT component, the last
    window's pages for ``swa``, every page for other PAGED/POSITIONAL types; 0 tokens = all empty."""
    pages = math.ceil(tokens / schema.kv.page_size) if tokens > 0 else 0
    window = min(pages, math.ceil(SWA_WINDOW_TOKENS / schema.kv.page_size))
    state = []
    for comp in schema.components:
        if comp.info.rule is SendRule.SLOT:
            n = 1 if tokens > 0 else 0
        else:
            n = window if comp.state_type == "swa" else pages
        state.append(min(n, comp.num_items))
    return ItemCounts(min(pages, schema.kv.num_pages), 1 if tokens > 0 else 0, tuple(state))


@functools.lru_cache(maxsize=64)
def _table(words: int) -> np.ndarray:
    """A fixed pseudo-random word per position within an item (splitmix64 of the position)."""
    with np.errstate(over="ignore"):
        w = np.arange(1, words + 1, dtype=np.uint64) * _M1
        w ^= w >> np.uint64(30)
        w *= _M2
        w ^= w >> np.uint64(31)
    w.setflags(write=False)
    return w


def _mix(keys: np.ndarray, words: int) -> np.ndarray:
    """Row ``i`` is ``keys[i]`` XOR the position table: one pass, unique per item and per position."""
    return _table(words)[None, :] ^ keys[:, None]


def _key(room: int, component: int, tensor: int) -> int:
    h = (room * 0x100000001B3 + (component + 3) * 0x9E3779B1 + tensor * 0x85EBCA77) & _MASK
    return (h ^ (h >> 29)) * 0xC2B2AE3D27D4EB4F & _MASK


def local_row_ranges(spec: TensorSpec, tp_size: int, tp_rank: int) -> list[tuple[int, int]]:
    """Full-tensor row ranges ``[start, stop)`` this rank holds along the TP-split dimension, in
    local order: one range for a plain split, one per ``conv_shard_groups`` sub-block."""
    groups = spec.conv_shard_groups
    if groups and sum(groups) == spec.tp_dim * tp_size:
        out, start = [], 0
        for g in groups:
            share = g // tp_size
            out.append((start + tp_rank * share, start + (tp_rank + 1) * share))
            start += g
        return out
    return [(tp_rank * spec.tp_dim, (tp_rank + 1) * spec.tp_dim)]


class SyntheticEngine:
    """Fills and verifies requests in ``pools``; stateless apart from the pools themselves."""

    def __init__(self, pools: MemoryPools):
        self.pools = pools
        self.schema = pools.schema

    def expected(self, room: int, region: int, count: int) -> np.ndarray:
        """The ``(count, item_len)`` bytes positions 0..count-1 of ``region`` hold for ``room``."""
        r = self.pools.regions[region]
        spec = self._split_spec(r.component, r.tensor)
        if spec is None:
            return self._stream(room, r.component, r.tensor, count, r.item_len)
        full_rows = spec.tp_dim * self.schema.tp_size
        row = r.item_len // (spec.tp_dim * spec.outer_count)
        logical = self._stream(room, r.component, r.tensor, count, spec.outer_count * full_rows * row)
        blocks = logical.reshape(count, spec.outer_count, full_rows, row)
        ranges = local_row_ranges(spec, self.schema.tp_size, self.schema.tp_rank)
        parts = [blocks[:, :, a:b, :] for a, b in ranges]
        local = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=2)
        return np.ascontiguousarray(local).reshape(count, r.item_len)

    def _stream(self, room: int, component: int, tensor: int, count: int, item_len: int) -> np.ndarray:
        base = _key(room, component, tensor)
        keys = (np.arange(count, dtype=np.uint64) * np.uint64(0xD6E8FEB86659FD93)) ^ np.uint64(base)
        words = _mix(keys, -(-item_len // 8))
        return words.view(np.uint8).reshape(count, -1)[:, :item_len]

    def _split_spec(self, component: int, tensor: int) -> TensorSpec | None:
        """How an item splits across TP ranks: MHA KV pages by token-row bytes (the planner's head
        slicing), TP-sliceable state by its ``tp_dim`` rows; None when replicated."""
        kv = self.schema.kv
        if component == KV_COMPONENT and kv.layout == "mha" and self.schema.tp_size > 1:
            return TensorSpec(kv.item_len, tp_dim=kv.item_len // kv.page_size, outer_count=kv.page_size)
        if component < 0:
            return None
        comp = self.schema.components[component]
        spec = comp.tensors[tensor]
        return spec if comp.info.tp_sliceable and spec.tp_dim else None

    def _component_regions(self, kv: np.ndarray, aux: int | None, state: Sequence[np.ndarray | None]):
        """(component id, name, state type, region ids, indices) for every non-empty component."""
        sch = self.schema
        out = []
        if len(kv):
            out.append((KV_COMPONENT, "kv", "kv", range(len(sch.kv.layer_ids)), kv))
        if aux is not None:
            base = sch.region_base(AUX_COMPONENT)
            out.append(
                (AUX_COMPONENT, "aux", "aux", range(base, base + len(sch.aux.item_lens)), np.array([aux]))
            )
        for ci, (comp, idx) in enumerate(zip(sch.components, state, strict=True)):
            if idx is not None and len(idx):
                base = sch.region_base(ci)
                out.append((ci, comp.name, comp.state_type, range(base, base + len(comp.tensors)), idx))
        return out

    def fill(self, room: int, kv: np.ndarray, aux: int | None, state: Sequence[np.ndarray | None]) -> None:
        """Write ``room``'s deterministic content into the given items (prefill's "forward pass")."""
        for _, _, _, regions, idx in self._component_regions(kv, aux, state):
            for region in regions:
                self.pools.write_items(region, idx, self.expected(room, region, len(idx)))

    def sizes(
        self, kv: np.ndarray, aux: int | None, state: Sequence[np.ndarray | None]
    ) -> list[tuple[str, str, int]]:
        """(component, state type, bytes) per non-empty component, without reading memory."""
        regions = self.pools.regions
        return [
            (name, stype, sum(regions[r].item_len for r in rs) * len(idx))
            for _, name, stype, rs, idx in self._component_regions(kv, aux, state)
        ]

    def verify(
        self, room: int, kv: np.ndarray, aux: int | None, state: Sequence[np.ndarray | None]
    ) -> list[ComponentCheck]:
        """Compare every byte of every non-empty component with what prefill must have sent."""
        checks = []
        for _, name, stype, regions, idx in self._component_regions(kv, aux, state):
            ok, nbytes, crc, want_crc = True, 0, 0, 0
            for region in regions:
                got = self.pools.read_items(region, idx)
                want = self.expected(room, region, len(idx))
                same = bool(np.array_equal(got, want))
                in_step = crc == want_crc
                nbytes += got.nbytes
                crc = zlib.crc32(np.ascontiguousarray(got).data, crc)
                expected_crc = (
                    crc if same and in_step else zlib.crc32(np.ascontiguousarray(want).data, want_crc)
                )
                want_crc = expected_crc
                ok = ok and same
            checks.append(
                ComponentCheck(name, stype, len(idx), nbytes, crc, want_crc, ok and crc == want_crc)
            )
        return checks
