"""Gather and scatter of staged rows in host memory (numpy): the staged path without a GPU.

The same interface as ``gpu.TorchStager``, for pools in host memory (over TCP or CMA every write
costs a round of engine work, so staging small pages pays there too) and for CPU tests of the flow.
The copy is synchronous, so the returned event is already complete.
"""

from __future__ import annotations

import numpy as np

from ..errors import BadInput

__all__ = ["Done", "HostStager"]


class Done:
    """An event that has already happened (``query()`` is always true)."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


class HostStager:
    """Row gather / scatter between ``arena`` and ``staging`` (1-D uint8 numpy arrays)."""

    def __init__(self, arena: np.ndarray, staging: np.ndarray):
        for name, buf in (("arena", arena), ("staging", staging)):
            if buf.dtype != np.uint8 or buf.ndim != 1:
                raise BadInput(f"staging: {name} must be a 1-D uint8 array")
        self.arena, self.staging = arena, staging

    def gather(self, rows: np.ndarray, offset: int, chunk: int) -> Done:
        out = self._rows(self.staging, chunk, offset, len(rows))
        np.take(self._rows(self.arena, chunk), rows, axis=0, out=out)
        return Done()

    def scatter(self, rows: np.ndarray, offset: int, chunk: int) -> Done:
        self._rows(self.arena, chunk)[rows] = self._rows(self.staging, chunk, offset, len(rows))
        return Done()

    @staticmethod
    def _rows(buf: np.ndarray, chunk: int, offset: int = 0, count: int | None = None) -> np.ndarray:
        n = (len(buf) - offset) // chunk if count is None else count
        if chunk <= 0 or offset % chunk or n < 0 or offset + n * chunk > len(buf):
            raise BadInput(f"staging: {n} rows of {chunk} B from {offset} do not fit {len(buf)} bytes")
        return buf[offset : offset + n * chunk].reshape(n, chunk)
