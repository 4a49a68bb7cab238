"""Host pools in shared memory: the engine allocates them, the agent maps the same pages.

An engine's pool is one shared mapping holding every region of its schema back to back (each at a
page-aligned offset), so one descriptor carries all of them. Two ways to share it:

- ``fd`` (default): an anonymous ``memfd`` passed over the local socket with ``SCM_RIGHTS``. Works
  between two containers of a pod (one kernel) with nothing mounted but the socket's volume, and the
  memory vanishes when the last process holding it exits — nothing to clean up after a crash.
- ``shm``: a named POSIX shared-memory object under ``/dev/shm`` (both containers must mount the same
  ``/dev/shm``); the engine unlinks it on ``close``.

Page size matters to the transfer itself: UCX's CMA copy into 4 KiB-page shared memory ran at
0.6-0.9 times the rate of the same copy into the huge pages the agent's own (numpy) pools get
(docs/sidecar.md), and most hosts leave shared memory's transparent huge pages off. So in ``fd`` mode
the pools are taken from the host's reserved 2 MiB huge pages (``MFD_HUGETLB``; a Kubernetes
container's ``hugepages-2Mi``) when there are enough (``huge_pages="auto"``), and from ordinary pages
otherwise, saying why.

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

from ..errors import BadInput, PDPairError
from .messages import PoolRegion

PAGE = 4096
HUGE_PAGE = 2 << 20
SHM_DIR = "/dev/shm"
MADV_POPULATE_WRITE = 23
"""Linux 5.14+: fault every page in now, failing with an error instead of the SIGBUS a later touch
of a huge page the cgroup's ``hugetlb`` limit refuses would raise."""
HugePages = Literal["auto", "always", "never"]


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
        huge_pages: HugePages = "auto",
    ):
        """``regions``: (name, component, tensor, size) per region, in the schema's canonical order.
        ``prefault`` writes every page now (``model.prefault``) instead of on first use.
        ``huge_pages``: ``auto`` takes reserved 2 MiB pages when the host has enough (``fd`` mode),
        ``always`` raises when it cannot, ``never`` does not try; ``huge`` says what was used and
        ``huge_reason`` why not."""
        if mode not in ("fd", "shm"):
            raise BadInput(f"shared pools mode must be 'fd' or 'shm', got {mode!r}")
        if huge_pages not in ("auto", "always", "never"):
            raise BadInput(f"huge_pages must be 'auto', 'always' or 'never', got {huge_pages!r}")
        offsets, total = [], 0
        for _, _, _, size in regions:
            offsets.append(total)
            total += _align(size)
        self.mode, self.size = mode, max(total, PAGE)
        self.shm_name = name or f"pdpair-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.huge, self.huge_reason = False, "not asked for (huge_pages: never)"
        self._mm: mmap.mmap | None = None
        mapped = None
        if huge_pages != "never":
            mapped, self.huge_reason = _hugetlb(self.shm_name, self.size, mode)
            if mapped is None and huge_pages == "always":
                raise PDPairError(f"shared pools: no huge pages ({self.huge_reason})")
        if mapped is not None:
            self.fd, self._mm = mapped
            self.huge, self.huge_reason, self.size = True, "", len(self._mm)
        else:
            self.fd = _open(self.shm_name, mode)
            os.ftruncate(self.fd, self.size)
            self._mm = _huge(mmap.mmap(self.fd, self.size, mmap.MAP_SHARED))
        if prefault and not self.huge:
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


def _open(name: str, mode: str) -> int:
    if mode == "fd":
        return os.memfd_create(name, os.MFD_CLOEXEC)
    return os.open(os.path.join(SHM_DIR, name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)


def _hugetlb(name: str, size: int, mode: str) -> tuple[tuple[int, mmap.mmap] | None, str]:
    """A memfd of 2 MiB huge pages, every page faulted in (zeroed) now, or None and the reason. The
    shared mapping reserves its pages at ``mmap`` (ENOMEM when the host has too few free) and
    ``MADV_POPULATE_WRITE`` charges them to this process's cgroup now, with an error rather than a
    SIGBUS later — in the agent's process, which has no huge-page limit of its own in a pod."""
    if mode != "fd":
        return None, "huge pages need the fd mode (named /dev/shm objects are ordinary pages)"
    flags = getattr(os, "MFD_HUGETLB", 0)
    if not flags:
        return None, "this platform has no MFD_HUGETLB"
    size = -(-size // HUGE_PAGE) * HUGE_PAGE
    try:
        fd = os.memfd_create(name, os.MFD_CLOEXEC | flags)
    except OSError as exc:
        return None, f"memfd_create(MFD_HUGETLB): {exc.strerror}"
    mm = None
    try:
        os.ftruncate(fd, size)
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED)
        mm.madvise(MADV_POPULATE_WRITE)
        return (fd, mm), ""
    except OSError as exc:
        if mm is not None:
            mm.close()
        os.close(fd)
        why = f"{exc.strerror}; host free: {huge_pages('free') * 2} MiB"
        return None, f"{size >> 20} MiB of 2 MiB huge pages not available ({why})"


def huge_pages(count: Literal["free", "nr", "nr_overcommit"] = "free") -> int:
    """The host's 2 MiB huge pages: free, reserved (``nr``) or allowed beyond that (0 where unknown)."""
    try:
        with open(f"/sys/kernel/mm/hugepages/hugepages-2048kB/{count}_hugepages") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 0


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
