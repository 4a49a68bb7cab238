"""sglang's decode receives each request from the prefill its ``bootstrap_addr`` names, through the
``pdpair`` plugin: two prefill pods (an agent process and an sglang rank each), one decode pod, and
requests routed alternately to each prefill, as sglang-router in PD mode does. The receiver hands the
request's bootstrap address to the agent (``Expect.bootstrap_addr``); every byte lands verified, and
the other prefill never hears of the request.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("sglang.srt.disaggregation.base.conn")

from dataplane.harness.agent_processes import AgentProcess, free_port, loopback_pair, with_pairing_key
from dataplane.harness.sidecar_pair import external, no_layout
from dataplane.harness.waiting import wait_for
from tests.integration.sglang_rank import FAMILIES, Rank, fill_source, move, plan_room, verify
from tests.integration.test_sglang_backend import agents_config, plugin  # noqa: F401 - the fixture

pytestmark = [pytest.mark.nixl, pytest.mark.slow]
SUCCESS = 4


def test_each_sglang_request_comes_from_the_prefill_the_router_named(plugin, tmp_path: Path):  # noqa: F811
    (pa,), (dc,) = loopback_pair(with_pairing_key(agents_config(), tmp_path))
    pb = msgspec.structs.replace(pa, listen=msgspec.structs.replace(pa.listen, bootstrap_port=free_port()))
    cfgs = {tag: external(c, tmp_path / f"{tag}.sock") for tag, c in
            {"prefill-a": pa, "prefill-b": pb, "decode": dc}.items()}
    agents = {tag: AgentProcess(no_layout(c), tmp_path, tag) for tag, c in cfgs.items()}
    ranks: dict[str, Rank] = {}
    fam, rng = FAMILIES["gpt-oss"], np.random.default_rng(29)
    address = {tag: f"127.0.0.1:{cfgs[tag].listen.bootstrap_port}" for tag in ("prefill-a", "prefill-b")}
    try:
        for tag, cfg in cfgs.items():
            sock = Path(cfg.localapi.engine.socket_path)
            wait_for(f"{tag} socket", lambda s=sock: s.exists(), timeout=30)
            os.environ["PDPAIR_AGENT_SOCKET"] = str(sock)  # the operator sets it on each engine container
            ranks[tag] = Rank(cfg.role, fam, bootstrap_addr=address["prefill-a"])
        for agent in agents.values():
            agent.wait_ready(60)
        decode = ranks["decode"]
        for i, tokens in enumerate((40, 130, 7, 96)):
            tag, other = ("prefill-a", "prefill-b") if i % 2 == 0 else ("prefill-b", "prefill-a")
            decode.bootstrap_addr = address[tag]  # the router's pick for this request
            r = plan_room(ranks[tag], decode, 9000 + i, tokens, rng)
            fill_source(ranks[tag], r, rng)
            assert move(ranks[tag], decode, [r]) == {r.room: (SUCCESS, "")}, f"room {r.room} from {tag}"
            assert r.prefill_state == SUCCESS  # type: ignore[attr-defined]
            assert set(verify(ranks[tag], decode, r)) == {"kv", "aux", "swa"}
            assert ranks[other].manager.decode_asked(r.room) is None, f"{other} was asked for room {r.room}"
    finally:
        for rank in ranks.values():
            rank.close()
        for agent in agents.values():
            agent.stop()
