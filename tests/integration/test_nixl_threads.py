"""NIXL's own backend threads (``NixlConfig.numThreads``): every request, however few its descriptors,
is handed to the UCX backend's dedicated thread, which copies it; bytes land exactly, and a write to a
frozen peer still fails at its deadline without hanging the caller. Real bytes between this process and
a spawned peer (``test_transport_conformance.nixl_pair``)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from dataplane.errors import DeadlineExceeded
from dataplane.transports import TransferState, Writes
from dataplane.transports.nixl import NixlTransport
from dataplane.transports.nixl.sdk import thread_params
from tests.integration.test_transport_conformance import nixl_pair, one_write

pytestmark = pytest.mark.nixl
MIB = 1 << 20


def test_a_request_of_a_few_descriptors_is_handed_to_the_backend_threads() -> None:
    assert thread_params("UCX", 2) == {"num_threads": "2", "split_batch_size": "1"}
    assert thread_params("GDS_MT", 2) == {"thread_count": "2"}
    assert thread_params("POSIX", 2) == {}


def test_writes_of_every_size_land_through_the_backend_thread_with_no_posting_thread() -> None:
    with nixl_pair(None, threads=1) as pair:
        t = pair.transport
        assert isinstance(t, NixlTransport) and t._poster is None
        pair.reset()
        sizes = [4096, 64 << 10, MIB, 3 * MIB, 1]
        offsets = np.cumsum([0, *sizes[:-1]]) + 512
        batch = Writes(
            np.zeros(len(sizes), np.int32), offsets, np.zeros(len(sizes), np.int32), offsets, np.array(sizes)
        )
        singles = [one_write(at, n, 1) for at, n in ((0, 4096), (8192, 100_000))]
        transfers = [t.write(pair.peer, batch), *(t.write(pair.peer, w) for w in singles)]
        deadline = time.monotonic() + 30
        for tr in transfers:
            t.wait(tr, deadline)
        got0, got1 = pair.read_remote(0), pair.read_remote(1)
        for at, n in zip(offsets.tolist(), sizes, strict=True):
            assert np.array_equal(got0[at : at + n], pair.local[0][at : at + n])
        written = np.zeros(len(got0), bool)
        for at, n in zip(offsets.tolist(), sizes, strict=True):
            written[at : at + n] = True
        assert not got0[~written].any(), "bytes outside the writes changed"
        for at, n in ((0, 4096), (8192, 100_000)):
            assert np.array_equal(got1[at : at + n], pair.local[1][at : at + n])
        assert t._running == 0


def test_a_frozen_peer_fails_threaded_writes_at_their_deadline_and_a_thawed_one_is_written_again() -> None:
    with nixl_pair("tcp", threads=1) as pair:
        t = pair.transport
        t.wait(t.write(pair.peer, one_write(0, 4096)), time.monotonic() + 30)  # connection up
        pair.freeze()
        start = time.monotonic()
        transfer = t.write(pair.peer, one_write(MIB, 8 * MIB))
        with pytest.raises(DeadlineExceeded):
            t.wait(transfer, start + 0.5)
        assert time.monotonic() - start < 3
        assert transfer.state is TransferState.FAILED and t._running == 0
        pair.thaw()
        t.wait(t.write(pair.peer, one_write(16 * MIB, 2 * MIB)), time.monotonic() + 30)
        got = pair.read_remote(0)
        assert np.array_equal(got[16 * MIB : 18 * MIB], pair.local[0][16 * MIB : 18 * MIB])
