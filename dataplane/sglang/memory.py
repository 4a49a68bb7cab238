"""sglang's pools as memory the pod's agent can map: host arenas in a memfd, device pools by CUDA IPC.

sglang allocates its pools itself. Device tensors are shared as they are: ``transports.ipc_memory
.export_ipc`` finds the allocation holding a pointer and its IPC handle, and the region is sent as that
handle plus the offset inside it. A private host tensor cannot be shared after the fact, so host memory
the agent must reach is allocated in a ``HostArena`` — one ``SharedPools`` memfd (huge pages when the
host has them) carved into torch tensors — and ``relocate`` moves an object's CPU tensors there
(``hooks`` does it for sglang's ``MetadataBuffers`` as they are built), and ``rehome`` moves every CPU
tensor an sglang pool object reaches (its per-layer buffer lists, sub-pools, Mamba caches) there in
place, so each alias the pool holds keeps working. ``share`` then names every
region: inside a live arena → ``fd`` region of that arena's descriptor; on a GPU → ``cuda_ipc``; any
other pointer is refused with the buffer's name.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from ..localapi import PoolRegion, SharedPools
from ..schema import RoleSchema
from .layout import Unsupported

ALIGN = 4096
_ARENAS: list[HostArena] = []
_LOCK = threading.Lock()


class HostArena:
    """One memfd of ``size`` bytes that hands out torch tensors (page-aligned, bump-allocated)."""

    def __init__(self, size: int, *, huge_pages: str = "auto"):
        self.pools = SharedPools([("arena", 0, 0, max(size, ALIGN))], huge_pages=huge_pages)  # type: ignore[arg-type]
        self.buffer = self.pools.buffers[0]
        self.base = int(self.buffer.ctypes.data)
        self.size, self.used = int(self.buffer.nbytes), 0
        with _LOCK:
            _ARENAS.append(self)

    @property
    def fd(self) -> int:
        return self.pools.fd

    def tensor(self, shape: Sequence[int], dtype: Any) -> Any:
        """A zeroed tensor of ``shape``/``dtype`` in this arena."""
        import torch

        n = int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
        off = self.used
        if off + n > self.size:
            raise Unsupported(f"pdpair: host arena of {self.size} bytes cannot hold {n} more")
        self.used = -(-(off + n) // ALIGN) * ALIGN
        raw = torch.from_numpy(self.buffer[off : off + n])
        raw.zero_()
        return raw.view(dtype).view(tuple(shape))

    def holds(self, ptr: int, size: int) -> bool:
        return self.base <= ptr and ptr + size <= self.base + self.size

    def close(self) -> None:
        with _LOCK:
            if self in _ARENAS:
                _ARENAS.remove(self)
        self.buffer = None  # type: ignore[assignment]
        self.pools.close()


def relocate(obj: Any, *, huge_pages: str = "auto") -> HostArena | None:
    """Move every CPU tensor attribute of ``obj`` into one new arena (values copied); None if it has
    none. The object's own code keeps working: only where its tensors live changes."""
    import torch

    names = [k for k, v in vars(obj).items() if isinstance(v, torch.Tensor) and v.device.type == "cpu"]
    if not names:
        return None
    total = sum(-(-getattr(obj, k).nbytes // ALIGN) * ALIGN for k in names)
    arena = HostArena(total, huge_pages=huge_pages)
    for k in names:
        old = getattr(obj, k)
        new = arena.tensor(old.shape, old.dtype)
        new.copy_(old)
        setattr(obj, k, new)
    obj._pdpair_arena = arena
    return arena


def tensors_of(root: Any, *, depth: int = 6, limit: int = 100_000) -> list[Any]:
    """Every torch tensor reachable from ``root`` through attributes, lists, tuples and dicts (bounded
    in depth and in objects visited), each once."""
    import torch

    found: dict[int, Any] = {}
    seen: set[int] = set()
    stack: list[tuple[Any, int]] = [(root, 0)]
    while stack and len(seen) < limit:
        obj, level = stack.pop()
        if id(obj) in seen or level > depth:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            found.setdefault(id(obj), obj)
        elif isinstance(obj, (list, tuple)):
            stack += [(v, level + 1) for v in obj]
        elif isinstance(obj, dict):
            stack += [(v, level + 1) for v in obj.values()]
        elif hasattr(obj, "__dict__") and not isinstance(obj, type) and not callable(obj):
            stack += [(v, level + 1) for v in vars(obj).values()]
    return list(found.values())


def rehome(root: Any, *, huge_pages: str = "auto") -> HostArena | None:
    """Move the storage of every CPU tensor reachable from ``root`` into one new arena (values copied,
    ``Tensor.set_`` in place: views, offsets and every other reference keep pointing at the same
    bytes); None if there is none."""
    import torch

    cpu = [t for t in tensors_of(root) if t.device.type == "cpu" and t.untyped_storage().nbytes()]
    storages: dict[int, Any] = {}
    for t in cpu:
        storages.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage())
    if not storages:
        return None
    arena = HostArena(sum(-(-s.nbytes() // ALIGN) * ALIGN for s in storages.values()), huge_pages=huge_pages)
    moved = {}
    for ptr, old in storages.items():
        new = arena.tensor((old.nbytes(),), torch.uint8)
        new.untyped_storage().copy_(old)
        moved[ptr] = new.untyped_storage()
    for t in cpu:
        t.set_(moved[t.untyped_storage().data_ptr()], t.storage_offset(), t.size(), t.stride())
    root._pdpair_arena = arena
    return arena


def _arena_of(ptr: int, size: int) -> HostArena | None:
    with _LOCK:
        return next((a for a in _ARENAS if a.holds(ptr, size)), None)


def share(
    schema: RoleSchema, buffers: Sequence[tuple[int, int]], gpu_id: int
) -> tuple[list[PoolRegion], list[int]]:
    """The ``RegisterPools`` regions (canonical order) and descriptors for ``buffers``."""
    regions: list[PoolRegion] = []
    fds: list[int] = []
    for region, (ptr, size) in zip(schema.regions(), buffers, strict=True):
        name, comp, tensor = region.name, region.component, region.tensor
        arena = _arena_of(ptr, size)
        if arena is not None:
            if arena.fd not in fds:
                fds.append(arena.fd)
            regions.append(PoolRegion(name=name, component=comp, tensor=tensor, size=size, kind="fd",
                                      offset=ptr - arena.base, fd_index=fds.index(arena.fd)))
            continue
        handle, offset = _device_handle(name, ptr, gpu_id)
        regions.append(PoolRegion(name=name, component=comp, tensor=tensor, size=size, kind="cuda_ipc",
                                  handle=handle, offset=offset, device_id=gpu_id))
    return regions, fds


def _device_handle(name: str, ptr: int, gpu_id: int) -> tuple[bytes, int]:
    from ..errors import BadInput
    from ..transports.ipc_memory import export_ipc

    try:
        handle, offset, _ = export_ipc(ptr, gpu_id)
    except BadInput as exc:
        raise Unsupported(
            f"pdpair: buffer {name} at {ptr:#x} is neither a PDPair host arena nor shareable GPU memory "
            f"({exc}); host pools must be allocated through dataplane.sglang.memory"
        ) from None
    return handle, offset
