"""Cases and GPU memory layouts for ``bench/gpu_transfer.py``, shared by its prefill and decode processes.

A case is a block case (``count`` blocks of ``block`` bytes picked at random from a pool of twice as
many, on both sides: scattered, as pages are after churn), a model mix (one request of a built-in
profile at its real size: its KV pages, aux slot and state components, planned by the real planner),
or a room (``room_pages`` KV pages in runs of 1-16, one mamba slot, every layer at its real size) from
a prefill rank of TP ``prefill_tp`` to a decode rank of TP ``decode_tp``: where the sizes differ the
planner's compact plan (strided rows of head and Mamba slices) as the agent hands it to a transport.
Each side builds its layout from the case and its role: the agent's ``MemoryPools`` allocated as one
arena on the GPU (``arena=True``: every region a view, bases aligned to 2 MiB), and one staging buffer
registered after them (region id = number of pool regions).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from dataplane.agent.pools import MemoryPools
from dataplane.planner import PeerLayout, RequestIndices, WritePlan, plan_request
from dataplane.schema import RoleSchema
from dataplane.schema.profiles import profile
from dataplane.staging import expand, pick_chunk, region_rows, runs_of
from dataplane.transports import MemoryRegion

KiB, MiB = 1 << 10, 1 << 20


@dataclass(frozen=True)
class Case:
    name: str
    block: int = 0
    count: int = 0
    model: str = ""
    tokens: int = 4096
    pool_pages: int = 256
    room_pages: int = 0
    """A room of this many KV pages (``tokens`` unused), fragmented as ``bench codec``'s request."""
    prefill_tp: int = 1
    prefill_rank: int = 0
    decode_tp: int = 1
    decode_rank: int = 0
    kv_heads: int = 0
    """KV heads of the model (0: the profile's own; Qwen3-Next's 2 do not split 4 or 8 ways)."""
    equal: str = ""
    """The equal-TP case this room's GB/s is compared with."""

    def rank(self, side: str) -> tuple[int, int]:
        if side == "prefill":
            return self.prefill_tp, self.prefill_rank
        return self.decode_tp, self.decode_rank


def _room(name: str, tp: tuple[int, int, int, int], heads: int = 0, pages: int = 512, pool: int = 2048,
          equal: str = "") -> Case:
    ptp, prank, dtp, drank = tp
    return Case(name, model="qwen3-next", pool_pages=pool, room_pages=pages, prefill_tp=ptp,
                prefill_rank=prank, decode_tp=dtp, decode_rank=drank, kv_heads=heads, equal=equal)


ROOMS = (
    # Qwen3-Next at full size (32K tokens), equal TP and prefill TP 1 -> decode TP 2 (rank 0 -> 1)
    _room("qwen3-next TP1->1", (1, 0, 1, 0)),
    _room("qwen3-next TP1->2", (1, 0, 2, 1), equal="qwen3-next TP1->1"),
    # its layers with 8 KV heads, so that TP 4 and 8 split them
    _room("8kv TP4->4", (4, 2, 4, 2), heads=8),
    _room("8kv TP2->4", (2, 1, 4, 3), heads=8, equal="8kv TP4->4"),
    _room("8kv TP8->4", (8, 5, 4, 2), heads=8, equal="8kv TP4->4"),
)
CASES = (
    Case("4KiB x 16384", 4 * KiB, 16384),
    Case("64KiB x 4096", 64 * KiB, 4096),
    Case("1MiB x 256", 1 * MiB, 256),
    Case("64MiB x 16", 64 * MiB, 16),
    Case("qwen3-next 4k tok", model="qwen3-next"),
    Case("deepseek-v3.2 4k tok", model="deepseek-v3.2"),
    *ROOMS,
)
QUICK = (
    Case("4KiB x 2048", 4 * KiB, 2048),
    Case("64MiB x 4", 64 * MiB, 4),
    Case("qwen3-next 1k tok", model="qwen3-next", tokens=1024, pool_pages=64),
    Case("deepseek-v3.2 1k tok", model="deepseek-v3.2", tokens=1024, pool_pages=64),
    _room("qwen3-next TP1->1 64p", (1, 0, 1, 0), pages=64, pool=256),
    _room("qwen3-next TP1->2 64p", (1, 0, 2, 1), pages=64, pool=256, equal="qwen3-next TP1->1 64p"),
)


def schema_of(case: Case, side: str = "prefill") -> RoleSchema | None:
    """The ``side`` rank's schema of a model case (None for a block case)."""
    if not case.model:
        return None
    model = profile(case.model)
    if case.kv_heads:
        model = replace(model, kv=replace(model.kv, heads=case.kv_heads))
    tp, rank = case.rank(side)
    return model.schema(tp_size=tp, tp_rank=rank, page_size=64, pool_pages=case.pool_pages, max_requests=8)


def region_sizes(case: Case, side: str = "prefill") -> list[int]:
    schema = schema_of(case, side)
    if schema is None:
        return [2 * case.count * case.block]
    return [r.size for r in schema.regions()]


@dataclass(eq=False)
class Layout:
    """One side's memory: ``arena`` (uint8 CUDA), its regions' byte ``bases`` / ``sizes``, ``staging``."""

    arena: Any
    bases: np.ndarray
    sizes: np.ndarray
    staging: Any
    regions: list[MemoryRegion]
    pools: MemoryPools | None

    @property
    def staging_id(self) -> int:
        return len(self.bases)


def build_layout(case: Case, staging_bytes: int, side: str = "prefill") -> Layout:
    """Model cases: the ``side`` rank's ``MemoryPools`` as one arena on the GPU; block cases: one region."""
    import torch

    staging = torch.empty(staging_bytes, dtype=torch.uint8, device="cuda")
    schema = schema_of(case, side)
    if schema is not None:
        pools = MemoryPools.allocate(schema, "cuda", arena=True)
        assert pools.bases is not None
        sizes = np.array([r.size for r in schema.regions()], dtype=np.int64)
        arena, bases, regions = pools.arena, pools.bases, pools.memory_regions()
    else:
        pools, sizes, bases = None, np.array(region_sizes(case, side), dtype=np.int64), np.zeros(1, np.int64)
        arena = torch.empty(int(sizes[0]), dtype=torch.uint8, device="cuda")
        regions = [MemoryRegion(arena.data_ptr(), arena.numel(), "cuda")]
    regions.append(MemoryRegion(staging.data_ptr(), staging_bytes, "cuda"))
    return Layout(arena, bases, sizes, staging, regions, pools)


def plan_for(case: Case, seed: int = 7) -> WritePlan:
    """The request: random scattered blocks, one request of the model at ``tokens`` tokens, or a room
    (compact where the TP sizes differ; ``WritePlan.expanded`` gives one row per write)."""
    rng = np.random.default_rng(seed)
    schema, peer = schema_of(case, "prefill"), schema_of(case, "decode")
    if schema is None or peer is None:
        src = rng.permutation(2 * case.count)[: case.count]
        dst = rng.permutation(2 * case.count)[: case.count]
        return WritePlan.build(0, src * case.block, 0, dst * case.block, case.block, 0)
    if case.room_pages:
        from dataplane.harness.bench.codec import fragmented_pages

        room_rng = np.random.default_rng(35)
        src = fragmented_pages(room_rng, case.room_pages, schema.kv.num_pages)
        dst = fragmented_pages(room_rng, case.room_pages, peer.kv.num_pages)
    else:
        pages = case.tokens // schema.kv.page_size
        src = rng.permutation(schema.kv.num_pages)[:pages]
        dst = rng.permutation(schema.kv.num_pages)[:pages]
    states_src: list[Any] = []
    states_dst: list[Any] = []
    for comp in schema.components:
        paged = comp.info.rule.name != "SLOT"
        states_src.append(src if paged else np.array([1]))
        states_dst.append(dst if paged else np.array([2]))
    req = RequestIndices.of(src, dst, 3, 4, states_src, states_dst)
    return plan_request(schema, PeerLayout.from_schema(peer), req)


def gathered(layout: Layout, region: np.ndarray, offset: np.ndarray, size: np.ndarray,
             component: np.ndarray) -> dict[int, Any]:
    """The bytes each component's writes cover, in plan order (one row per write: an expanded plan),
    as one uint8 CUDA tensor per component: prefill's are what decode must hold after a path ran."""
    import torch

    out = {}
    for comp in np.unique(component).tolist():
        m = component == comp
        chunk = pick_chunk(layout.bases[region[m]] + offset[m], size[m], limit=1 << 12)
        runs = runs_of(region[m], offset[m], size[m], chunk)
        rows = expand(runs, *region_rows(layout.bases, layout.sizes, chunk))
        view = layout.arena[: layout.arena.numel() // chunk * chunk].view(-1, chunk)
        out[int(comp)] = view.index_select(0, torch.from_numpy(rows).to(view.device)).view(-1)
    return out
