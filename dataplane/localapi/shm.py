"""Host pools in shared memory: the engine allocates them, the agent maps the same pages.

An engine's pool is one shared mapping holding every region of its schema back to back (each at a
page-aligned offset), so one descriptor carries all of them. Two ways to share it:

- ``fd`` (default): an anonymous ``memfd`` passed over the local socket with ``SCM_RIGHTS``. Works
  between two containers of a pod (one kernel) with nothing mounted but the socket's volume, and the
  memory vanishes when the last process holding it exits — nothing to clean up after a crash.
- ``shm``: a named POSIX shared-memory object under ``/dev/shm`` (both containers must mount the same
  ``/dev/shm``); the engine unlinks it on ``close``.

``map_region`` is the agent's half: it maps what a ``PoolRegion`` names, read-write, and returns a
``Mapping`` whose ``close`` unmaps once every view is dropped. Only numpy and the standard library here.
"""

from __future__ import annotations

import contextlib
import gc
import mmap
import os
import uuid
from collections.abc import Sequence
from typing import Literal

import numpy as np

from ..errors import BadInput
from .messages import PoolRegion

PAGE = 4096
SHM_DIR = "/dev/shm"


def _align(n: int) -> int:
    return -(-n // PAGE) * PAGE


class SharedPools:
    """Engine side: one shared mapping, a numpy uint8 view per region (``buffers``), and the
    ``PoolRegion`` records (``regions``) plus descriptors (``fds``) to hand the agent."""

    def __init__(
        self,
        regions: Sequence[tuple[str, int, int, int]],
        *,
        mode: Literal["fd", "shm"] = "fd",
        name: str | None = None,
        prefault: bool = False,
    ):
        """``regions``: (name, component, tensor, size) per region, in the schema's canonical order.
        ``prefault`` writes every page now (``model.prefault``) instead of on first use."""
        if mode not in ("fd", "shm"):
            raise BadInput(f"shared pools mode must be 'fd' or 'shm', got {mode!r}")
        offsets, total = [], 0
        for _, _, _, size in regions:
            offsets.append(total)
            total += _align(size)
        self.mode, self.size = mode, max(total, PAGE)
        self.shm_name = name or f"pdpair-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        if mode == "fd":
            self.fd = os.memfd_create(self.shm_name, os.MFD_CLOEXEC)
        else:
            path = os.path.join(SHM_DIR, self.shm_name)
            self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.ftruncate(self.fd, self.size)
        self._mm: mmap.mmap | None = _huge(mmap.mmap(self.fd, self.size, mmap.MAP_SHARED))
        if prefault:
            np.frombuffer(self._mm, dtype=np.uint8).fill(0)
        self.buffers = [
            np.frombuffer(self._mm, dtype=np.uint8, count=size, offset=off)
            for (_, _, _, size), off in zip(regions, offsets, strict=True)
        ]
        self.regions = tuple(
            PoolRegion(
                name=n, component=c, tensor=t, size=s, kind=mode, offset=off,
                shm_name=self.shm_name if mode == "shm" else "",
            )
            for (n, c, t, s), off in zip(regions, offsets, strict=True)
        )

    @property
    def fds(self) -> list[int]:
        """Descriptors to pass with ``RegisterPools`` (none for named shared memory)."""
        return [self.fd] if self.mode == "fd" and self._mm is not None else []

    def close(self) -> None:
        """Drop the views, unmap, close the descriptor and (named mode) unlink; idempotent. A view
        still referenced elsewhere keeps its pages mapped until it dies (numpy holds the mapping)."""
        if self._mm is None:
            return
        self.buffers = []
        gc.collect()
        with contextlib.suppress(BufferError):
            self._mm.close()
        self._mm = None
        os.close(self.fd)
        if self.mode == "shm":
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(SHM_DIR, self.shm_name))

    def __enter__(self) -> SharedPools:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Mapping:
    """Agent side: one mapped shared object and the views handed out of it."""

    def __init__(self, mm: mmap.mmap, label: str):
        self.mm: mmap.mmap | None = mm
        self.label = label

    def view(self, offset: int, size: int) -> np.ndarray:
        if self.mm is None:
            raise BadInput(f"{self.label}: mapping is closed")
        if offset + size > len(self.mm):
            raise BadInput(f"{self.label}: region [{offset}, +{size}) outside the {len(self.mm)}-byte object")
        return np.frombuffer(self.mm, dtype=np.uint8, count=size, offset=offset)

    def close(self) -> bool:
        """Unmap; False (and still mapped) while some view is alive somewhere."""
        if self.mm is None:
            return True
        gc.collect()
        try:
            self.mm.close()
        except BufferError:
            return False
        self.mm = None
        return True


def _huge(mm: mmap.mmap) -> mmap.mmap:
    """Ask for transparent huge pages on a pool mapping. The agent's own (numpy) pools get them by
    default; shared memory only where the host allows it (``/sys/kernel/mm/transparent_hugepage/
    shmem_enabled`` = ``advise`` or ``within_size``) — with 4 KiB pages a 16 MiB copy between two
    shared pools ran at half the speed of the same copy between the agent's own pools."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None:
        with contextlib.suppress(OSError):
            mm.madvise(advice)
    return mm


def map_fd(fd: int, label: str) -> Mapping:
    """Map a whole shared object by descriptor (read-write, shared). The caller closes ``fd``."""
    size = os.fstat(fd).st_size
    if size <= 0:
        raise BadInput(f"{label}: shared object is empty")
    return Mapping(_huge(mmap.mmap(fd, size, mmap.MAP_SHARED)), label)


def map_named(name: str) -> Mapping:
    """Map the POSIX shared-memory object ``name`` (no path separators allowed)."""
    if not name or "/" in name or name in (".", ".."):
        raise BadInput(f"shared memory name {name!r} is not a plain name")
    try:
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
    except OSError as exc:
        raise BadInput(f"cannot open shared memory {name!r}: {exc.strerror}") from exc
    try:
        return map_fd(fd, name)
    finally:
        os.close(fd)
