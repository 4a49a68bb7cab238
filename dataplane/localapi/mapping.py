"""The agent maps the engine's pools: ``RegisterPools`` regions → one buffer per schema region.

Every region must match the agent's schema (same canonical order, name, component, tensor and size),
so the transport registers exactly the engine's regions and nothing else: the planner's and the
transport's bounds checks then keep every write inside memory the engine registered.

- ``fd`` / ``shm``: host memory, mapped shared (``shm.map_fd`` / ``shm.map_named``), numpy views.
- ``cuda_ipc``: ``cudaIpcOpenMemHandle`` through CuPy when installed, else ctypes on ``libcudart``
  (no torch needed), wrapped as a ``DeviceBuffer`` that the pools and the transport read address and
  size from.
  Closing calls ``cudaIpcCloseMemHandle``. On AMD the same calls exist in ``libamdhip64`` as ``hipIpc*``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import BadInput, SchemaError
from ..schema import RoleSchema
from .messages import PoolRegion
from .shm import Mapping, map_fd, map_named


class DeviceBuffer:
    """A device allocation's address and size, duck-typed like a flat uint8 tensor for the pools."""

    def __init__(self, ptr: int, size: int, device_id: int):
        self.ptr, self.size, self.device_id = ptr, size, device_id

    def numel(self) -> int:
        return self.size

    def element_size(self) -> int:
        return 1

    def data_ptr(self) -> int:
        return self.ptr

    def is_contiguous(self) -> bool:
        return True

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": (self.size,), "typestr": "|u1", "data": (self.ptr, False), "version": 3}


class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


def _cudart() -> Any:
    """libcudart (or libamdhip64), loaded on first use; error if neither is present."""
    for name in ("cudart", "amdhip64"):
        path = ctypes.util.find_library(name)
        for candidate in [path] if path else [f"lib{name}.so", f"lib{name}.so.13", f"lib{name}.so.12"]:
            try:
                lib = ctypes.CDLL(candidate)
            except OSError:
                continue
            prefix = "cuda" if name == "cudart" else "hip"
            return lib, prefix
    raise BadInput("cuda_ipc regions need libcudart (CUDA) or libamdhip64 (ROCm) in the agent")


def open_ipc(handle: bytes, device_id: int) -> tuple[int, Callable[[], None]]:
    """Open an IPC memory handle on ``device_id``: (device pointer, closer). CuPy's runtime bindings
    when CuPy is installed (they find the CUDA runtime wherever it lives), else ctypes."""
    if len(handle) != 64:
        raise BadInput(f"IPC handle must be 64 bytes, got {len(handle)}")
    try:
        import cupy
    except ImportError:
        return _open_ipc_ctypes(handle, device_id)
    try:
        with cupy.cuda.Device(device_id):
            ptr = int(cupy.cuda.runtime.ipcOpenMemHandle(handle, 1))
    except Exception as exc:  # cupy raises its own CUDARuntimeError
        raise BadInput(f"cudaIpcOpenMemHandle failed: {exc}") from exc
    return ptr, lambda: cupy.cuda.runtime.ipcCloseMemHandle(ptr)


_NO_DEVICE = {100: "no device", 101: "invalid device ordinal"}
"""cudaErrorNoDevice / cudaErrorInvalidDevice; HIP uses the same codes."""


def _open_ipc_ctypes(handle: bytes, device_id: int) -> tuple[int, Callable[[], None]]:
    lib, p = _cudart()
    rc = getattr(lib, f"{p}SetDevice")(ctypes.c_int(device_id))
    if rc in _NO_DEVICE:
        raise BadInput(
            f"{p}SetDevice({device_id}) failed with error {rc} ({_NO_DEVICE[rc]}): this container sees "
            "no such GPU, so it cannot open the engine's IPC handles; the engine and the agent must share "
            "the device (in Kubernetes: resources.gpuAllocation 'dra', docs/operator.md)"
        )
    if rc:
        raise BadInput(f"{p}SetDevice({device_id}) failed with error {rc}")
    ptr = ctypes.c_void_p()
    h = _IpcHandle()
    ctypes.memmove(ctypes.addressof(h), handle, 64)
    rc = getattr(lib, f"{p}IpcOpenMemHandle")(ctypes.byref(ptr), h, ctypes.c_uint(1))
    if rc or not ptr.value:
        raise BadInput(f"{p}IpcOpenMemHandle failed with error {rc}")
    value = int(ptr.value)
    return value, lambda: getattr(lib, f"{p}IpcCloseMemHandle")(ctypes.c_void_p(value))


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
