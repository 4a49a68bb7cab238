"""The local API's messages: what a serving engine and its sidecar agent say over their Unix socket.

A tagged union of msgspec Structs (tag field ``type``), msgpack-encoded, one message per frame; see
``stream`` for the framing. Evolution follows msgspec's rules: new fields get defaults, a new message
is a new tagged Struct appended to the unions; ``LOCALAPI_VERSION`` changes only when a message's
meaning changes, and the agent refuses a ``Hello`` of another version with a clear ``Error``.

Index arrays travel as raw little-endian int32 bytes (``pack_indices``): an engine with one-token
pages hands over thousands of indices per request, which as msgpack integers would cost far more.
Every request carries ``seq``; the agent answers it with ``Ack`` (or ``RoomStates``, ``Welcome``) or
``Error`` of the same ``seq``. ``Send``, ``Expect`` and ``Abort`` are the per-request hot path: they
are answered only when they ask (``ack``) or fail — an ``Error`` naming the ``room`` — so an engine
pays one socket write per request, not a round trip. Room states are pushed (``RoomState``) whenever
a room of this engine changes state, so the client reads them locally, without a round trip.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal

import msgspec
import numpy as np

from ..errors import BadInput, WireFormatError

LOCALAPI_VERSION = 1
NonNeg = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
Index = Annotated[int, msgspec.Meta(ge=-1, le=2**31 - 1)]
Name = Annotated[str, msgspec.Meta(max_length=256)]
Text = Annotated[str, msgspec.Meta(max_length=64 * 1024)]
Role = Literal["prefill", "decode"]
RegionKind = Literal["fd", "shm", "cuda_ipc"]
MAX_COMPONENTS = 64
MAX_RANKS = 1024
MAX_ADDRESS = 262
"""Characters of a bootstrap address at most: a 253-character host name, ``:`` and a port."""
MAX_MANIFEST = 1 << 20
"""Bytes of a ``Hello``'s manifest at most (a 64-component manifest of 4096-tensor components fits)."""


class _Msg(msgspec.Struct, frozen=True, tag_field="type", kw_only=True):
    """Base of every local-API message (shares the tag field)."""


class Hello(_Msg, frozen=True, tag="hello"):
    """Engine → agent, first on a connection: protocol version, role, the engine's schema manifest
    (``dataplane.codec.encode_manifest``: the agent's configured schema, or with none configured the
    schema the agent adopts), and which rank of the engine this connection is.

    ``tp_rank``, ``tp_size`` and ``dp_size`` mean what they mean in sglang: the scheduler process's
    rank in the engine, the engine's TP size, and its DP size (DP attention: the attention TP group of
    a rank is ``tp_size // dp_size`` wide). One connection per ``tp_rank``."""

    version: NonNeg
    role: Role
    engine_id: Name
    manifest: Annotated[bytes, msgspec.Meta(max_length=MAX_MANIFEST)]
    pid: NonNeg = 0
    seq: NonNeg = 0
    tp_rank: Annotated[int, msgspec.Meta(ge=0, le=MAX_RANKS - 1)] = 0
    tp_size: Annotated[int, msgspec.Meta(ge=1, le=MAX_RANKS)] = 1
    dp_size: Annotated[int, msgspec.Meta(ge=1, le=MAX_RANKS)] = 1


class Welcome(_Msg, frozen=True, tag="welcome"):
    """Agent → engine: the handshake is accepted."""

    version: NonNeg
    agent_id: Name
    max_frame: NonNeg
    seq: NonNeg = 0


class PoolRegion(msgspec.Struct, frozen=True, kw_only=True):
    """One region of the schema (canonical order) and where its memory lives.

    ``kind`` ``fd``: the ``fd_index``-th descriptor passed with the message (SCM_RIGHTS), mapped at
    ``offset``; ``shm``: the POSIX shared-memory object ``shm_name`` at ``offset``; ``cuda_ipc``:
    ``handle`` is a CUDA (or HIP) IPC memory handle of an allocation on ``device_id``, region at
    ``offset`` inside it."""

    name: Name
    component: Annotated[int, msgspec.Meta(ge=-2, le=MAX_COMPONENTS)]
    tensor: NonNeg
    size: NonNeg
    kind: RegionKind
    offset: NonNeg = 0
    fd_index: NonNeg = 0
    shm_name: Name = ""
    handle: Annotated[bytes, msgspec.Meta(max_length=256)] = b""
    device_id: NonNeg = 0


class RegisterPools(_Msg, frozen=True, tag="register_pools"):
    """Engine → agent: every region of the schema, in canonical order; the agent maps them, adopts
    them as its pools and registers them with the transport."""

    regions: tuple[PoolRegion, ...]
    seq: NonNeg = 0


class Send(_Msg, frozen=True, tag="send"):
    """Prefill engine → agent: room ``room``'s state is computed in these source items; write it to
    whichever decode asks for the room. ``state`` holds one packed index array per component."""

    room: NonNeg
    kv: bytes = b""
    aux: Index = -1
    state: tuple[bytes, ...] = ()
    seq: NonNeg = 0
    ack: bool = False


class Expect(_Msg, frozen=True, tag="expect"):
    """Decode engine → agent: receive room ``room`` into these destination items (``prefix_len``
    tokens are already cached here and are not sent) from the prefill whose bootstrap endpoint is
    ``bootstrap_addr`` (``host:port``, ``[v6]:port``; sglang's ``bootstrap_addr``, which the router
    picked), or with ``""`` from the prefill the agent is configured with."""

    room: NonNeg
    kv: bytes = b""
    aux: Index = -1
    state: tuple[bytes, ...] = ()
    prefix_len: NonNeg = 0
    seq: NonNeg = 0
    ack: bool = False
    bootstrap_addr: Annotated[str, msgspec.Meta(max_length=MAX_ADDRESS)] = ""


class Poll(_Msg, frozen=True, tag="poll"):
    """Engine → agent: the current state of ``rooms`` (answered by ``RoomStates``)."""

    rooms: tuple[NonNeg, ...]
    seq: NonNeg = 0


class Abort(_Msg, frozen=True, tag="abort"):
    """Engine → agent: stop ``room`` (the peer is told); the room fails with ``reason``."""

    room: NonNeg
    reason: Text = ""
    seq: NonNeg = 0
    ack: bool = False


class Ack(_Msg, frozen=True, tag="ack"):
    seq: NonNeg


class Error(_Msg, frozen=True, tag="error"):
    """The request ``seq`` (0: the connection itself) was refused; ``code`` is machine-readable;
    ``room`` is set (≥ 0) when the request was about a room, which has then failed."""

    code: Name
    message: Text
    seq: NonNeg = 0
    room: Annotated[int, msgspec.Meta(ge=-1, le=2**63 - 1)] = -1


class RoomState(_Msg, frozen=True, tag="room_state"):
    """Agent → engine (pushed, or inside ``RoomStates``): ``state`` is a ``KVPoll`` value.

    On prefill, a room the engine has not sent yet arrives as WaitingForInput with the item counts
    decode asked for (``kv_items``, ``aux``, ``state_items``), so an engine may react to it."""

    room: NonNeg
    state: Annotated[int, msgspec.Meta(ge=0, le=4)]
    reason: Text = ""
    kv_items: NonNeg = 0
    aux: bool = False
    state_items: tuple[NonNeg, ...] = ()


class RoomStates(_Msg, frozen=True, tag="room_states"):
    states: tuple[RoomState, ...]
    seq: NonNeg = 0


EngineMessage = Hello | RegisterPools | Send | Expect | Poll | Abort
AgentMessage = Welcome | Ack | Error | RoomState | RoomStates
Message = EngineMessage | AgentMessage

_ENCODER = msgspec.msgpack.Encoder()
_ENGINE_DECODER: msgspec.msgpack.Decoder[EngineMessage] = msgspec.msgpack.Decoder(EngineMessage)
_AGENT_DECODER: msgspec.msgpack.Decoder[AgentMessage] = msgspec.msgpack.Decoder(AgentMessage)


def encode_message(msg: Message) -> bytes:
    return _ENCODER.encode(msg)


def decode_engine_message(data: bytes | memoryview) -> EngineMessage:
    """What the agent reads: one untrusted engine message; raises ``WireFormatError`` only."""
    try:
        return _ENGINE_DECODER.decode(data)
    except msgspec.MsgspecError as exc:
        raise WireFormatError(f"local API message: {exc}") from None


def decode_agent_message(data: bytes | memoryview) -> AgentMessage:
    """What the client reads: one agent message; raises ``WireFormatError`` only."""
    try:
        return _AGENT_DECODER.decode(data)
    except msgspec.MsgspecError as exc:
        raise WireFormatError(f"local API message: {exc}") from None


SMALL = 64
"""Below this many indices, bounds come from a Python ``min``/``max`` of ``tolist()``: 0.4 µs, where
each numpy reduction costs ~2 µs — per request that was most of the local API's cost."""
_I32_MAX = 2**31 - 1


def _extremes(arr: np.ndarray) -> tuple[int, int]:
    """(min, max) of a non-empty integer array."""
    if arr.size <= SMALL:
        values = arr.tolist()
        return min(values), max(values)
    return int(arr.min()), int(arr.max())


def pack_indices(indices: Sequence[int] | np.ndarray | None) -> bytes:
    """Item indices as raw little-endian int32 (None or empty → ``b""``)."""
    if indices is None:
        return b""
    arr = np.asarray(indices)
    if arr.size:
        lo, hi = _extremes(arr.ravel())
        if lo < 0 or hi > _I32_MAX:
            raise WireFormatError("item indices must lie in 0..2**31-1")
    return np.ascontiguousarray(arr, dtype="<i4").tobytes()


def unpack_indices(data: bytes, *, field: str = "indices", limit: int | None = None) -> np.ndarray:
    """The inverse of ``pack_indices``; refuses torn arrays, negative indices and, given ``limit``
    (the pool's item count), indices outside the pool."""
    if len(data) % 4:
        raise WireFormatError(f"{field}: {len(data)} bytes is not a whole number of int32 indices")
    arr = np.frombuffer(data, dtype="<i4").astype(np.int32)
    if arr.size:
        lo, hi = _extremes(arr)
        if lo < 0:
            raise WireFormatError(f"{field}: negative item index {lo}")
        if limit is not None and hi >= limit:
            raise BadInput(f"{field}: item index {hi} outside the pool's 0..{limit - 1}")
    return arr
