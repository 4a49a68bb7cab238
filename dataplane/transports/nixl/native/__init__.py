"""The native posting thread for NIXL (``nixl_poster.cpp``): built on first use, loaded with ctypes.

Why native: UCX copies a host write inside NIXL's ``postXferReq``, and from a Python thread each copy
must take the GIL back afterwards (py-spy on a 16-core host: 14-15% of the posting thread's time),
while the role worker polls every running transfer. This thread posts, polls and signals finished
transfers through an eventfd without the GIL; the worker sleeps until it fires.

The library has no link-time dependency on NIXL or Python: it is handed the NIXL agent's C++ pointer
and the addresses of ``nixlAgent::postXferReq`` and ``getXferStatus`` (``sdk.entry_points``, which
checks them first); the adapter falls back to the Python posting thread when anything is missing —
no compiler, another NIXL build — with the reason in its log.

Where the library goes: ``$PDPAIR_NATIVE_DIR``, else ``_build/`` beside the source when writable (the
image builds it there: ``python -P -m dataplane.transports.nixl.native``), else ``~/.cache/pdpair``;
its name carries the source's hash, so an edited source is rebuilt.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

SOURCE = Path(__file__).with_name("nixl_poster.cpp")
FLAGS = ("-O2", "-std=c++17", "-shared", "-fPIC", "-pthread")


class NativeUnavailable(Exception):
    """The native poster cannot be used here; the message says why."""


def _name() -> str:
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode()).hexdigest()[:12]
    return f"libpdpair_nixl_poster-{digest}.so"


def _dirs() -> list[Path]:
    env = os.environ.get("PDPAIR_NATIVE_DIR")
    if env:
        return [Path(env)]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pdpair"
    return [SOURCE.parent / "_build", cache]


def build(into: Path | None = None) -> Path:
    """Compile the library (once per source version) and return its path."""
    name = _name()
    candidates = [into] if into is not None else _dirs()
    for folder in candidates:
        if (folder / name).is_file():
            return folder / name
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise NativeUnavailable("no C++ compiler (g++ or c++) to build the native poster")
    errors = []
    for folder in candidates:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
            os.close(fd)
        except OSError as exc:
            errors.append(f"{folder}: {exc}")
            continue
        try:
            try:
                run = subprocess.run(
                    [compiler, *FLAGS, "-o", tmp, str(SOURCE)], capture_output=True, text=True, timeout=120
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise NativeUnavailable(f"building the native poster with {compiler}: {exc}") from exc
            if run.returncode != 0:
                raise NativeUnavailable(f"building the native poster failed: {run.stderr.strip()[-2000:]}")
            os.replace(tmp, folder / name)  # atomic: a concurrent build of the same source is identical
            for stale in folder.glob("libpdpair_nixl_poster-*.so"):
                if stale.name != name:  # an older source's build (unlinking a loaded one is harmless)
                    stale.unlink(missing_ok=True)
            return folder / name
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    raise NativeUnavailable(f"no writable folder for the native poster: {'; '.join(errors)}")


@functools.cache
def library() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(build()))
    vp, u64, i32 = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int
    lib.pdpair_poster_open.argtypes = [vp, vp, vp, i32, ctypes.c_long]
    lib.pdpair_poster_open.restype = vp
    lib.pdpair_poster_submit.argtypes = [vp, u64, ctypes.POINTER(vp), i32]
    lib.pdpair_poster_submit.restype = None
    lib.pdpair_poster_take.argtypes = [vp, ctypes.POINTER(u64), ctypes.POINTER(ctypes.c_int32), i32]
    lib.pdpair_poster_take.restype = i32
    lib.pdpair_poster_cancel.argtypes = [vp, u64, i32]
    lib.pdpair_poster_cancel.restype = i32
    lib.pdpair_poster_reported.argtypes = [vp]
    lib.pdpair_poster_reported.restype = vp
    lib.pdpair_poster_close.argtypes = [vp, i32]
    lib.pdpair_poster_close.restype = i32
    return lib


class NativePoster:
    """One native thread that posts queued transfers in order and reports the finished ones.

    ``efd`` (an eventfd, non-blocking) becomes readable when finished transfers wait in ``take``."""

    TAKE = 64

    def __init__(self, entry: tuple[int, int, int], efd: int, max_pause_us: int = 200):
        """``entry``: the agent's C++ pointer, ``postXferReq`` and ``getXferStatus``
        (``sdk.entry_points``)."""
        self._lock = threading.Lock()
        """Held around every call into the queue: ``close`` (from another thread at shutdown) never
        frees it under a call of the role worker's."""
        self.stuck = False
        """A cancel timed out: the thread is inside a NIXL call that does not return. Later cancels
        do not wait again, and a failed ``close`` leaves the thread its memory."""
        self._lib = library()
        agent, post, status = entry
        self._q = self._lib.pdpair_poster_open(agent, post, status, efd, max_pause_us)
        self._tokens = (ctypes.c_uint64 * self.TAKE)()
        self._statuses = (ctypes.c_int32 * self.TAKE)()
        self._reported = ctypes.c_uint64.from_address(self._lib.pdpair_poster_reported(self._q))
        self._seen = 0
        self.posted = 0
        """Transfers submitted so far."""

    def submit(self, token: int, handles: list[int]) -> None:
        n = len(handles)
        with self._lock:
            if self._q is None:
                raise NativeUnavailable("the native poster is closed")
            self._lib.pdpair_poster_submit(self._q, token, (ctypes.c_void_p * n)(*handles), n)
        self.posted += 1

    def take(self) -> list[tuple[int, int]]:
        """Finished transfers: (token, 0 = done, or NIXL's negative status)."""
        out: list[tuple[int, int]] = []
        with self._lock:
            if self._q is None:  # closed: its memory is gone
                return out
            reported = self._reported.value
            if reported == self._seen:
                return out
            self._seen = reported
            while True:
                n = self._lib.pdpair_poster_take(self._q, self._tokens, self._statuses, self.TAKE)
                out += zip(self._tokens[:n], self._statuses[:n], strict=True)
                if n < self.TAKE:
                    return out

    def cancel(self, token: int, wait_ms: int = 2000) -> bool:
        """Stop touching a transfer: True when its handles are the caller's to release, False when the
        thread was still inside NIXL with it after ``wait_ms`` (or is known to be stuck there, or
        the queue is closed): the handles must then be left, not released."""
        with self._lock:
            if self._q is None:
                return False
            ok = self._lib.pdpair_poster_cancel(self._q, token, 0 if self.stuck else wait_ms) >= 0
            self.stuck = not ok
        return ok

    def close(self, wait_ms: int = 10_000) -> bool:
        """Stop the thread; False when it was stuck inside NIXL (it is left running, detached, with
        the queue's memory)."""
        with self._lock:
            q, self._q = self._q, None
            if q is None:
                return not self.stuck
            if self._lib.pdpair_poster_close(q, wait_ms) != 0:
                self.stuck = True
        return not self.stuck


__all__ = ["NativePoster", "NativeUnavailable", "build", "library"]
