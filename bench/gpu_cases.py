"""Cases and GPU memory layouts for ``bench/gpu_transfer.py``, shared by its prefill and decode processes.

A case is either a block case (``count`` blocks of ``block`` bytes picked at random from a pool of
twice as many, on both sides: scattered, as pages are after churn) or a model mix (one request of a
built-in profile at its real size: its KV pages, aux slot and state components, planned by
the real planner). Both sides build the same layout from the case alone: the agent's ``MemoryPools``
allocated as one arena on the GPU (``arena=True``: every region a view, bases aligned to 2 MiB), and one
staging buffer registered after them (region id = number of pool regions).
"""

from __future__ import annotations

from dataclasses import dataclass
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


CASES = (
    Case("4KiB x 16384", 4 * KiB, 16384),
    Case("64KiB x 4096", 64 * KiB, 4096),
    Case("1MiB x 256", 1 * MiB, 256),
    Case("64MiB x 16", 64 * MiB, 16),
    Case("qwen3-next 4k tok", model="qwen3-next"),
    Case("deepseek-v3.2 4k tok", model="deepseek-v3.2"),
)
QUICK = (
    Case("4KiB x 2048", 4 * KiB, 2048),
    Case("64MiB x 4", 64 * MiB, 4),
    Case("qwen3-next 1k tok", model="qwen3-next", tokens=1024, pool_pages=64),
    Case("deepseek-v3.2 1k tok", model="deepseek-v3.2", tokens=1024, pool_pages=64),
)


def schema_of(case: Case) -> RoleSchema | None:
    if not case.model:
        return None
    return profile(case.model).schema(page_size=64, pool_pages=case.pool_pages, max_requests=8)


def region_sizes(case: Case) -> list[int]:
    schema = schema_of(case)
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


def build_layout(case: Case, staging_bytes: int) -> Layout:
    """Model cases: the agent's ``MemoryPools`` as one arena on the GPU; block cases: one region."""
    import torch

    staging = torch.empty(staging_bytes, dtype=torch.uint8, device="cuda")
    schema = schema_of(case)
    if schema is not None:
        pools = MemoryPools.allocate(schema, "cuda", arena=True)
        assert pools.bases is not None
        sizes = np.array([r.size for r in schema.regions()], dtype=np.int64)
        arena, bases, regions = pools.arena, pools.bases, pools.memory_regions()
    else:
        pools, sizes, bases = None, np.array(region_sizes(case), dtype=np.int64), np.zeros(1, dtype=np.int64)
        arena = torch.empty(int(sizes[0]), dtype=torch.uint8, device="cuda")
        regions = [MemoryRegion(arena.data_ptr(), arena.numel(), "cuda")]
    regions.append(MemoryRegion(staging.data_ptr(), staging_bytes, "cuda"))
    return Layout(arena, bases, sizes, staging, regions, pools)


def plan_for(case: Case, seed: int = 7) -> WritePlan:
    """The request: random scattered blocks, or one request of the model at ``tokens`` tokens."""
    rng = np.random.default_rng(seed)
    schema = schema_of(case)
    if schema is None:
        src = rng.permutation(2 * case.count)[: case.count]
        dst = rng.permutation(2 * case.count)[: case.count]
        return WritePlan.build(0, src * case.block, 0, dst * case.block, case.block, 0)
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
    return plan_request(schema, PeerLayout.from_schema(schema), req)


def checksums(layout: Layout, region: np.ndarray, offset: np.ndarray, size: np.ndarray,
              component: np.ndarray) -> dict[int, int]:
    """Positional checksum of the bytes each component's writes cover, in plan order (int64 wraps)."""
    import torch

    out = {}
    for comp in np.unique(component).tolist():
        m = component == comp
        chunk = pick_chunk(layout.bases[region[m]] + offset[m], size[m], limit=1 << 12)
        runs = runs_of(region[m], offset[m], size[m], chunk)
        rows = expand(runs, *region_rows(layout.bases, layout.sizes, chunk))
        view = layout.arena[: layout.arena.numel() // chunk * chunk].view(-1, chunk)
        data = view.index_select(0, torch.from_numpy(rows).cuda()).view(-1)
        if data.numel() % 4 == 0:
            data = data.view(torch.int32)
        weights = torch.arange(data.numel(), device=data.device, dtype=torch.int64) % 65521 + 1
        out[int(comp)] = int((data.to(torch.int64) * weights).sum().item())
    return out
