"""Direct or staged: the per-component choice of how a request's writes travel. Pure, no torch.

Engines move large contiguous blocks near the device's copy rate but pay a fixed cost per block, so
thousands of 4-64 KiB pages go two to three orders of magnitude slower than one large block (see
docs/gpu.md). The staged path gathers such pages into one contiguous buffer, makes one write and
scatters on the receiver; it costs two extra passes over the bytes, so it only pays for small writes.
The choice is made per component from the plan alone: mean write size under ``threshold`` → staged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from ..planner import WritePlan

__all__ = ["DEFAULT_THRESHOLD", "Path", "PathChoice", "choose_paths"]

Path = Literal["direct", "staged"]
DEFAULT_THRESHOLD = 512 << 10


@dataclass(frozen=True)
class PathChoice:
    """The path of each component id present in a plan, and the plan split along it."""

    paths: dict[int, Path]
    direct: WritePlan
    staged: WritePlan

    @property
    def staged_components(self) -> tuple[int, ...]:
        return tuple(c for c, p in sorted(self.paths.items()) if p == "staged")


def choose_paths(
    plan: WritePlan,
    threshold: float = DEFAULT_THRESHOLD,
    *,
    per_request: bool = False,
    force: Path | None = None,
    min_writes: int = 1,
) -> PathChoice:
    """Stage a component when its mean write is under ``threshold`` bytes and it has at least
    ``min_writes`` writes (``threshold=0``: all direct; ``math.inf``: all staged; ``force`` overrides
    either way). A staged piece pays a fixed round (gather, write, notice, scatter, ack: 2-3 ms in
    the agents on an H200, docs/gpu.md) that only many per-write costs (about 9 us each there) repay,
    so a 64-byte aux slot goes direct. ``per_request`` decides once from the whole plan's mean write."""
    if len(plan) == 0:
        return PathChoice({}, plan, plan)
    ids, inverse, counts = np.unique(plan.component, return_inverse=True, return_counts=True)
    sums = np.zeros(len(ids), dtype=np.float64)
    np.add.at(sums, inverse, plan.size)
    if per_request:
        staged_ids = np.full(len(ids), plan.total_bytes / len(plan) < threshold and len(plan) >= min_writes)
    else:
        staged_ids = (sums / counts < threshold) & (counts >= min_writes)
    if force is not None:
        staged_ids[:] = force == "staged"
    paths: dict[int, Path] = {
        int(c): "staged" if s else "direct" for c, s in zip(ids, staged_ids, strict=True)
    }
    mask = staged_ids[inverse]
    return PathChoice(paths, plan.select(~mask), plan.select(mask))
