"""Every transport adapter passes this one suite.

- NIXL: real bytes between this process and a spawned child (``transport_peer.serve``), host memory,
  loopback only (``UCX_NET_DEVICES=lo``), with UCX's default transports (CMA / shared memory) and with
  ``UCX_TLS=tcp``. A frozen peer is a SIGSTOPped child over TCP; a killed peer a SIGKILLed one.
- MoRI: the adapter over the MoRI hardware test double, both engines in this process; freezing and
  killing use the double's injection knobs.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass

import numpy as np
import pytest

from dataplane.config import NixlConfig
from dataplane.errors import DeadlineExceeded, PlanError, TransferFailed, WireFormatError
from dataplane.transports import MemoryRegion, Peer, TransferState, Transport, Writes, mori_double
from dataplane.transports.mori import MoriTransport
from dataplane.transports.nixl import NixlTransport, ucx_environment
from tests.integration.transport_peer import serve

SIZES = [32 << 20, 256 << 10]
SLACK = 1.0


@dataclass
class Pair:
    transport: Transport
    peer: Peer
    local: list[np.ndarray]
    read_remote: Callable[[int], np.ndarray]
    freeze: Callable[[], None]
    thaw: Callable[[], None]
    kill: Callable[[], None]
    reset: Callable[[], None]


def one_write(offset: int, size: int, region: int = 0) -> Writes:
    """A batch of one write, same region and offset on both sides."""
    r, at = np.array([region], np.int32), np.array([offset])
    return Writes(r, at, r, at, np.array([size]))


def _buffers(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, n, dtype=np.uint8) for n in SIZES]


@contextmanager
def ucx_env(config: NixlConfig) -> Iterator[None]:
    """This process's UCX environment as ``config`` asks (``sdk.ucx_environment``) while the block
    runs (as a process sets it where it starts), as it was afterwards."""
    wanted = ucx_environment(config)
    keys = ("UCX_TLS", "UCX_NET_DEVICES")
    before = {k: os.environ.get(k) for k in keys}
    for k in keys:
        os.environ.pop(k, None)
    os.environ.update(wanted)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextmanager
def nixl_pair(tls: str | None, threads: int = 0, native: bool = True) -> Iterator[Pair]:
    ctx = mp.get_context("spawn")
    conn, child_conn = ctx.Pipe()
    name = f"peer-{uuid.uuid4().hex[:8]}"
    child = ctx.Process(target=serve, args=(child_conn, name, SIZES, tls), daemon=True)
    child.start()
    assert child.pid is not None
    pid = child.pid

    def read(i: int) -> np.ndarray:
        conn.send(("read", i))
        return np.frombuffer(conn.recv(), dtype=np.uint8)

    def kill() -> None:
        os.kill(pid, signal.SIGKILL)
        child.join(5)

    def reset() -> None:
        for i in range(len(SIZES)):
            conn.send(("fill", i, 0))
            conn.recv()

    try:
        conn.send(("hello",))
        endpoint, blobs, _ = conn.recv()
        local = _buffers(1)
        # this process only initiates writes: configured as prefill is (no NIXL progress thread)
        config = NixlConfig(
            ucx_tls=tls, ucx_net_devices="lo", num_threads=threads, native_poster=native
        ).for_role("prefill")
        with ucx_env(config):  # UCX reads it once, when the agent's backend is made
            transport = NixlTransport(f"me-{name}", config)
        transport.register([MemoryRegion(b.ctypes.data, b.nbytes) for b in local])
        yield Pair(
            transport, transport.connect(name, endpoint, blobs), local, read,
            freeze=lambda: os.kill(pid, signal.SIGSTOP), thaw=lambda: os.kill(pid, signal.SIGCONT), kill=kill,
            reset=reset,
        )
        transport.close()
    finally:
        if child.is_alive():
            os.kill(pid, signal.SIGCONT)
            child.kill()
        child.join(5)


@contextmanager
def mori_pair() -> Iterator[Pair]:
    keys = [f"{role}-{uuid.uuid4().hex[:8]}" for role in ("me", "peer")]
    me, far = (MoriTransport(k, "127.0.0.1", sdk=mori_double) for k in keys)
    local, remote = _buffers(1), [np.zeros(n, dtype=np.uint8) for n in SIZES]
    me.register([MemoryRegion(b.ctypes.data, b.nbytes) for b in local])
    blobs = far.register([MemoryRegion(b.ctypes.data, b.nbytes) for b in remote])
    engine = mori_double.engine(keys[1])

    def reset() -> None:
        for r in remote:
            r.fill(0)

    yield Pair(
        me, me.connect("peer", far.endpoint(), blobs), local, lambda i: remote[i].copy(),
        freeze=lambda: setattr(engine, "frozen", True), thaw=lambda: setattr(engine, "frozen", False),
        kill=engine.kill, reset=reset,
    )
    me.close()
    far.close()


ALL = [
    pytest.param("nixl-default", marks=pytest.mark.nixl, id="nixl-default"),
    pytest.param("nixl-tcp", marks=pytest.mark.nixl, id="nixl-tcp"),
    pytest.param("mori-double", id="mori-double"),
]


def make_pair(kind: str) -> AbstractContextManager[Pair]:
    return mori_pair() if kind == "mori-double" else nixl_pair("tcp" if kind == "nixl-tcp" else None)


@pytest.fixture(scope="module")
def shared() -> Iterator[dict[str, Pair]]:
    """Pairs reused by the tests that leave them healthy: a NIXL child costs ~2 s to start."""
    with ExitStack() as stack:
        yield _SharedPairs(stack)


class _SharedPairs(dict[str, Pair]):
    def __init__(self, stack: ExitStack) -> None:
        super().__init__()
        self.stack = stack

    def __missing__(self, kind: str) -> Pair:
        self[kind] = self.stack.enter_context(make_pair(kind))
        return self[kind]


@pytest.fixture
def pair(request: pytest.FixtureRequest, shared: dict[str, Pair]) -> Pair:
    """A healthy pair with zeroed remote buffers (shared within the module)."""
    p = shared[request.param]
    p.reset()
    return p


@pytest.fixture
def fresh_pair(request: pytest.FixtureRequest) -> Iterator[Pair]:
    """A pair of its own, for tests that freeze, kill or close it."""
    with make_pair(request.param) as p:
        yield p


def writes(lr: list[int], lo: list[int], rr: list[int], ro: list[int], n: list[int]) -> Writes:
    def arr(x: list[int], dtype: type) -> np.ndarray:
        return np.array(x, dtype=dtype)

    i32, i64 = np.int32, np.int64
    return Writes(arr(lr, i32), arr(lo, i64), arr(rr, i32), arr(ro, i64), arr(n, i64))


def expected_remote(p: Pair, w: Writes) -> list[np.ndarray]:
    out = [np.zeros(n, dtype=np.uint8) for n in SIZES]
    rows = zip(w.local_region, w.local_offset, w.remote_region, w.remote_offset, w.size, strict=True)
    for lr, lo, rr, ro, n in rows:
        out[rr][ro:ro + n] = p.local[lr][lo:lo + n]
    return out


def run(p: Pair, w: Writes, seconds: float = 10.0) -> None:
    t = p.transport.write(p.peer, w)
    p.transport.wait(t, time.monotonic() + seconds)
    assert t.state is TransferState.DONE


def verify(p: Pair, w: Writes) -> None:
    for i, want in enumerate(expected_remote(p, w)):
        got = p.read_remote(i)
        assert np.array_equal(got, want), f"remote region {i} differs at {np.flatnonzero(got != want)[:5]}"


@pytest.mark.parametrize("pair", ALL, indirect=True)
def test_scattered_writes_land_byte_for_byte(pair: Pair) -> None:
    w = writes(
        lr=[0, 1, 0, 0, 1], lo=[0, 4096, 1 << 20, 12288, 0],
        rr=[0, 1, 1, 0, 0], ro=[8192, 0, 65536, 3 << 20, 5 << 20], n=[4096, 8192, 16384, 1 << 20, 4096],
    )
    run(pair, w)
    verify(pair, w)


@pytest.mark.parametrize("pair", ALL, indirect=True)
def test_many_small_writes_in_one_call(pair: Pair) -> None:
    rng = np.random.default_rng(7)
    n = 4096
    slots = rng.permutation(SIZES[1] // 64)[:n]
    w = Writes(
        np.zeros(n, np.int32), rng.permutation(n).astype(np.int64) * 64,
        np.ones(n, np.int32), slots.astype(np.int64) * 64, np.full(n, 64, np.int64),
    )
    run(pair, w)
    verify(pair, w)


@pytest.mark.parametrize("pair", ALL, indirect=True)
def test_unaligned_writes(pair: Pair) -> None:
    w = writes(lr=[0, 1], lo=[3, 7], rr=[1, 0], ro=[5, 1001], n=[1001, 333])
    run(pair, w)
    verify(pair, w)


@pytest.mark.parametrize("pair", ALL, indirect=True)
def test_strided_entries_land_byte_for_byte(pair: Pair) -> None:
    """A TP-sliced plan's compact rows (``Writes.repeat``): a head slice of each of 64 tokens per row,
    strides differing on the two sides; NIXL takes them as they are (indices worked out from the
    entries), an engine that does not gets them expanded."""
    rep = np.array([[64, 64, 3], [1024, 1024, 4096], [512, 512, 8192]], np.int64)
    w = Writes(np.array([0, 0, 1], np.int32), np.array([256, 65536 + 512, 0]), np.array([1, 1, 0], np.int32),
               np.array([0, 32768, 1 << 20]), np.array([256, 256, 4096]), rep)
    run(pair, w)
    for i, want in enumerate(expected_remote(pair, w.expanded())):
        assert np.array_equal(pair.read_remote(i), want)
    over = Writes(w.local_region, w.local_offset, w.remote_region, w.remote_offset, w.size, rep.copy())
    assert over.repeat is not None
    over.repeat[2, 0] = SIZES[1] // 63  # the first write is inside remote region 1, the 64th is not
    # an engine that takes the entries is told of entry 0 (its last write), another of write 63
    which = 0 if pair.transport.takes_strided else 63
    at = 63 * (SIZES[1] // 63)
    with pytest.raises(PlanError, match=rf"write {which}: remote region 1 \[{at}, \+256\)"):
        pair.transport.write(pair.peer, over)


OUT_OF_BOUNDS = {
    "local-overflow": dict(lr=[0], lo=[SIZES[0] - 10], rr=[0], ro=[0], n=[11]),
    "remote-overflow": dict(lr=[0, 0], lo=[0, 0], rr=[1, 1], ro=[0, SIZES[1] - 4095], n=[4096, 4096]),
    "local-region": dict(lr=[2], lo=[0], rr=[0], ro=[0], n=[1]),
    "remote-region": dict(lr=[0], lo=[0], rr=[-1], ro=[0], n=[1]),
    "negative-offset": dict(lr=[0], lo=[-1], rr=[0], ro=[0], n=[1]),
    "zero-size": dict(lr=[0], lo=[0], rr=[0], ro=[0], n=[0]),
}


@pytest.mark.parametrize("pair", ALL, indirect=True)
def test_out_of_bounds_is_rejected_before_the_engine(pair: Pair) -> None:
    for case, bad in OUT_OF_BOUNDS.items():
        with pytest.raises(PlanError):
            pair.transport.write(pair.peer, writes(**bad))
            pytest.fail(f"{case} was accepted")
    for i in range(len(SIZES)):
        assert not pair.read_remote(i).any()
    run(pair, writes(lr=[0], lo=[0], rr=[0], ro=[0], n=[4096]))


@pytest.mark.parametrize("fresh_pair", [ALL[1], ALL[2]], indirect=True)
def test_frozen_peer_hits_the_deadline_and_the_transport_recovers(fresh_pair: Pair) -> None:
    run(fresh_pair, writes(lr=[0], lo=[0], rr=[0], ro=[0], n=[4096]))
    fresh_pair.freeze()
    full = writes(lr=[0], lo=[0], rr=[0], ro=[0], n=[SIZES[0]])
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        t = fresh_pair.transport.write(fresh_pair.peer, full)
        fresh_pair.transport.wait(t, t0 + 0.5)
    assert time.monotonic() - t0 < 0.5 + SLACK
    fresh_pair.thaw()
    w = writes(lr=[1], lo=[0], rr=[1], ro=[0], n=[SIZES[1]])
    run(fresh_pair, w)
    assert np.array_equal(fresh_pair.read_remote(1), fresh_pair.local[1])


@pytest.mark.parametrize("fresh_pair", ALL, indirect=True)
def test_killed_peer_fails_never_hangs(fresh_pair: Pair) -> None:
    run(fresh_pair, writes(lr=[0], lo=[0], rr=[0], ro=[0], n=[4096]))
    fresh_pair.kill()
    t0 = time.monotonic()
    with pytest.raises(TransferFailed):
        t = fresh_pair.transport.write(fresh_pair.peer, writes(lr=[0], lo=[0], rr=[0], ro=[0], n=[1 << 20]))
        fresh_pair.transport.wait(t, t0 + 2.0)
    assert time.monotonic() - t0 < 2.0 + SLACK
    fresh_pair.transport.close()


@pytest.mark.parametrize("pair", ALL, indirect=True)
def test_bad_peer_descriptors_are_wire_errors(pair: Pair) -> None:
    for blob in (b"", b"\xc1", b"\x93\x01\x02\x03", b"\x94\x01\x00\x00\xa4DRAM"):
        with pytest.raises(WireFormatError):
            pair.transport.connect("evil", pair.transport.endpoint(), [blob])


@pytest.mark.parametrize("fresh_pair", ALL, indirect=True)
def test_close_is_idempotent_and_disconnect_too(fresh_pair: Pair) -> None:
    fresh_pair.transport.disconnect(fresh_pair.peer)
    fresh_pair.transport.disconnect(fresh_pair.peer)
    with pytest.raises(ValueError):
        fresh_pair.transport.write(fresh_pair.peer, writes(lr=[0], lo=[0], rr=[0], ro=[0], n=[1]))
    fresh_pair.transport.close()
    fresh_pair.transport.close()
