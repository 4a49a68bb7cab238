"""Engine pools in CUDA memory, shared with the agent through CUDA IPC handles.

One plain ``cudaMalloc`` (CuPy's unpooled ``cupy.cuda.Memory``, so the allocation starts exactly at
the pointer the handle names — a caching allocator's sub-block would need its offset inside the
block) holds every region back to back, 256-byte aligned. Its ``cudaIpcGetMemHandle`` goes to the
agent in every ``PoolRegion`` with the region's offset, and the agent opens it once
(``transports.ipc_memory.open_ipc``). The engine's own views are torch uint8 tensors over the same memory
(``__cuda_array_interface__``), which is what ``MemoryPools`` reads and writes. CuPy and torch are
imported only here, only when an engine asks for device pools.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..localapi.messages import PoolRegion
from ..transports.ipc_memory import DeviceBuffer

ALIGN = 256


class CudaPools:
    """``buffers``: a flat uint8 tensor per region; ``regions``: what ``register_pools`` sends."""

    def __init__(self, regions: Sequence[tuple[str, int, int, int]], device_id: int = 0):
        import cupy
        import torch

        offsets, total = [], 0
        for *_, size in regions:
            offsets.append(total)
            total += -(-size // ALIGN) * ALIGN
        with cupy.cuda.Device(device_id):
            self.memory: Any = cupy.cuda.Memory(total)
            cupy.cuda.runtime.memset(self.memory.ptr, 0, total)
            handle = bytes(cupy.cuda.runtime.ipcGetMemHandle(self.memory.ptr))
        base = int(self.memory.ptr)
        dev = torch.device("cuda", device_id)
        self.buffers = [
            torch.as_tensor(DeviceBuffer(base + o, s, device_id), device=dev)
            for (*_, s), o in zip(regions, offsets, strict=True)
        ]
        self.regions = tuple(
            PoolRegion(name=n, component=c, tensor=t, size=s, kind="cuda_ipc", handle=handle,
                       offset=o, device_id=device_id)
            for (n, c, t, s), o in zip(regions, offsets, strict=True)
        )

    @property
    def fds(self) -> list[int]:
        """No descriptors: the IPC handle travels inside the regions."""
        return []

    def close(self) -> None:
        self.buffers = []
        self.memory = None
