"""NIXL's Python posting thread (``NixlConfig.postThread`` where ``nativePoster`` is off or cannot
load): host writes over 256 KiB posted while another transfer runs go through it, land byte for byte,
and a transfer aborted while still queued is never posted. Real bytes between this process and a
spawned peer (``test_transport_conformance.nixl_pair``)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from dataplane.errors import DeadlineExceeded
from dataplane.transports import TransferState
from dataplane.transports.nixl import NixlTransfer, NixlTransport
from tests.integration.test_transport_conformance import nixl_pair
from tests.integration.test_transport_conformance import one_write as one

pytestmark = pytest.mark.nixl
MIB = 1 << 20


def test_writes_queued_behind_a_running_one_go_through_the_thread_and_land() -> None:
    with nixl_pair(None, native=False) as pair:
        t = pair.transport
        assert isinstance(t, NixlTransport) and t._poster is not None
        transfers = [t.write(pair.peer, one(i * 2 * MIB, 2 * MIB)) for i in range(12)]
        deadline = time.monotonic() + 30
        for tr in transfers:
            t.wait(tr, deadline)
        assert t._poster.posted >= 11  # the first went in line (nothing else was running)
        got = pair.read_remote(0)
        assert np.array_equal(got[: 24 * MIB], pair.local[0][: 24 * MIB])
        assert t._running == 0


def test_the_callers_overlap_word_sends_a_lone_large_write_through_the_thread() -> None:
    """Host writes complete inside their post, so a worker that polls each room's transfer before
    reading the next room never has one running: its ``overlap=True`` (other rooms wait) must be
    enough. Without it a lone write, and with it a small one, is posted in line."""
    with nixl_pair(None, native=False) as pair:
        t = pair.transport
        assert isinstance(t, NixlTransport) and t._poster is not None
        deadline = time.monotonic() + 30
        for i, (size, overlap, threaded) in enumerate(
            [(2 * MIB, False, 0), (2 * MIB, True, 1), (64 << 10, True, 0), (2 * MIB, True, 1)]
        ):
            before = t._poster.posted
            tr = t.write(pair.peer, one(i * 2 * MIB, size), overlap=overlap)
            t.wait(tr, deadline)
            assert t._poster.posted - before == threaded, (size, overlap)
            assert t._running == 0
        got = pair.read_remote(0)
        for i, size in enumerate([2 * MIB, 2 * MIB, 64 << 10, 2 * MIB]):
            at = i * 2 * MIB
            assert np.array_equal(got[at : at + size], pair.local[0][at : at + size])


def test_small_writes_join_a_thread_that_has_work_and_each_handed_over_transfer_wakes_once() -> None:
    """A small write goes through the thread only while it has work queued (no wake-up to pay); a
    transfer handed over is marked ``wakes`` until posted, then the transport's ``waker`` runs."""
    with nixl_pair(None, native=False) as pair:
        t = pair.transport
        assert isinstance(t, NixlTransport) and t._poster is not None
        woken: list[int] = []
        t.waker = lambda: woken.append(1)
        deadline = time.monotonic() + 30
        alone = t.write(pair.peer, one(0, 64 << 10), overlap=True)  # idle thread: posted in line
        assert not alone.wakes and t._poster.backlog == 0
        t.wait(alone, deadline)
        big = t.write(pair.peer, one(2 * MIB, 2 * MIB), overlap=True)
        assert isinstance(big, NixlTransfer)
        with big.post_lock:  # the thread is held before posting ``big``: its backlog cannot drain
            assert big.wakes and t._poster.backlog == 1
            small = t.write(pair.peer, one(4 * MIB, 64 << 10), overlap=True)
            assert isinstance(small, NixlTransfer) and small.wakes and small.unposted == 1
            assert t._poster.backlog == 2 and not woken
        for tr in (big, small):
            t.wait(tr, deadline)
            assert not tr.wakes
        assert len(woken) == 2 and t._poster.backlog == 0
        got = pair.read_remote(0)
        for at, size in ((0, 64 << 10), (2 * MIB, 2 * MIB), (4 * MIB, 64 << 10)):
            assert np.array_equal(got[at : at + size], pair.local[0][at : at + size])


def test_a_transfer_aborted_while_queued_is_never_posted() -> None:
    with nixl_pair(None, native=False) as pair:
        t = pair.transport
        assert isinstance(t, NixlTransport) and t._poster is not None
        pair.reset()
        first = t.write(pair.peer, one(0, 2 * MIB))  # in line: nothing running yet
        assert isinstance(first, NixlTransfer)
        gate = NixlTransfer(pair.peer, 0, 0, handles=[None])
        gate.post_lock.acquire()  # a queued item the thread must wait on: the next stays queued
        t._poster.submit(gate)
        second = t.write(pair.peer, one(4 * MIB, 2 * MIB))
        assert isinstance(second, NixlTransfer) and second.unposted == 1
        t.abort(second)
        assert t.poll(second) is TransferState.FAILED
        gate.cancelled = True
        gate.post_lock.release()
        t._poster.drain()
        t.wait(first, time.monotonic() + 30)
        got = pair.read_remote(0)
        assert np.array_equal(got[: 2 * MIB], pair.local[0][: 2 * MIB])
        assert not got[4 * MIB : 6 * MIB].any(), "the aborted transfer's bytes were written"
        assert t._running == 0


def test_writes_queued_to_a_frozen_peer_hit_their_deadline_and_the_transport_recovers() -> None:
    """Over TCP a SIGSTOPped peer never completes a write: the queued ones fail at their deadline, are
    aborted, the peer can be disconnected (the thread is drained) and a thawed peer is written again."""
    with nixl_pair("tcp", native=False) as pair:
        t = pair.transport
        assert isinstance(t, NixlTransport) and t._poster is not None
        t.wait(t.write(pair.peer, one(0, 4096)), time.monotonic() + 30)  # connection up
        pair.freeze()
        transfers = [t.write(pair.peer, one(i * 2 * MIB, 2 * MIB)) for i in range(3)]
        start = time.monotonic()
        for tr in transfers:
            with pytest.raises(DeadlineExceeded):
                t.wait(tr, start + 0.5)
        assert time.monotonic() - start < 3
        assert all(tr.state is TransferState.FAILED for tr in transfers) and t._running == 0
        pair.thaw()
        t._poster.drain(5)
        t.wait(t.write(pair.peer, one(8 * MIB, 2 * MIB)), time.monotonic() + 30)
        assert np.array_equal(pair.read_remote(0)[8 * MIB : 10 * MIB], pair.local[0][8 * MIB : 10 * MIB])
