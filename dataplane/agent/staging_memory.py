"""The staging memory a role registers right after its pools' regions: prefill one staging buffer,
decode one landing buffer per prefill rank it pulls from (so two prefill ranks never write one slot).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ..config import AgentConfig, StagedConfig
from ..errors import BadInput
from ..staging import (
    HostStager,
    SlotPool,
)
from ..transports import MemoryRegion
from .pools import MemoryPools

__all__ = ["StagingMemory", "staging_enabled"]

log = logging.getLogger(__name__)


def staging_enabled(cfg: AgentConfig) -> bool:
    """``auto`` stages only GPU pools (where per-page engine writes cost most) behind an engine:
    the ``cuda-ipc`` transport copies page to page in one kernel already; ``on`` also host."""
    mode = cfg.transfer.staged.mode
    auto = cfg.transfer.device == "cuda" and cfg.transfer.backend != "cuda-ipc"
    return mode == "on" or (mode == "auto" and auto)


class StagingMemory:
    """A role's staging buffers (``sets`` of ``slots`` x ``slot_bytes``) over its pools' arena."""

    def __init__(self, pools: MemoryPools, cfg: StagedConfig, sets: int):
        if pools.arena is None or pools.bases is None:
            raise BadInput("staged path: the pools must be allocated as one arena")
        if cfg.slots < 1 or cfg.slots > 1024:
            raise BadInput(f"transfer.staged.slots must be 1..1024, got {cfg.slots}")
        if cfg.slot_bytes < 4096 or cfg.slot_bytes % 4096:
            raise BadInput(
                f"transfer.staged.slotBytes must be a positive multiple of 4096, got {cfg.slot_bytes}"
            )
        if cfg.min_writes < 1:
            raise BadInput(f"transfer.staged.minWrites must be >= 1, got {cfg.min_writes}")
        if cfg.threshold_bytes < 0:
            raise BadInput(f"transfer.staged.thresholdBytes must be >= 0, got {cfg.threshold_bytes}")
        self.pools, self.cfg = pools, cfg
        self.slots, self.slot_bytes = cfg.slots, cfg.slot_bytes
        self.buffers = [_zeros(cfg.slots * cfg.slot_bytes, pools) for _ in range(sets)]
        self.sizes = np.array([r.size for r in pools.regions], dtype=np.int64)
        self.bases = pools.bases
        self.first_region = len(pools.regions)
        """Region id of the first staging buffer (they follow the pools' regions)."""

    @classmethod
    def for_agent(cls, cfg: AgentConfig, pools: MemoryPools) -> StagingMemory | None:
        """The configured staging memory, or None (staging off, or pools without an arena: adopted
        engine memory, where one kernel cannot index every region)."""
        if not staging_enabled(cfg):
            return None
        if pools.arena is None:
            log.warning("staged path off: the pools are not one arena (adopted engine memory)")
            return None
        sets = 1 if cfg.role == "prefill" else max(1, cfg.prefill.tp_size // cfg.decode.tp_size)
        return cls(pools, cfg.transfer.staged, sets)

    def regions(self) -> list[MemoryRegion]:
        return [
            MemoryRegion(_address(b), self.slots * self.slot_bytes, self.pools.device, self.pools.gpu_id)
            for b in self.buffers
        ]

    def stager(self, index: int) -> Any:
        """Gather / scatter between the arena and buffer ``index`` (torch on CUDA, numpy on host)."""
        if self.pools.device == "cuda":
            from ..staging.gpu import TorchStager

            return TorchStager(self.pools.arena, self.buffers[index], kernel=self.cfg.kernel)
        return HostStager(self.pools.arena, self.buffers[index])

    def pool(self, index: int) -> SlotPool:
        return SlotPool(self.slots, self.slot_bytes, self.buffers[index])


def _zeros(nbytes: int, pools: MemoryPools) -> Any:
    if pools.device == "cuda":
        import torch

        return torch.zeros(nbytes, dtype=torch.uint8, device=torch.device("cuda", pools.gpu_id))
    return np.zeros(nbytes, dtype=np.uint8)


def _address(buf: Any) -> int:
    return int(buf.ctypes.data) if isinstance(buf, np.ndarray) else int(buf.data_ptr())
