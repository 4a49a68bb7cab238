"""Shared pools: what the engine writes through its mapping the agent reads through its own (memfd
passed by descriptor, or a named /dev/shm object), regions are checked against the schema, and
everything is unmapped and unlinked on close."""

from __future__ import annotations

import os
import socket

import numpy as np
import pytest

from dataplane.config import AgentConfig, ModelConfig
from dataplane.errors import BadInput, PDPairError, SchemaError
from dataplane.localapi import SharedPools
from dataplane.localapi.mapping import check_regions, map_pools
from dataplane.localapi.shm import huge_pages, map_named
from dataplane.localapi.stream import FrameReader, send_frame
from dataplane.schema.profiles import schema_from_config

SCHEMA = schema_from_config(
    AgentConfig(model=ModelConfig(profile="deepseek-v3.2", pool_pages=8, max_requests=2))
)
REGIONS = [(r.name, r.component, r.tensor, r.size) for r in SCHEMA.regions()]


def passed_fds(fds):
    """Descriptors as the agent receives them: through SCM_RIGHTS on a socket."""
    a, b = socket.socketpair()
    with a, b:
        send_frame(a, b"x", fds)
        reader = FrameReader(b)
        reader.read()
        return reader.take_fds()


@pytest.mark.parametrize("mode", ["fd", "shm"])
def test_agent_sees_engine_writes_and_engine_sees_agent_writes(mode):
    with SharedPools(REGIONS, mode=mode) as pools:
        assert all(r.offset % 4096 == 0 for r in pools.regions)
        mapped = map_pools(SCHEMA, pools.regions, passed_fds(pools.fds))
        try:
            for i, buf in enumerate(pools.buffers):
                buf[:8] = i + 1
            assert [int(b[0]) for b in mapped.buffers] == [i + 1 for i in range(len(REGIONS))]
            mapped.buffers[-1][-4:] = 0xAB
            assert np.all(pools.buffers[-1][-4:] == 0xAB)
        finally:
            assert mapped.close()
    if mode == "shm":
        assert not os.path.exists(f"/dev/shm/{pools.shm_name}")


def test_a_view_kept_alive_delays_unmapping():
    with SharedPools(REGIONS) as pools:
        mapped = map_pools(SCHEMA, pools.regions, passed_fds(pools.fds))
        kept = mapped.buffers[0]
        assert not mapped.close()
        del kept
        assert mapped.close()


def test_regions_must_match_the_agents_schema():
    with SharedPools(REGIONS) as pools:
        regions = list(pools.regions)
        short = regions[:-1]
        with pytest.raises(SchemaError, match=f"engine registered {len(short)} regions"):
            check_regions(SCHEMA, short)
        import msgspec

        regions[1] = msgspec.structs.replace(regions[1], size=regions[1].size * 2)
        with pytest.raises(SchemaError, match="region 1: engine has"):
            map_pools(SCHEMA, regions, passed_fds(pools.fds))


def test_missing_descriptor_and_bad_names_are_clear_errors():
    with SharedPools(REGIONS) as pools, pytest.raises(BadInput, match="descriptor 0 not passed"):
        map_pools(SCHEMA, pools.regions, [])
    for name in ("../etc/passwd", "", "a/b"):
        with pytest.raises(BadInput, match="not a plain name"):
            map_named(name)
    with pytest.raises(BadInput, match="cannot open shared memory"):
        map_named("pdpair-does-not-exist")


def test_huge_pages_are_shared_with_the_agent_when_the_host_has_them():
    if huge_pages() < 8:
        pytest.skip("no free 2 MiB huge pages here (scripts/test reserves them: hack/ci-hugepages.sh)")
    before = huge_pages()
    with SharedPools(REGIONS, huge_pages="always") as pools:
        assert pools.huge and pools.huge_reason == ""
        assert pools.size % (2 << 20) == 0 and pools.size >= sum(r[3] for r in REGIONS)
        assert huge_pages() == before - pools.size // (2 << 20), "every page reserved and faulted in now"
        assert all(int(b.max()) == 0 for b in pools.buffers)
        mapped = map_pools(SCHEMA, pools.regions, passed_fds(pools.fds))
        try:
            for i in range(len(REGIONS)):
                pools.buffers[i][-8:] = i + 1
            assert [int(b[-1]) for b in mapped.buffers] == [i + 1 for i in range(len(REGIONS))]
        finally:
            assert mapped.close()
    assert huge_pages() == before, "closing gives every page back"


def test_without_enough_huge_pages_auto_falls_back_and_always_refuses():
    """Asking for one page more than the host could ever give: ``auto`` takes ordinary pages and says
    why, ``always`` raises with the same reason, ``never`` does not look."""
    most = huge_pages("nr") + huge_pages("nr_overcommit")
    too_big = [("kv", -1, 0, (most + 1) * (2 << 20))]
    with SharedPools(too_big) as pools:
        assert not pools.huge
        assert "huge pages not available" in pools.huge_reason and "host free" in pools.huge_reason
        pools.buffers[0][-1] = 7
    with pytest.raises(PDPairError, match=r"no huge pages .*huge pages not available"):
        SharedPools(too_big, huge_pages="always")
    with SharedPools(REGIONS, huge_pages="never") as pools:
        assert not pools.huge and "never" in pools.huge_reason
    with pytest.raises(PDPairError, match="need the fd mode"):
        SharedPools(REGIONS, mode="shm", huge_pages="always")
    with pytest.raises(BadInput, match="huge_pages must be"):
        SharedPools(REGIONS, huge_pages="sometimes")  # type: ignore[arg-type]
