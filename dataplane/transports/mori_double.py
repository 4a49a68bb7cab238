"""THE MoRI HARDWARE TEST DOUBLE — for tests only; production code never imports it.

MoRI-IO needs AMD GPUs, ROCm and RDMA NICs, none of which exist where PDPair's tests run. This module
is the one test double the project allows: a pure-Python stand-in for the part of ``mori.io`` (amd-mori
1.2.4) that ``MoriTransport`` uses, injected through ``MoriTransport(..., sdk=mori_double)``. It moves
bytes between engines *of one process* (``ctypes.memmove`` between registered buffers, engines found
through a process-local registry by key), and its ``pack()`` / ``unpack()`` produce mori 1.2.4's exact
msgpack layouts (checked against the golden vectors in ``shared/vectors``).

Failure injection lives here and only here, on the double's engines: ``freeze()`` (writes to it stay
in progress forever, like a stopped peer), ``kill()`` (it vanishes; engines that registered it see
failed writes and ``pop_peer_failure()`` reports its key).
"""

from __future__ import annotations

import ctypes
import enum
import itertools
import os
import socket
import time
import weakref
from dataclasses import astuple, dataclass
from typing import Any

import msgspec

_ENGINES: weakref.WeakValueDictionary[str, IOEngine] = weakref.WeakValueDictionary()
_IDS = itertools.count(1)


def engine(key: str) -> IOEngine:
    """The live engine named ``key`` (tests reach the failure knobs through it)."""
    return _ENGINES[key]


class BackendType(enum.Enum):
    XGMI = 0
    RDMA = 1
    TCP = 2


class PollCqMode(enum.Enum):
    POLLING = 0
    EVENT = 1


class MemoryLocationType(enum.IntEnum):
    CPU = 0
    GPU = 1


class StatusCode(enum.IntEnum):
    SUCCESS = 0
    INIT = 1
    IN_PROGRESS = 2
    ERR_INVALID_ARGS = 3
    ERR_NOT_FOUND = 4
    ERR_BAD_STATE = 5


@dataclass
class IOEngineConfig:
    host: str = "127.0.0.1"
    port: int = 0


@dataclass
class RdmaBackendConfig:
    qp_per_transfer: int = 1
    post_batch_size: int = -1
    num_worker_threads: int = 1
    poll_cq_mode: PollCqMode = PollCqMode.POLLING
    enable_notification: bool = False


def _pack(obj: Any) -> bytes:
    return msgspec.msgpack.encode(list(astuple(obj)))


@dataclass
class EngineDesc:
    key: str
    node_id: str
    hostname: str
    host: str
    port: int
    pid: int

    def pack(self) -> bytes:
        return _pack(self)

    @staticmethod
    def unpack(blob: bytes) -> EngineDesc:
        return EngineDesc(*msgspec.msgpack.decode(blob))


@dataclass
class MemoryDesc:
    engine_key: str
    id: int
    device_id: int
    device_bus_id: str
    data: int
    size: int
    loc: int
    ipc_handle: bytes = bytes(64)
    numa_node: int = 0
    ipc_offset: int = 0
    fabric_handle: bytes = bytes(64)
    vpod_id: int = -1
    vpod_ppod_id: str = ""
    fabric_offset: int = 0
    fabric_alloc_size: int = 0

    def pack(self) -> bytes:
        return _pack(self)

    @staticmethod
    def unpack(blob: bytes) -> MemoryDesc:
        return MemoryDesc(*msgspec.msgpack.decode(blob))


class TransferStatus:
    def __init__(self, code: StatusCode = StatusCode.IN_PROGRESS, message: str = "") -> None:
        self._code, self._message = code, message

    # mori's method names, kept as they are.
    def Code(self) -> StatusCode:
        return self._code

    def Message(self) -> str:
        return self._message

    def InProgress(self) -> bool:
        return self._code in (StatusCode.INIT, StatusCode.IN_PROGRESS)

    def Succeeded(self) -> bool:
        return self._code == StatusCode.SUCCESS

    def Failed(self) -> bool:
        return not (self.InProgress() or self.Succeeded())

    def WaitFor(self, timeout_ms: int) -> StatusCode:
        if self.InProgress():
            time.sleep(timeout_ms / 1000)
        return self._code


class IOEngine:
    """One engine; ``frozen`` and ``kill()`` are the failure-injection knobs."""

    def __init__(self, key: str, config: IOEngineConfig) -> None:
        if key in _ENGINES:
            raise RuntimeError(f"engine key {key!r} already exists")
        self.key, self.config = key, config
        self.frozen = False
        self.batch_calls: list[tuple[Any, ...]] = []
        """Every ``batch_write`` call's arguments, for tests that check how the adapter batches."""
        self.backends: dict[BackendType, RdmaBackendConfig] = {}
        self._memory: dict[int, MemoryDesc] = {}
        self._remotes: dict[str, EngineDesc] = {}
        self._failures: list[str] = []
        self._uids = itertools.count(1)
        _ENGINES[key] = self

    def get_engine_desc(self) -> EngineDesc:
        host = socket.gethostname()
        return EngineDesc(self.key, f"node-{host}", host, self.config.host, self.config.port, os.getpid())

    def create_backend(self, kind: BackendType, config: RdmaBackendConfig | None = None) -> None:
        if kind is not BackendType.RDMA:
            raise RuntimeError(
                f"mori 1.2.4 implements only the RDMA backend; {kind.name} is an unimplemented enum"
            )
        self.backends[kind] = config or RdmaBackendConfig()

    def register_memory(self, ptr: int, size: int, device_id: int, loc: MemoryLocationType) -> MemoryDesc:
        bus = "0000:05:00.0" if loc == MemoryLocationType.GPU else ""
        desc = MemoryDesc(self.key, next(_IDS), device_id, bus, ptr, size, int(loc))
        self._memory[desc.id] = desc
        return desc

    def deregister_memory(self, desc: MemoryDesc) -> None:
        self._memory.pop(desc.id, None)

    def register_remote_engine(self, desc: EngineDesc) -> None:
        self._remotes[desc.key] = desc

    def deregister_remote_engine(self, desc: EngineDesc) -> None:
        self._remotes.pop(desc.key, None)

    def allocate_transfer_uid(self) -> int:
        return next(self._uids)

    def pop_peer_failure(self) -> str | None:
        return self._failures.pop(0) if self._failures else None

    def batch_write(
        self, local_descs: list[MemoryDesc], local_offsets: list[list[int]], remote_descs: list[MemoryDesc],
        remote_offsets: list[list[int]], sizes: list[list[int]], uids: list[int],
    ) -> list[TransferStatus]:
        self.batch_calls.append((local_descs, local_offsets, remote_descs, remote_offsets, sizes, uids))
        groups = zip(local_descs, local_offsets, remote_descs, remote_offsets, sizes, strict=True)
        return [self._write_one(*group) for group in groups]

    def wait_all(self, statuses: list[TransferStatus], timeout_ms: int = 0) -> StatusCode:
        pending = [s for s in statuses if s.InProgress()]
        if pending:
            pending[0].WaitFor(timeout_ms)
            return StatusCode.IN_PROGRESS
        failed = [s for s in statuses if s.Failed()]
        return failed[0].Code() if failed else StatusCode.SUCCESS

    def kill(self) -> None:
        """Injection: the engine dies. Every engine that registered it learns of it."""
        _ENGINES.pop(self.key, None)
        for engine in list(_ENGINES.values()):
            if self.key in engine._remotes:
                engine._failures.append(self.key)

    def _write_one(
        self, local: MemoryDesc, loffs: list[int], remote: MemoryDesc, roffs: list[int], sizes: list[int],
    ) -> TransferStatus:
        target = _ENGINES.get(remote.engine_key)
        if remote.engine_key not in self._remotes or target is None:
            return TransferStatus(StatusCode.ERR_NOT_FOUND, f"engine {remote.engine_key!r} unreachable")
        if local.id not in self._memory or remote.id not in target._memory:
            return TransferStatus(StatusCode.ERR_NOT_FOUND, "memory not registered")
        if target.frozen:
            return TransferStatus(StatusCode.IN_PROGRESS)
        writes = list(zip(loffs, roffs, sizes, strict=True))
        for lo, ro, n in writes:
            if lo < 0 or ro < 0 or lo + n > local.size or ro + n > remote.size:
                return TransferStatus(StatusCode.ERR_INVALID_ARGS, f"write [{lo}->{ro}, +{n}) out of bounds")
        for lo, ro, n in writes:
            ctypes.memmove(remote.data + ro, local.data + lo, n)
        return TransferStatus(StatusCode.SUCCESS)
