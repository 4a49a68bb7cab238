"""The boundary to NIXL's SDK: the one module that imports NIXL or binds to its library.

What it holds: finding the SDK (``load_sdk``), making an agent with the progress thread's delay set
(``new_agent``), the backends' thread parameters, NIXL's errors mapped to ``dataplane.errors``, the
entry points the native poster calls (``entry_points``), and the UCX environment a process must
carry before its first NIXL agent (``ucx_environment``).

UCX reads its configuration from the environment when a backend is created, and NIXL passes on only
values without commas (its ``engine_config`` splits on them; a device list has them): so the
environment is set where a process starts (the agent's runtime, a benchmark's or test's process),
from ``ucx_environment``, never by a transport.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import threading
from types import ModuleType
from typing import Any, Literal

from ...config import NixlConfig
from ...errors import PeerGone, TransferFailed

SDK_MODULES = ("nixl_cu12._api", "nixl_cu13._api", "nixl._api")
MemType = Literal["DRAM", "VRAM"]
REMOTE_DISCONNECT = -10
"""NIXL's ``NIXL_ERR_REMOTE_DISCONNECT`` (``nixl_types.h``), as the native poster reports it."""
POST_SYMBOL = "_ZNK9nixlAgent11postXferReqEP12nixlXferReqHPK21nixlAgentOptionalArgs"
STATUS_SYMBOL = "_ZNK9nixlAgent13getXferStatusEP12nixlXferReqH"


class EntryPointsUnavailable(Exception):
    """The native poster cannot reach this NIXL build; the message says why."""


def load_sdk() -> ModuleType:
    """The first NIXL python API that imports (CUDA 12 wheel, CUDA 13 wheel, meta package)."""
    for name in SDK_MODULES:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise TransferFailed(f"NIXL is not installed (tried {', '.join(SDK_MODULES)})")


def ucx_environment(config: NixlConfig) -> dict[str, str]:
    """The UCX variables ``config`` asks for (``UCX_TLS``, ``UCX_NET_DEVICES``), for the process to
    carry before its first NIXL agent is made."""
    pairs = (("UCX_TLS", config.ucx_tls), ("UCX_NET_DEVICES", config.ucx_net_devices))
    return {var: value for var, value in pairs if value is not None}


_BUILD = threading.Lock()


def new_agent(sdk: ModuleType, name: str, conf: Any, progress_delay_us: int) -> Any:
    """``sdk.nixl_agent(name, conf)`` with the progress thread's delay set.

    NIXL's Python API hard-wires ``pthrDelay = 0``: the UCX progress thread then spins without pause,
    a whole core per agent even when idle, which starves every other thread of a small host (the
    agent's own worker, the peer process). With a delay the thread arms the UCX worker and sleeps in
    ``poll`` until an event or the delay, at ~4% of a core. The API offers no parameter for it, so the
    one bindings call that builds the agent is intercepted, under a lock, while the agent is made."""
    bind = getattr(sdk, "nixlBind", None)
    if bind is None or progress_delay_us <= 0:
        return sdk.nixl_agent(name, conf)
    build = bind.nixlAgent

    def with_delay(agent_name: str, agent_config: Any) -> Any:
        agent_config.pthrDelay = progress_delay_us
        return build(agent_name, agent_config)

    with _BUILD:
        bind.nixlAgent = with_delay
        try:
            return sdk.nixl_agent(name, conf)
        finally:
            bind.nixlAgent = build


def thread_params(backend: str, threads: int) -> dict[str, str]:
    """Backend parameters that hand every request to the backend's own ``threads`` threads.

    NIXL's UCX backend splits a request across its dedicated threads only from ``split_batch_size``
    descriptors (default 1024); a room's request has a few, so without it ``num_threads`` changes
    nothing. With it the post returns once the thread has issued the writes, and UCX copies a host
    write while that thread progresses its own worker: no Python thread waits on the copy."""
    if backend == "UCX":
        return {"num_threads": str(threads), "split_batch_size": "1"}
    key = THREAD_PARAM.get(backend)
    return {key: str(threads)} if key is not None else {}


THREAD_PARAM = {
    "OBJ": "num_threads", "LIBFABRIC": "num_threads", "GDS_MT": "thread_count", "UCCL": "num_cpus",
}
"""Each other backend's name for its thread count, as NIXL's own ``nixl_agent`` passes it."""


def mapped(exc: Exception, what: str) -> TransferFailed:
    """A NIXL exception as ours: a peer that disconnected is ``PeerGone``."""
    if type(exc).__name__ == "nixlRemoteDisconnectError":
        return PeerGone(f"nixl: {what}: peer disconnected ({exc})")
    return TransferFailed(f"nixl: {what}: {type(exc).__name__}: {exc}")


def native_failure(status: int, what: str) -> TransferFailed:
    """A NIXL status the native poster reported, as ours."""
    if status == REMOTE_DISCONNECT:
        return PeerGone(f"nixl: {what}: peer disconnected")
    return TransferFailed(f"nixl: {what} failed (NIXL status {status})")


def entry_points(binding_agent: Any) -> tuple[int, int, int]:
    """(agent pointer, postXferReq, getXferStatus) for the pybind11 ``nixlAgent`` NIXL's API holds.

    A pybind11 object of a class bound with its default holder (``std::unique_ptr``) keeps the C++
    pointer right after the object header and the holder, holding the same pointer, right after it;
    anything else there means another binding layout, and the native poster is not used."""
    base = id(binding_agent) + object.__basicsize__
    value = ctypes.c_void_p.from_address(base).value
    holder = ctypes.c_void_p.from_address(base + ctypes.sizeof(ctypes.c_void_p)).value
    if not value or value != holder:
        raise EntryPointsUnavailable("the NIXL bindings' agent object has an unexpected layout")
    path = _loaded("libnixl.so")
    lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    try:
        post, status = getattr(lib, POST_SYMBOL), getattr(lib, STATUS_SYMBOL)
    except AttributeError as exc:
        raise EntryPointsUnavailable(f"{path} lacks nixlAgent's postXferReq or getXferStatus: {exc}") from exc
    addr = ctypes.cast(post, ctypes.c_void_p).value, ctypes.cast(status, ctypes.c_void_p).value
    assert addr[0] and addr[1]
    return value, addr[0], addr[1]


def _loaded(name: str) -> str:
    """The path of a shared library this process has loaded (NIXL's wheels keep it in a private
    folder and load it from their bindings)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.rstrip("\n").split(maxsplit=5)[-1]
            if path.endswith("/" + name):
                return path
    raise EntryPointsUnavailable(f"{name} is not loaded in this process")


__all__ = [
    "EntryPointsUnavailable",
    "MemType",
    "entry_points",
    "load_sdk",
    "mapped",
    "native_failure",
    "new_agent",
    "thread_params",
    "ucx_environment",
]
