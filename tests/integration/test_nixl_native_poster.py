"""The native posting thread (``transports/nixl/native``, ``NixlConfig.nativePoster``): host writes handed to
it land byte for byte with nothing outside them touched, each finished transfer is signalled through
``wake_fd`` (no polling), a transfer cancelled while queued is never written, writes to a frozen peer
fail at their deadline and a thawed one is written again; where the library cannot be built or the
bindings look different, the Python posting thread takes over. Real bytes between this process and a
spawned peer (``test_transport_conformance.nixl_pair``)."""

from __future__ import annotations

import logging
import select
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dataplane.config import NixlConfig
from dataplane.errors import DeadlineExceeded, TransferFailed
from dataplane.transports import MemoryRegion, TransferState
from dataplane.transports.nixl import NixlTransfer, NixlTransport, native, sdk
from tests.integration.test_transport_conformance import Pair, nixl_pair, ucx_env
from tests.integration.test_transport_conformance import one_write as one

pytestmark = pytest.mark.nixl
MIB = 1 << 20


def signalled(t: NixlTransport, transfers: list[NixlTransfer], timeout: float = 30) -> None:
    """Wait on ``wake_fd`` alone (never polling) until every transfer was reported."""
    assert t.wake_fd is not None
    deadline = time.monotonic() + timeout
    while any(tr.wakes for tr in transfers):
        left = deadline - time.monotonic()
        assert left > 0, "the native poster never signalled"
        if select.select([t.wake_fd], [], [], left)[0]:
            t.collect()


def test_writes_of_every_size_are_posted_natively_signalled_and_land_exactly() -> None:
    with nixl_pair(None) as pair:
        t = pair.transport
        assert isinstance(t, NixlTransport) and t._native is not None and t._poster is None
        pair.reset()
        sizes = [2 * MIB, 4096, 3 * MIB, 1, 300 << 10, MIB]
        offsets = (np.cumsum([0, *sizes[:-1]]) + 512).tolist()
        transfers = [t.write(pair.peer, one(at, n), overlap=True)
                     for at, n in zip(offsets, sizes, strict=True)]
        handed = [tr for tr in transfers if isinstance(tr, NixlTransfer) and tr.token]
        assert len(handed) >= 4 and t._native.posted == len(handed)  # the large ones at least
        signalled(t, handed)
        assert all(t.poll(tr) is TransferState.DONE for tr in transfers)
        assert not select.select([t.wake_fd], [], [], 0)[0], "the descriptor stayed readable"
        got = pair.read_remote(0)
        written = np.zeros(len(got), bool)
        for at, n in zip(offsets, sizes, strict=True):
            assert np.array_equal(got[at : at + n], pair.local[0][at : at + n])
            written[at : at + n] = True
        assert not got[~written].any(), "bytes outside the writes changed"
        assert t._running == 0 and not t._native_live


def test_transfers_aborted_wherever_the_thread_is_with_them_fail_and_leave_it_clean() -> None:
    """Aborted right after the hand-off, a transfer may still be queued, being posted or finished:
    whichever, it ends FAILED, never reported later, its handles released once the thread let go; the
    others land, and so does the next write."""
    with nixl_pair(None) as pair:
        t = pair.transport
        assert isinstance(t, NixlTransport) and t._native is not None
        pair.reset()
        transfers = [t.write(pair.peer, one(i * 2 * MIB, 2 * MIB), overlap=True) for i in range(12)]
        assert all(isinstance(tr, NixlTransfer) and tr.token for tr in transfers[1:])
        aborted = transfers[1::2]
        for tr in aborted:
            t.abort(tr)
        deadline = time.monotonic() + 30
        for tr in transfers[::2]:
            t.wait(tr, deadline)
        assert all(t.poll(tr) is TransferState.FAILED and not tr.handles for tr in aborted)
        assert t._running == 0 and not t._native_live
        got = pair.read_remote(0)
        for at in range(0, 24 * MIB, 4 * MIB):
            assert np.array_equal(got[at : at + 2 * MIB], pair.local[0][at : at + 2 * MIB])
        t.wait(t.write(pair.peer, one(24 * MIB, 2 * MIB), overlap=True), time.monotonic() + 30)
        assert np.array_equal(pair.read_remote(0)[24 * MIB : 26 * MIB], pair.local[0][24 * MIB : 26 * MIB])


def handed_over_after(pair: Pair, stop: Callable[[], None]) -> tuple[NixlTransport, list[Any], float]:
    """Connection up with a first write, then ``stop`` the peer and hand three 2 MiB writes over."""
    t = pair.transport
    assert isinstance(t, NixlTransport) and t._native is not None
    t.wait(t.write(pair.peer, one(0, 4096)), time.monotonic() + 30)
    stop()
    start = time.monotonic()
    transfers = [t.write(pair.peer, one(i * 2 * MIB, 2 * MIB), overlap=True) for i in range(3)]
    assert all(isinstance(tr, NixlTransfer) and tr.token for tr in transfers)
    return t, transfers, start


def test_writes_to_a_frozen_peer_fail_at_their_deadline_and_a_thawed_peer_is_written_again() -> None:
    with nixl_pair("tcp") as pair:
        t, transfers, start = handed_over_after(pair, pair.freeze)
        for tr in transfers:
            with pytest.raises(DeadlineExceeded):
                t.wait(tr, start + 0.5)
        assert time.monotonic() - start < 3
        assert all(tr.state is TransferState.FAILED for tr in transfers)
        assert t._running == 0 and not t._native_live
        pair.thaw()
        t.wait(t.write(pair.peer, one(8 * MIB, 2 * MIB), overlap=True), time.monotonic() + 30)
        assert np.array_equal(pair.read_remote(0)[8 * MIB : 10 * MIB], pair.local[0][8 * MIB : 10 * MIB])


def test_a_killed_peer_fails_the_handed_over_writes_without_hanging() -> None:
    with nixl_pair("tcp") as pair:
        t, transfers, start = handed_over_after(pair, pair.kill)
        for tr in transfers:
            with pytest.raises(TransferFailed):  # the deadline, or NIXL's word that the peer is gone
                t.wait(tr, start + 2)
        assert time.monotonic() - start < 6
        assert all(tr.state is TransferState.FAILED for tr in transfers) and not t._native_live


def test_without_a_compiler_the_python_posting_thread_takes_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("PDPAIR_NATIVE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setattr(native.shutil, "which", lambda name: None)
    native.library.cache_clear()
    try:
        with pytest.raises(native.NativeUnavailable, match=r"building the native poster|compiler"):
            native.build()
        buf = np.zeros(MIB, np.uint8)
        with caplog.at_level(logging.WARNING, "dataplane.transports.nixl"):
            with ucx_env(NixlConfig(ucx_net_devices="lo")):
                t = NixlTransport("no-native", NixlConfig(ucx_net_devices="lo"))
            t.register([MemoryRegion(buf.ctypes.data, buf.nbytes)])
        try:
            assert t._native is None and t._poster is not None and t.wake_fd is None
            assert "native poster unavailable" in caplog.text
        finally:
            t.close()
    finally:
        native.library.cache_clear()


def test_an_object_of_another_layout_is_refused_before_any_call() -> None:
    class NotABinding:
        pass

    with pytest.raises(sdk.EntryPointsUnavailable, match="unexpected layout"):
        sdk.entry_points(NotABinding())


def test_a_build_is_made_once_per_source_version_and_older_builds_are_pruned(tmp_path: Path) -> None:
    stale = tmp_path / "libpdpair_nixl_poster-000000000000.so"
    stale.write_bytes(b"an older source's build")
    first = native.build(tmp_path)
    assert first.parent == tmp_path and first.stat().st_size > 0 and not stale.exists()
    mtime = first.stat().st_mtime_ns
    assert native.build(tmp_path) == first and first.stat().st_mtime_ns == mtime  # not rebuilt
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary files left behind


def test_a_closed_poster_refuses_calls_instead_of_touching_freed_memory() -> None:
    """``close`` may run on another thread than the worker's (shutdown): later calls are answered
    without entering the freed queue, and a cancel then tells the caller not to release."""
    buf = np.zeros(MIB, np.uint8)
    with ucx_env(NixlConfig(ucx_net_devices="lo")):
        t = NixlTransport("closed-poster", NixlConfig(ucx_net_devices="lo"))
    with t:
        t.register([MemoryRegion(buf.ctypes.data, buf.nbytes)])
        poster = t._native
        assert poster is not None and poster.close() and not poster.stuck
        assert poster.take() == [] and poster.cancel(1) is False and not poster.stuck
        with pytest.raises(native.NativeUnavailable, match="closed"):
            poster.submit(1, [0])
        t._native = None
