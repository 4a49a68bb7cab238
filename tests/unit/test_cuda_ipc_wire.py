"""What a ``cuda-ipc`` peer sends is checked before any IPC handle is opened (``parse_peer``): runs
without a GPU. The transfers themselves are ``tests/integration/test_cuda_ipc.py`` (CUDA only)."""

from __future__ import annotations

import pytest

from dataplane.errors import IncompatiblePeer, WireFormatError
from dataplane.transports.cuda_ipc import _encode, _Endpoint, _Region, node_id, parse_peer

HANDLE = bytes(range(64))
HERE = _encode.encode(_Endpoint(node_id(), "this-host", 1234, 0))


def region(offset: int = 0, size: int = 4096, alloc: int = 1 << 20, handle: bytes = HANDLE) -> bytes:
    return _encode.encode(_Region(handle, offset, size, alloc, 0x7F0000000000 + offset))


def test_a_peer_on_this_node_with_regions_inside_their_allocations_is_accepted() -> None:
    ep, regions = parse_peer("decode", HERE, [region(0), region(4096, 8192), region((1 << 20) - 16, 16)])
    assert ep.pid == 1234 and [r.size for r in regions] == [4096, 8192, 16]


def test_a_peer_on_another_node_is_refused_with_the_way_out() -> None:
    elsewhere = _encode.encode(_Endpoint("another-boot-id", "node-b", 1, 0))
    with pytest.raises(IncompatiblePeer, match=r"runs on another node \(node-b\).*nixl or mori"):
        parse_peer("decode", elsewhere, [region()])


@pytest.mark.parametrize(("blob", "message"), [
    (region(offset=(1 << 20) - 100, size=200), r"region 0 \[1048476, \+200\) lies outside its 1048576-byte"),
    (region(size=0), "lies outside"),
    (region(offset=-1), "lies outside"),
    (region(handle=b"short"), "IPC handle of 5 bytes, not 64"),
    (b"\x93garbage", "bad endpoint or region"),
])
def test_bad_regions_are_refused_precisely(blob: bytes, message: str) -> None:
    with pytest.raises(WireFormatError, match=message):
        parse_peer("decode", HERE, [blob])


def test_no_regions_and_bad_endpoints_are_refused() -> None:
    with pytest.raises(WireFormatError, match="registered no regions"):
        parse_peer("decode", HERE, [])
    with pytest.raises(WireFormatError, match="bad endpoint"):
        parse_peer("decode", b"not msgpack at all", [region()])
