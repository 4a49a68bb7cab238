"""NIXL's lists cut by grain (``nixl.descriptors.Cut``, ``blocks.settle_grains``): a room's small
batch of mixed sizes — KV pages and a 64-byte aux slot — goes as indices into lists prepared once,
re-cut when a finer write comes, and as exact descriptors where lists cut that fine would pass
``prep_limit``. Real bytes between this process and a spawned peer
(``test_transport_conformance.nixl_pair``), checked byte for byte on the peer."""

from __future__ import annotations

import numpy as np
import pytest

from dataplane.transports import Writes
from dataplane.transports.nixl import NixlTransport
from dataplane.transports.nixl.descriptors import GRAIN_REFUSALS
from tests.integration.test_transport_conformance import SIZES, nixl_pair, run, verify, writes

pytestmark = pytest.mark.nixl
PAGE, SLOT = 4096, 64
AUX = 1  # region 1 (256 KiB) holds the 64-byte slots


def room(k: int) -> Writes:
    """Room ``k``: two KV pages of region 0 and one aux slot of region 1, at other places each side."""
    return writes(
        lr=[0, 0, AUX], lo=[(2 * k) * PAGE, (2 * k + 1) * PAGE, k * SLOT],
        rr=[0, 0, AUX], ro=[(2 * k + 7) * PAGE, (2 * k + 8) * PAGE, (k + 3) * SLOT],
        n=[PAGE, PAGE, SLOT],
    )


def test_rooms_go_by_grain_and_a_finer_write_recuts_without_losing_a_byte() -> None:
    with nixl_pair(None) as pair:
        t = pair.transport
        assert isinstance(t, NixlTransport)
        batches = [room(k) for k in range(6)]
        for w in batches:
            run(pair, w)
        verify(pair, Writes.concat(batches))
        assert t.paths["grain"] == 6 and t.paths["exact"] == 0, t.paths
        assert t._local.cut is not None and t._local.cut.grains == [PAGE, SLOT]
        first_lists = t._local.cut.handles()

        half = writes(lr=[0], lo=[20 * PAGE + 2048], rr=[0], ro=[40 * PAGE], n=[2048])
        run(pair, half)
        assert t._local.cut.grains == [2048, SLOT]
        assert all(h in t._local.cut.retired for h in first_lists), "the replaced list is kept, not freed"
        more = [room(k) for k in range(6, 9)]
        for w in more:
            run(pair, w)
        verify(pair, Writes.concat([*batches, half, *more]))
        assert t.paths["grain"] == 10 and t.paths["exact"] == 0, t.paths
        assert t.describe()["requests_by_path"]["grain"] == 10


def test_lists_too_long_go_exact_and_a_peer_that_keeps_refusing_stops_being_tried() -> None:
    with nixl_pair(None) as pair:
        t = pair.transport
        assert isinstance(t, NixlTransport)
        t.prep_limit = SIZES[0] // PAGE + SIZES[1] // SLOT  # cut in pages and slots fits; finer does not
        run(pair, room(0))
        assert t.paths["grain"] == 1
        odd = [writes(lr=[0], lo=[PAGE * k], rr=[0], ro=[PAGE * k + 100], n=[200]) for k in range(1, 40)]
        for w in odd:
            run(pair, w)
        verify(pair, Writes.concat([room(0), *odd]))
        assert pair.peer.side.cut is not None and pair.peer.side.cut.refusals == GRAIN_REFUSALS
        assert t.paths["grain"] == 1 and t.paths["exact"] == len(odd), t.paths
        run(pair, room(1))  # this peer's rooms now go the other ways too
        verify(pair, Writes.concat([room(0), *odd, room(1)]))
        assert t.paths["grain"] == 1


def test_disconnect_and_close_release_every_list() -> None:
    with nixl_pair(None) as pair:
        t = pair.transport
        assert isinstance(t, NixlTransport)
        for k in range(3):
            run(pair, room(k))
        run(pair, writes(lr=[0], lo=[1024], rr=[0], ro=[0], n=[1024]))
        assert pair.peer.side.cut is not None and pair.peer.side.cut.retired
        t.disconnect(pair.peer)
        assert pair.peer.side.cut is None
        t.close()
        assert t._local.cut is None
        assert np.array_equal(pair.read_remote(0)[:1024], pair.local[0][1024:2048])
