"""NIXL takes a compact plan (``Writes.repeat``: a TP-sliced head slice of every token) as it is: its
indices are worked out from the entries' counts and strides into the lists of its block size, which
every room of that size shares — prepared once, never per room, no exact descriptors. Real bytes
between this process and a spawned peer, checked byte for byte on the peer."""

from __future__ import annotations

import numpy as np
import pytest

from dataplane.transports import Writes
from dataplane.transports.nixl import NixlTransport
from tests.integration.test_transport_conformance import expected_remote, nixl_pair, run

pytestmark = pytest.mark.nixl


def room(k: int) -> Writes:
    """Room ``k``: 64 tokens' 256-byte head slice of a 1 KiB token on prefill, landing 512 bytes
    apart on decode, in two runs, and one 4 KiB state block copied whole."""
    rep = np.array([[64, 32, 1], [1024, 1024, 0], [512, 512, 0]], np.int64)
    return Writes(
        np.array([0, 0, 1], np.int32), np.array([256 + 65536 * k, 65536 * k + 32768 + 512, 4096 * k]),
        np.array([1, 1, 0], np.int32), np.array([49152 * k, 49152 * k + 32768, 4096 * (k + 8)]),
        np.array([256, 256, 4096]), rep,
    )


def test_compact_rooms_go_as_indices_into_lists_prepared_once() -> None:
    with nixl_pair(None) as pair:
        t = pair.transport
        assert isinstance(t, NixlTransport) and t.takes_strided
        run(pair, room(0))
        lists = dict(t._local.prepped)
        assert len(lists) == 1 and t.paths["block"] == 1 and t.paths["exact"] == 0, t.paths
        for k in range(1, 4):
            run(pair, room(k))
        assert t._local.prepped == lists, "every room of one block size shares the lists"
        assert t.paths["block"] == 4 and t.paths["exact"] == 0, t.paths
        every = Writes.concat([room(k) for k in range(4)]).expanded()
        for i, want in enumerate(expected_remote(pair, every)):
            assert np.array_equal(pair.read_remote(i), want)
