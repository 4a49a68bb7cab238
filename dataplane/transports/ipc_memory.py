"""CUDA (and HIP) IPC memory handles through the runtime, without torch: open a peer's, export ours.

The engine's pools reach the sidecar agent this way (``localapi.mapping``), and the ``cuda-ipc``
transport maps its peer's regions with the same calls. ``open_ipc`` uses CuPy's runtime bindings when
CuPy is installed, else ctypes on ``libcudart`` (``libamdhip64`` on ROCm, where the calls are
``hipIpc*``). ``export_ipc`` also needs the driver's ``cuMemGetAddressRange`` (``hipMemGetAddressRange``)
to find the allocation a pointer lies in: a handle names a whole allocation, and the peer adds the
offset. Memory this process opened from another's handle (a sidecar agent's view of the engine's pools)
has no handle of its own — ``cudaIpcGetMemHandle`` refuses it — so ``export_ipc`` hands on the handle it
was opened from, which any third process can open.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any

from ..errors import BadInput
from .cudart import library


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


_OPENED: dict[int, bytes] = {}
"""Base of each open mapping of another process's allocation → the handle it was opened from; an entry
lives as long as its mapping (one per open handle, so bounded by them)."""
_OPENED_LOCK = threading.Lock()


class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


def open_ipc(handle: bytes, device_id: int) -> tuple[int, Callable[[], None]]:
    """Open an IPC memory handle on ``device_id``: (device pointer, closer). CuPy's runtime bindings
    when CuPy is installed (they find the CUDA runtime wherever it lives), else ctypes."""
    if len(handle) != 64:
        raise BadInput(f"IPC handle must be 64 bytes, got {len(handle)}")
    try:
        import cupy
    except ImportError:
        ptr, close = _open_ipc_ctypes(handle, device_id)
    else:
        try:
            with cupy.cuda.Device(device_id):
                ptr = int(cupy.cuda.runtime.ipcOpenMemHandle(handle, 1))
        except Exception as exc:  # cupy raises its own CUDARuntimeError
            raise BadInput(f"cudaIpcOpenMemHandle failed: {exc}") from exc
        close = lambda: cupy.cuda.runtime.ipcCloseMemHandle(ptr)  # noqa: E731
    with _OPENED_LOCK:
        _OPENED[ptr] = bytes(handle)

    def closer() -> None:
        with _OPENED_LOCK:
            _OPENED.pop(ptr, None)
        close()

    return ptr, closer


_NO_DEVICE = {100: "no device", 101: "invalid device ordinal"}
"""cudaErrorNoDevice / cudaErrorInvalidDevice; HIP uses the same codes."""


def _open_ipc_ctypes(handle: bytes, device_id: int) -> tuple[int, Callable[[], None]]:
    lib, p = library()
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


def export_ipc(ptr: int, device_id: int) -> tuple[bytes, int, int]:
    """The IPC handle of the allocation holding device pointer ``ptr``: (handle, offset of ``ptr`` in
    the allocation, allocation size). The caller's process must keep the allocation alive."""
    lib, p = library()
    rc = getattr(lib, f"{p}SetDevice")(ctypes.c_int(device_id))
    if rc:
        raise BadInput(f"{p}SetDevice({device_id}) failed with error {rc}")
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    if p == "hip":
        rc = lib.hipMemGetAddressRange(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr))
    else:
        rc = _libcuda().cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr))
    if rc or not base.value:
        raise BadInput(f"{ptr:#x} is not device memory this process allocated (address range error {rc})")
    with _OPENED_LOCK:
        opened = _OPENED.get(base.value)
    if opened is not None:
        return opened, ptr - base.value, int(size.value)
    h = _IpcHandle()
    rc = getattr(lib, f"{p}IpcGetMemHandle")(ctypes.byref(h), ctypes.c_void_p(base.value))
    if rc:
        raise BadInput(
            f"{p}IpcGetMemHandle failed with error {rc} for the allocation at {base.value:#x} (memory from "
            "a virtual-memory allocator, e.g. torch's expandable segments, has no legacy IPC handle)"
        )
    return ctypes.string_at(ctypes.addressof(h), 64), ptr - base.value, int(size.value)


def _libcuda() -> Any:
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise BadInput(f"exporting CUDA IPC handles needs the CUDA driver (libcuda.so.1): {exc}") from exc
