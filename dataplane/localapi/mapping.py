"""The agent maps the engine's pools: ``RegisterPools`` regions → one buffer per schema region.

Every region must match the agent's schema (same canonical order, name, component, tensor and size),
so the transport registers exactly the engine's regions and nothing else: the planner's and the
transport's bounds checks then keep every write inside memory the engine registered.

- ``fd`` / ``shm``: host memory, mapped shared (``shm.map_fd`` / ``shm.map_named``), numpy views.
- ``cuda_ipc``: ``transports.ipc_memory.open_ipc`` (CuPy when installed, else ctypes on ``libcudart``
  or ``libamdhip64``; no torch needed), wrapped as a ``DeviceBuffer`` that the pools and the transport
  read address and size from.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import BadInput, SchemaError
from ..schema import RoleSchema
from ..transports.ipc_memory import DeviceBuffer, open_ipc
from .messages import PoolRegion
from .shm import Mapping, map_fd, map_named


class MappedPools:
    """The buffers (canonical order) plus what unmaps them; ``close`` after the transport forgot them."""

    def __init__(self) -> None:
        self.buffers: list[Any] = []
        self.device = "cpu"
        self.device_id = 0
        self._mappings: list[Mapping] = []
        self._closers: list[Callable[[], None]] = []

    def close(self) -> bool:
        """Unmap everything; False if some host view is still referenced (then retry later)."""
        self.buffers = []
        ok = all([m.close() for m in self._mappings])
        for closer in self._closers:
            closer()
        self._closers = []
        return ok


def check_regions(schema: RoleSchema, regions: Sequence[PoolRegion]) -> None:
    want = schema.regions()
    if len(regions) != len(want):
        raise SchemaError(f"engine registered {len(regions)} regions, the agent's schema has {len(want)}")
    for i, (got, exp) in enumerate(zip(regions, want, strict=True)):
        if (got.name, got.component, got.tensor, got.size) != (exp.name, exp.component, exp.tensor, exp.size):
            raise SchemaError(
                f"region {i}: engine has {got.name} (component {got.component}, tensor {got.tensor}, "
                f"{got.size} B), the agent's schema expects {exp.name} (component {exp.component}, "
                f"tensor {exp.tensor}, {exp.size} B)"
            )
    kinds = {r.kind == "cuda_ipc" for r in regions}
    if len(kinds) > 1:
        raise BadInput("an engine's regions must be all host memory or all device memory")


def map_pools(schema: RoleSchema, regions: Sequence[PoolRegion], fds: Sequence[int]) -> MappedPools:
    """Map every region; on any error everything already mapped is closed again. Takes ownership of
    ``fds`` (closed before returning: the mappings keep the memory alive)."""
    out = _Mapper(fds)
    try:
        check_regions(schema, regions)
        out.pools.buffers = [out.map(r) for r in regions]
        return out.pools
    except BaseException:
        out.pools.close()
        raise
    finally:
        for fd in fds:
            os.close(fd)


class _Mapper:
    """Maps each shared object or IPC allocation once, however many regions live in it."""

    def __init__(self, fds: Sequence[int]):
        self.fds = fds
        self.pools = MappedPools()
        self.host: dict[int | str, Mapping] = {}
        self.device: dict[bytes, int] = {}

    def map(self, r: PoolRegion) -> Any:
        if r.kind == "cuda_ipc":
            return self._device(r)
        key: int | str = r.fd_index if r.kind == "fd" else r.shm_name
        if key not in self.host:
            if r.kind == "fd" and r.fd_index >= len(self.fds):
                raise BadInput(f"{r.name}: descriptor {r.fd_index} not passed ({len(self.fds)} received)")
            self.host[key] = map_fd(self.fds[r.fd_index], r.name) if r.kind == "fd" else map_named(r.shm_name)
            self.pools._mappings.append(self.host[key])
        return self.host[key].view(r.offset, r.size)

    def _device(self, r: PoolRegion) -> DeviceBuffer:
        if r.handle not in self.device:
            ptr, closer = open_ipc(r.handle, r.device_id)
            self.device[r.handle] = ptr
            self.pools._closers.append(closer)
        self.pools.device, self.pools.device_id = "cuda", r.device_id
        return DeviceBuffer(self.device[r.handle] + r.offset, r.size, r.device_id)
