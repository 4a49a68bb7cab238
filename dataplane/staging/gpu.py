"""Gather and scatter of staged rows on a CUDA device (torch, imported lazily).

``TorchStager`` views one arena (every region of a role in one allocation, or any 1-D uint8 buffer)
and one staging buffer as ``[rows, chunk]`` and moves rows between them with ONE kernel per piece:
with ``kernel="torch"``, ``index_select(..., out=slot)`` to gather and ``index_copy_`` to scatter;
with ``kernel="triton"``, ``kernels.copy_rows``. Rows are viewed as the widest element dividing the
row (16-byte ``complex128`` for torch, 8-byte ints for Triton, down to bytes) — bits are copied, never
converted. Index arrays go host → pinned → device with a non-blocking copy on
the stager's own stream, through pinned and device index buffers kept per staging slot (so the hot
path allocates nothing); nothing here waits for the device: each call returns a CUDA event the
caller polls (``query()``) before posting the engine write or acknowledging a scatter.

A slot's index buffers are overwritten when the slot is used again, which the flow only does after
the slot's previous kernel has finished (the sender after the receiver's ack, the receiver after its
scatter event): callers outside ``flow`` must keep that rule.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from ..errors import BadInput
from .kernels import copy_rows

__all__ = ["TorchStager"]


class TorchStager:
    """Row gather / scatter between ``arena`` and ``staging`` (1-D uint8 CUDA tensors)."""

    def __init__(self, arena: Any, staging: Any, *, kernel: Literal["torch", "triton"] = "torch"):
        import torch

        for name, buf in (("arena", arena), ("staging", staging)):
            if buf.dtype != torch.uint8 or buf.dim() != 1 or not buf.is_cuda:
                raise BadInput(f"staging: {name} must be a 1-D uint8 CUDA tensor")
        self._torch = torch
        if kernel not in ("torch", "triton"):
            raise BadInput(f"staging: unknown kernel {kernel!r}")
        self.arena, self.staging, self.kernel = arena, staging, kernel
        self.stream = torch.cuda.Stream(device=arena.device)
        self._views: dict[tuple[int, int], Any] = {}
        self._index: dict[int, tuple[Any, Any]] = {}

    def gather(self, rows: np.ndarray, offset: int, chunk: int) -> Any:
        """Copy arena rows ``rows`` (in order) to staging bytes ``[offset, offset + len(rows)*chunk)``."""
        torch = self._torch
        self.stream.wait_stream(torch.cuda.current_stream(self.arena.device))
        with torch.cuda.stream(self.stream):
            idx = self.indices(rows, offset)
            out = self._rows(self.staging, chunk, offset, len(rows))
            if self.kernel == "triton":
                copy_rows(self._rows(self.arena, chunk), out, idx, self._iota(len(rows)))
            else:
                torch.index_select(self._rows(self.arena, chunk), 0, idx, out=out)
            return self._event()

    def scatter(self, rows: np.ndarray, offset: int, chunk: int) -> Any:
        """Copy staging bytes from ``offset`` (``len(rows)`` rows) to arena rows ``rows``."""
        torch = self._torch
        self.stream.wait_stream(torch.cuda.current_stream(self.arena.device))
        with torch.cuda.stream(self.stream):
            idx = self.indices(rows, offset)
            src = self._rows(self.staging, chunk, offset, len(rows))
            if self.kernel == "triton":
                copy_rows(src, self._rows(self.arena, chunk), self._iota(len(rows)), idx)
            else:
                self._rows(self.arena, chunk).index_copy_(0, idx, src)
            return self._event()

    def indices(self, rows: np.ndarray, key: int) -> Any:
        """``rows`` as a device int64 tensor, staged through ``key``'s reused pinned buffer (enqueued
        on the current stream; ``key``'s previous use must have finished)."""
        torch, n = self._torch, len(rows)
        host, dev = self._index.get(key, (None, None))
        if host is None or host.numel() < n:
            size = max(n, 1 << 12)
            host = torch.empty(size, dtype=torch.int64, pin_memory=True)
            dev = torch.empty(size, dtype=torch.int64, device=self.arena.device)
            self._index[key] = (host, dev)
        host.numpy()[:n] = rows
        return dev[:n].copy_(host[:n], non_blocking=True)

    def _iota(self, n: int) -> Any:
        return self._torch.arange(n, dtype=self._torch.int64, device=self.arena.device)

    def _event(self) -> Any:
        event = self._torch.cuda.Event()
        event.record(self.stream)
        return event

    def _rows(self, buf: Any, chunk: int, offset: int = 0, count: int | None = None) -> Any:
        """``buf[offset:]`` as ``[count, chunk/width]`` elements of the widest dtype that fits."""
        if chunk <= 0 or offset % chunk:
            raise BadInput(f"staging: offset {offset} is not a whole row of {chunk} bytes")
        n = (buf.numel() - offset) // chunk if count is None else count
        if n < 0 or offset + n * chunk > buf.numel():
            raise BadInput(f"staging: {n} rows of {chunk} B from {offset} overflow {buf.numel()} bytes")
        key = (id(buf), chunk)
        if count is None and key in self._views:
            return self._views[key]
        dtype, width = self._dtype(buf.data_ptr() + offset, chunk)
        view = buf[offset : offset + n * chunk].view(dtype).view(n, chunk // width)
        if count is None:
            self._views[key] = view
        return view

    def _dtype(self, addr: int, chunk: int) -> tuple[Any, int]:
        torch = self._torch
        wide = ((16, torch.complex128),) if self.kernel == "torch" else ()
        for width, dtype in (*wide, (8, torch.int64), (4, torch.int32), (2, torch.int16), (1, torch.uint8)):
            if chunk % width == 0 and addr % width == 0:
                return dtype, width
        raise AssertionError("unreachable: width 1 always fits")
