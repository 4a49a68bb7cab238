"""Memory pools: the buffers behind a ``RoleSchema``'s regions, plus the index allocators over them.

The agent allocates one contiguous buffer per region (KV buffers, aux buffers, each component's
tensors, in canonical order) — numpy host memory by default, torch CUDA tensors when the config says
``device: cuda`` (torch is imported only then) — or, in library use, *adopts* buffers an engine already
owns. The pools hand the transport ``MemoryRegion`` records in the same canonical order, so region ids
mean the same thing to the planner, the transport and the wire.

Reads and writes of whole items go through ``read_items`` / ``write_items`` so the synthetic source and
verification work the same on host and device memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import BadInput, SchemaError
from ..schema import Region, RoleSchema
from ..transports import Device, MemoryRegion


class MemoryPools:
    """One buffer per region of ``schema`` (canonical order); ``buffers[i]`` backs ``regions[i]``."""

    def __init__(self, schema: RoleSchema, buffers: Sequence[Any], device: Device = "cpu", gpu_id: int = 0):
        self.schema = schema
        self.regions: tuple[Region, ...] = schema.regions()
        self.device: Device = device
        self.gpu_id = gpu_id
        if len(buffers) != len(self.regions):
            raise SchemaError(f"{len(buffers)} buffers for {len(self.regions)} regions")
        for region, buf in zip(self.regions, buffers, strict=True):
            if _nbytes(buf) != region.size:
                raise SchemaError(
                    f"buffer for {region.name} has {_nbytes(buf)} bytes, region needs {region.size}"
                )
        self.buffers = list(buffers)
        self.arena: Any = None
        """The one buffer holding every region when allocated with ``arena=True`` (else None)."""
        self.bases: np.ndarray | None = None
        """Byte offset of each region in ``arena`` (canonical order), when there is one."""

    @classmethod
    def allocate(
        cls, schema: RoleSchema, device: Device = "cpu", gpu_id: int = 0, *, arena: bool = False,
        prefault: bool = False,
    ) -> MemoryPools:
        """Fresh zeroed buffers: numpy on the host, torch uint8 tensors on ``cuda:gpu_id``. With
        ``arena``, one allocation holds every region (bases aligned to ``ARENA_ALIGN``) and the regions
        are views of it, so one staging kernel can gather rows of several components. ``prefault``
        writes every host page now instead of on first use."""
        sizes = [r.size for r in schema.regions()]
        if arena:
            bases = _aligned_bases(sizes)
            whole = _zeros(bases[-1] + sizes[-1] if sizes else 1, device, gpu_id, prefault)
            pools = cls(schema, [whole[b:b + n] for b, n in zip(bases, sizes, strict=True)], device, gpu_id)
            pools.arena, pools.bases = whole, np.array(bases, dtype=np.int64)
            return pools
        return cls(schema, [_zeros(n, device, gpu_id, prefault) for n in sizes], device, gpu_id)

    @classmethod
    def adopt(
        cls, schema: RoleSchema, buffers: Sequence[Any], device: Device = "cpu", gpu_id: int = 0
    ) -> MemoryPools:
        """Library use: wrap buffers an engine already owns (numpy arrays or torch tensors, contiguous)."""
        for buf in buffers:
            contiguous = buf.flags["C_CONTIGUOUS"] if isinstance(buf, np.ndarray) else buf.is_contiguous()
            if not contiguous:
                raise BadInput("adopted buffers must be contiguous")
        return cls(schema, [_as_bytes(b) for b in buffers], device, gpu_id)

    def memory_regions(self) -> list[MemoryRegion]:
        """What the transport registers, in canonical order."""
        return [MemoryRegion(_address(b), _nbytes(b), self.device, self.gpu_id) for b in self.buffers]

    @property
    def total_bytes(self) -> int:
        return sum(r.size for r in self.regions)

    def _items(self, region: int) -> Any:
        r = self.regions[region]
        return self.buffers[region].reshape(r.num_items, r.item_len)

    def read_items(self, region: int, indices: np.ndarray) -> np.ndarray:
        """Copy of items ``indices`` of ``region`` as a host ``(n, item_len)`` uint8 array."""
        idx = self._check(region, indices)
        items = self._items(region)
        if isinstance(items, np.ndarray):
            return items[idx]
        import torch

        return items.index_select(0, torch.as_tensor(idx, device=items.device)).cpu().numpy()

    def write_items(self, region: int, indices: np.ndarray, data: np.ndarray) -> None:
        """Store host ``(n, item_len)`` uint8 ``data`` into items ``indices`` of ``region``."""
        idx = self._check(region, indices)
        items = self._items(region)
        if isinstance(items, np.ndarray):
            items[idx] = data
            return
        import torch

        items[torch.as_tensor(idx, device=items.device)] = torch.from_numpy(data).to(items.device)

    def _check(self, region: int, indices: np.ndarray) -> np.ndarray:
        idx = np.asarray(indices, dtype=np.int64)
        n = self.regions[region].num_items
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise BadInput(f"{self.regions[region].name}: item index out of 0..{n - 1}")
        return idx


ARENA_ALIGN = 2 << 20
"""Region bases in an arena: 2 MiB, so any power-of-two staging row up to 2 MiB divides every base."""


def _aligned_bases(sizes: Sequence[int]) -> list[int]:
    bases, at = [], 0
    for n in sizes:
        bases.append(at)
        at += -(-n // ARENA_ALIGN) * ARENA_ALIGN
    return bases


def _zeros(nbytes: int, device: Device, gpu_id: int, prefault: bool = False) -> Any:
    if device == "cuda":
        import torch  # the agent needs torch only for device memory

        return torch.zeros(nbytes, dtype=torch.uint8, device=torch.device("cuda", gpu_id))
    if not prefault:
        return np.zeros(nbytes, dtype=np.uint8)  # calloc: pages mapped (zero) on first touch
    buf = np.empty(nbytes, dtype=np.uint8)
    buf.fill(0)
    return buf


def _nbytes(buf: Any) -> int:
    if isinstance(buf, np.ndarray):
        return int(buf.nbytes)
    return int(buf.numel() * buf.element_size())


def _address(buf: Any) -> int:
    if isinstance(buf, np.ndarray):
        return int(buf.ctypes.data)
    return int(buf.data_ptr())


def _as_bytes(buf: Any) -> Any:
    """A flat uint8 view of the same memory (numpy or torch)."""
    if isinstance(buf, np.ndarray):
        return buf.reshape(-1).view(np.uint8)
    import torch

    return buf.reshape(-1).view(torch.uint8)


class IndexAllocator:
    """A free list of item indices (KV pages, mamba slots, aux slots). Not thread-safe by design: each
    role worker owns its allocators on one thread."""

    def __init__(self, name: str, capacity: int):
        self.name = name
        self.capacity = capacity
        self._free = list(range(capacity - 1, -1, -1))

    @property
    def available(self) -> int:
        return len(self._free)

    def take(self, n: int) -> np.ndarray | None:
        """``n`` indices (ascending when freshly allocated, so runs coalesce), or None if short."""
        if n > len(self._free):
            return None
        out = [self._free.pop() for _ in range(n)]
        return np.array(out, dtype=np.int32)

    def give(self, indices: np.ndarray | Sequence[int]) -> None:
        back = indices.tolist() if isinstance(indices, np.ndarray) else [int(i) for i in indices]
        if back and not (min(back) >= 0 and max(back) < self.capacity):
            raise BadInput(f"{self.name}: returned index out of 0..{self.capacity - 1}")
        back.sort(reverse=True)
        self._free.extend(back)


def give_items(
    kv_pages: IndexAllocator,
    aux_slots: IndexAllocator,
    state_items: Sequence[IndexAllocator],
    kv: np.ndarray | None,
    aux: int | None,
    state: Sequence[Any],
) -> None:
    """Give one room's items back: its KV pages, aux slot and each component's items (None: none)."""
    if kv is not None:
        kv_pages.give(kv)
    if aux is not None:
        aux_slots.give([aux])
    for alloc, idx in zip(state_items, state, strict=False):
        if idx is not None:
            alloc.give(idx)
