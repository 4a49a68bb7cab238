"""Decode receives each room from the prefill its ``Expect`` names by bootstrap address (sglang's
``bootstrap_addr``, the router's choice): two prefill agents, one decode agent, real processes and
real NIXL; this test process plays the three engines over the local API, with shared memory.

Rooms alternately name each prefill: each is asked of that prefill only (its engine sees the request,
the other's never does), and every byte lands verified per component. Rooms naming a closed port, an
agent that holds another pairing key, a bootstrap endpoint that proves no key, or a malformed address
fail with their reason, at once, while the decode agent keeps serving both prefills; a room naming no
address goes to the configured prefill.
"""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
import numpy as np
import pytest

from dataplane.agent.bootstrap import BootstrapRegistry, RankInfo
from dataplane.agent.http import AgentHttpServer
from dataplane.agent.httpauth import Verifier
from dataplane.agent.pools import MemoryPools
from dataplane.agent.synthetic import SyntheticEngine, items_for_tokens
from dataplane.codec import encode_manifest, manifest_from_schema
from dataplane.config import AgentConfig, ModelConfig, TransferConfig
from dataplane.harness.agent_processes import AgentProcess, free_port, loopback_pair, with_pairing_key
from dataplane.harness.sidecar_pair import external
from dataplane.harness.waiting import wait_for
from dataplane.localapi import AgentClient, SharedPools
from dataplane.schema.profiles import schema_from_config

pytestmark = [pytest.mark.nixl, pytest.mark.slow]
SUCCESS, FAILED, WAITING = 4, 0, 2
TOKENS = 700
SLOTS = 8
"""``model.maxRequests``: rooms at once."""


class Engine:
    """One engine's side of the local API: its shared pools, the synthetic content, its client."""

    def __init__(self, cfg: AgentConfig):
        self.schema = schema_from_config(cfg)
        self.shared = SharedPools([(r.name, r.component, r.tensor, r.size) for r in self.schema.regions()])
        self.content = SyntheticEngine(MemoryPools.adopt(self.schema, self.shared.buffers))
        manifest = encode_manifest(manifest_from_schema(self.schema, role=cfg.role))
        self.client = AgentClient(cfg.localapi.engine.socket_path, role=cfg.role, manifest=manifest)
        self.asked: set[int] = set()

    def register(self) -> bool:
        try:
            self.client.connect()
            self.client.register_pools(self.shared.regions, self.shared.fds)
            return True
        except ConnectionError:
            return False

    def take_asked(self) -> set[int]:
        self.asked |= {st.room for st in self.client.take_incoming() if st.state == WAITING}
        return self.asked

    def close(self) -> None:
        self.client.close()
        del self.content
        self.shared.close()


def items(schema, i: int) -> tuple[np.ndarray, int, list[np.ndarray | None]]:
    """The items of slot ``i`` (one of ``SLOTS``, each used by one room at a time)."""
    i %= SLOTS
    counts = items_for_tokens(schema, TOKENS)
    kv = np.arange(i * counts.kv, (i + 1) * counts.kv, dtype=np.int32)
    return kv, i, [np.array([i], np.int32) if n else None for n in counts.state]


def stranger_bootstrap(tmp_path: Path, keyed: bool) -> AgentHttpServer:
    """A prefill bootstrap endpoint that is not this PDPair's: an agent's own HTTP server and registry
    (naming a control port nothing listens on), ``keyed`` with a pairing key of its own, else with
    none (it then answers every caller the full topology, proving no key)."""
    registry = BootstrapRegistry(RankInfo(0, "127.0.0.1", free_port(), "other", "prefill@other"), 1, "m", ())
    verifier = None
    if keyed:
        other = with_pairing_key(AgentConfig(), tmp_path / "other").auth.read_key()
        assert other is not None
        verifier = Verifier(other)
    return AgentHttpServer("127.0.0.1", 0, registry.routes(), "bootstrap", verifier).start()


def test_each_room_comes_from_the_prefill_its_bootstrap_address_names(tmp_path):
    base = AgentConfig(
        model=ModelConfig(profile="qwen3-next", pool_pages=128, max_requests=SLOTS),
        transfer=TransferConfig(timeout_seconds=15, heartbeat_interval_seconds=0.5),
    )
    (tmp_path / "other").mkdir()
    (pa,), (dc,) = loopback_pair(with_pairing_key(base, tmp_path))
    pb = msgspec.structs.replace(pa, listen=msgspec.structs.replace(pa.listen, bootstrap_port=free_port()))
    cfgs = {"prefill-a": pa, "prefill-b": pb, "decode": dc}
    cfgs = {tag: external(c, tmp_path / f"{tag}.sock") for tag, c in cfgs.items()}
    address = {tag: f"127.0.0.1:{cfgs[tag].listen.bootstrap_port}" for tag in ("prefill-a", "prefill-b")}
    agents = {tag: AgentProcess(c, tmp_path, tag) for tag, c in cfgs.items()}
    engines: dict[str, Engine] = {}
    strangers = [stranger_bootstrap(tmp_path, keyed) for keyed in (True, False)]
    try:
        for tag, cfg in cfgs.items():
            engines[tag] = Engine(cfg)
            wait_for(f"{tag} agent socket", engines[tag].register, timeout=30)
        for agent in agents.values():
            agent.wait_ready(60)
        decode = engines["decode"]

        # Rooms alternately name each prefill; each is asked of the prefill it names, then sent there.
        rooms = {100 + i: ("prefill-a", "prefill-b")[i % 2] for i in range(6)}
        for i, (room, tag) in enumerate(rooms.items()):
            decode.client.expect(room, *items(decode.schema, i), bootstrap_addr=address[tag])
            prefill = engines[tag]
            wait_for(f"room {room} at {tag}", lambda p=prefill, r=room: r in p.take_asked(), timeout=20)
            kv, aux, state = items(prefill.schema, i)
            prefill.content.fill(room, kv, aux, state)
            prefill.client.send(room, kv, aux, state)
        for i, (room, tag) in enumerate(rooms.items()):
            assert decode.client.wait(room, 20) == (SUCCESS, ""), f"room {room} from {tag}"
            assert engines[tag].client.wait(room, 10) == (SUCCESS, "")
            checks = decode.content.verify(room, *items(decode.schema, i))
            assert {c.component for c in checks} == {"kv", "aux", "mamba"}
            assert all(c.ok and c.bytes > 0 for c in checks), [(c.component, c.ok) for c in checks]
        for tag in ("prefill-a", "prefill-b"):
            mine = {r for r, t in rooms.items() if t == tag}
            assert engines[tag].take_asked() == mine, f"{tag} was asked for another prefill's rooms"

        # Rooms naming what is no PDPair prefill fail at once with the reason; the others go on.
        closed = f"127.0.0.1:{free_port()}"
        bad = {200: closed, 201: f"127.0.0.1:{strangers[0].port}", 202: "no such host!:80",
               203: f"127.0.0.1:{strangers[1].port}"}
        start = time.monotonic()
        for j, (room, addr) in enumerate(bad.items()):
            decode.client.expect(room, *items(decode.schema, 10 + j), bootstrap_addr=addr)
        got = {room: decode.client.wait(room, 10) for room in bad}
        assert time.monotonic() - start < 5, "a bad address waited for the room's deadline"
        assert got[200][0] == FAILED and f"prefill {closed} cannot be paired" in got[200][1], got[200]
        assert "Connection refused" in got[200][1], got[200]
        assert got[201][0] == FAILED and "answered 401" in got[201][1], got[201]
        assert "does not verify: sign with the PDPair's pairing key" in got[201][1], got[201]
        assert got[202][0] == FAILED and "bootstrap address 'no such host!:80'" in got[202][1], got[202]
        assert got[203][0] == FAILED and "does not prove the PDPair's pairing key" in got[203][1], got[203]

        # The decode agent still serves both prefills, and a room naming none goes to its own (a).
        for k, tag in enumerate(("prefill-b", "prefill-a", "")):
            room, i = 300 + k, 20 + k
            decode.client.expect(room, *items(decode.schema, i), bootstrap_addr=address.get(tag, ""))
            prefill = engines[tag or "prefill-a"]
            wait_for(f"room {room}", lambda p=prefill, r=room: r in p.take_asked(), timeout=20)
            kv, aux, state = items(prefill.schema, i)
            prefill.content.fill(room, kv, aux, state)
            prefill.client.send(room, kv, aux, state)
            assert decode.client.wait(room, 20) == (SUCCESS, ""), f"room {room} from {tag or 'its own'}"
            assert all(c.ok for c in decode.content.verify(room, *items(decode.schema, i)))
        pods = agents["decode"].status()["prefill_pods"]
        assert set(pods) == set(address.values()), pods
        assert all(p["ready"] for p in pods.values()), pods
    finally:
        for stranger in strangers:
            stranger.stop()
        for engine in engines.values():
            engine.close()
        for agent in agents.values():
            agent.stop()
