"""The few CUDA runtime calls the GPU paths make themselves, through ctypes (HIP's twins on ROCm).

``libcudart`` is the one torch already loaded when it is in the process (same soname), else the
system's; ``libamdhip64`` on ROCm, where every call is ``hip*`` with the same arguments and error
codes. A call costs about a microsecond here, where torch's ``Event``/``Stream`` wrappers cost several
(measured in the agent, docs/gpu.md): the ``cuda-ipc`` transport makes six per batch.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache
from typing import Any

from ..errors import BadInput

NOT_READY = 600
"""cudaErrorNotReady / hipErrorNotReady: an event's work is still running."""
H2D, D2H, D2D = 1, 2, 3
"""cudaMemcpyKind (hipMemcpyKind has the same values)."""


class CudaError(RuntimeError):
    """A runtime call returned an error code."""


@cache
def library() -> tuple[Any, str]:
    """(libcudart or libamdhip64, its call prefix), loaded on first use; ``BadInput`` without either."""
    for name in ("cudart", "amdhip64"):
        path = ctypes.util.find_library(name)
        for candidate in [path] if path else [f"lib{name}.so", f"lib{name}.so.13", f"lib{name}.so.12"]:
            try:
                lib = ctypes.CDLL(candidate)
            except OSError:
                continue
            return lib, "cuda" if name == "cudart" else "hip"
    raise BadInput("GPU memory paths need libcudart (CUDA) or libamdhip64 (ROCm) in the process")


class Runtime:
    """Events, stream ordering and async copies on raw handles (``torch.cuda.Stream.cuda_stream``)."""

    def __init__(self) -> None:
        lib, p = library()
        self.prefix = p
        vp, sz = ctypes.c_void_p, ctypes.c_size_t

        def bind(name: str, *argtypes: Any) -> Any:
            fn = getattr(lib, p + name)
            fn.argtypes, fn.restype = list(argtypes), ctypes.c_int
            return fn

        self._set_device = bind("SetDevice", ctypes.c_int)
        self._memcpy = bind("MemcpyAsync", vp, vp, sz, ctypes.c_int, vp)
        self._create = bind("EventCreateWithFlags", ctypes.POINTER(vp), ctypes.c_uint)
        self._record = bind("EventRecord", vp, vp)
        self._wait = bind("StreamWaitEvent", vp, vp, ctypes.c_uint)
        self._query = bind("EventQuery", vp)
        self._destroy = bind("EventDestroy", vp)

    def _check(self, rc: int, what: str) -> None:
        if rc:
            raise CudaError(f"{self.prefix}{what} failed with error {rc}")

    def set_device(self, device_id: int) -> None:
        """The calling thread's device (each thread has its own; kernels launch on it)."""
        self._check(self._set_device(device_id), f"SetDevice({device_id})")

    def memcpy(self, dst: int, src: int, nbytes: int, kind: int, stream: int) -> None:
        self._check(self._memcpy(dst, src, nbytes, kind, stream), f"MemcpyAsync({nbytes} B)")

    def event(self) -> int:
        """A new event without timing (the cheaper kind)."""
        ev = ctypes.c_void_p()
        self._check(self._create(ctypes.byref(ev), 2), "EventCreateWithFlags")  # DisableTiming
        return int(ev.value or 0)

    def record(self, event: int, stream: int) -> None:
        self._check(self._record(event, stream), "EventRecord")

    def wait(self, stream: int, event: int) -> None:
        """``stream`` runs nothing queued after this until ``event``'s work is done."""
        self._check(self._wait(stream, event, 0), "StreamWaitEvent")

    def done(self, event: int) -> bool:
        rc = self._query(event)
        if rc == NOT_READY:
            return False
        self._check(rc, "EventQuery")
        return True

    def destroy(self, event: int) -> None:
        self._destroy(event)


@cache
def runtime() -> Runtime:
    return Runtime()


__all__ = ["D2D", "D2H", "H2D", "CudaError", "Runtime", "library", "runtime"]
