"""sglang 0.5.23 drives PDPair through the ``pdpair`` transfer backend plugin.

sglang's own ``load_plugins()`` finds the plugin by its entry point, its own ``get_kv_class`` hands out
the pdpair classes, and ``sglang_rank`` drives them as sglang's prefill and decode schedulers do. Per
role a real agent process (``pdpair-agent run``, sidecar mode, no model layout configured: it adopts the
schema sglang's pools describe), real NIXL between the agents, every byte verified per component for
the three model families, plus an abort mid-room (either side), a decode with a cached prefix, and an
agent restarted under a running engine.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("sglang.srt.disaggregation.base.conn")

from dataplane.config import AgentConfig, ModelConfig, TransferConfig
from dataplane.harness.sidecar_pair import SidecarPair
from dataplane.harness.waiting import wait_for
from tests.integration.sglang_rank import (
    FAMILIES,
    Rank,
    fill_source,
    move,
    move_tp,
    plan_room,
    untouched,
    verify,
    verify_tp,
)

pytestmark = [pytest.mark.nixl, pytest.mark.slow]
FAILED, SUCCESS = 0, 4


@pytest.fixture(scope="module")
def plugin():
    """sglang's plugin loading, as every sglang process runs it at start-up."""
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from dataplane.sglang import hooks

    hooks.force_host_arenas(True)  # no published server args in this process: act as --...-backend pdpair
    yield
    hooks.force_host_arenas(False)


def test_sglang_loads_the_plugin_by_its_entry_point(plugin):
    from sglang.srt.arg_groups.choices import DISAGG_TRANSFER_BACKEND_CHOICES
    from sglang.srt.disaggregation import decode, prefill, utils
    from sglang.srt.disaggregation.base.conn import KVArgs
    from sglang.srt.managers import disagg_service

    from dataplane.sglang import conn

    assert "pdpair" in DISAGG_TRANSFER_BACKEND_CHOICES
    # sglang's own command line (``launch_server``'s parser) takes the backend
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(["--model-path", "m", "--disaggregation-mode", "prefill",
                              "--disaggregation-transfer-backend", "pdpair"])
    assert (args.disaggregation_mode, args.disaggregation_transfer_backend) == ("prefill", "pdpair")
    backend = utils.TransferBackend("pdpair")
    # the modules that build the Enum from the argument hold the extended one too
    extended = utils.TransferBackend
    assert prefill.TransferBackend is decode.TransferBackend is disagg_service.TransferBackend is extended
    kinds = utils.KVClassType
    assert utils.get_kv_class(backend, kinds.KVARGS) is KVArgs
    assert utils.get_kv_class(backend, kinds.MANAGER) is conn.PDPairKVManager
    assert utils.get_kv_class(backend, kinds.SENDER) is conn.PDPairKVSender
    assert utils.get_kv_class(backend, kinds.RECEIVER) is conn.PDPairKVReceiver
    assert utils.get_kv_class(backend, kinds.BOOTSTRAP_SERVER) is conn.PDPairKVBootstrapServer
    # sglang's own backends are untouched
    from sglang.srt.disaggregation.fake import FakeKVSender

    assert utils.get_kv_class(utils.TransferBackend("fake"), kinds.SENDER) is FakeKVSender
    assert disagg_service.rust_server_serves_kv_bootstrap("pdpair") is False


def agents_config(timeout: float = 10.0) -> AgentConfig:
    return AgentConfig(
        model=ModelConfig(profile=None),
        transfer=TransferConfig(timeout_seconds=timeout, heartbeat_interval_seconds=0.5),
    )


def bootstrap_addr(pair: SidecarPair) -> str:
    """The prefill agent's bootstrap ``host:port``: what sglang's router hands decode for a request."""
    listen = pair.cfg["prefill"].listen
    return f"{listen.host}:{listen.bootstrap_port}"


class Pods:
    """A prefill and a decode pod: per role an agent process and an sglang rank in this process."""

    def __init__(self, tmp_path: Path, family: str):
        self.pair = SidecarPair(agents_config(), tmp_path)
        self.family = FAMILIES[family]
        self.ranks: dict[str, Rank] = {}

    def __enter__(self) -> Pods:
        for role in ("prefill", "decode"):
            self.start_agent(role)
        for role in ("prefill", "decode"):
            # the operator sets the socket on each engine container; sglang builds the manager after it
            os.environ["PDPAIR_AGENT_SOCKET"] = self.pair.cfg[role].localapi.engine.socket_path
            self.ranks[role] = Rank(role, self.family, bootstrap_addr=bootstrap_addr(self.pair))
        for agent in self.pair.agents.values():
            agent.wait_ready(60)
        return self

    def start_agent(self, role: str) -> None:
        sock = Path(self.pair.cfg[role].localapi.engine.socket_path)
        sock.unlink(missing_ok=True)
        self.pair.start_agent(role)
        wait_for(f"{role} agent socket", lambda: sock.exists(), timeout=30)

    def __exit__(self, *exc: object) -> None:
        for rank in self.ranks.values():
            rank.close()
        for agent in self.pair.agents.values():
            agent.stop()

    @property
    def prefill(self) -> Rank:
        return self.ranks["prefill"]

    @property
    def decode(self) -> Rank:
        return self.ranks["decode"]


@pytest.mark.parametrize(("family", "components"), [
    ("qwen3-next", {"kv", "aux", "mamba"}),
    ("deepseek-v3.2", {"kv", "aux", "dsa"}),
    ("gpt-oss", {"kv", "aux", "swa"}),
])
def test_sglang_rooms_move_every_byte_per_component(plugin, tmp_path, family, components):
    rng = np.random.default_rng(7)
    with Pods(tmp_path, family) as pods:
        rooms = [plan_room(pods.prefill, pods.decode, 1000 + i, tokens, rng)
                 for i, tokens in enumerate((37, 160, 1, 95))]
        for r in rooms:
            fill_source(pods.prefill, r, rng)
        result = move(pods.prefill, pods.decode, rooms)
        assert result == {r.room: (SUCCESS, "") for r in rooms}, result
        checked: dict[str, int] = {}
        for r in rooms:
            for name, n in verify(pods.prefill, pods.decode, r).items():
                checked[name] = checked.get(name, 0) + n
            assert r.prefill_state == SUCCESS
        assert set(checked) == components and all(checked.values()), checked
        assert untouched(pods.decode, rooms) == 0


@pytest.mark.parametrize("family", ["deepseek-v3.2", "gpt-oss"])
def test_decode_with_a_cached_prefix_receives_only_the_rest(plugin, tmp_path, family):
    """decode.py sends the pages after its cached prefix and ``decode_prefix_len``; prefill sends every
    page; the agent skips decode's prefix pages, the sender cuts DSA / SWA to decode's tail."""
    rng = np.random.default_rng(11)
    with Pods(tmp_path, family) as pods:
        page = pods.family.page_size
        rooms = [plan_room(pods.prefill, pods.decode, 2000 + i, tokens, rng, prefix_tokens=prefix)
                 for i, (tokens, prefix) in enumerate(((10 * page, 2 * page), (6 * page + 4, 5 * page)))]
        for r in rooms:
            fill_source(pods.prefill, r, rng)
        assert move(pods.prefill, pods.decode, rooms) == {r.room: (SUCCESS, "") for r in rooms}
        for r in rooms:
            verify(pods.prefill, pods.decode, r)  # includes: decode's prefix pages were not written


@pytest.mark.parametrize("side", ["decode", "prefill"])
def test_an_abort_mid_room_fails_it_on_both_sides_and_the_next_room_moves(plugin, tmp_path, side):
    rng = np.random.default_rng(3)
    with Pods(tmp_path, "qwen3-next") as pods:
        aborted, good = (plan_room(pods.prefill, pods.decode, room, 96, rng) for room in (3000, 3001))
        fill_source(pods.prefill, aborted, rng)
        fill_source(pods.prefill, good, rng)
        result = move(pods.prefill, pods.decode, [aborted, good], abort={aborted.room: side})
        state, reason = result[aborted.room]
        assert state == FAILED and "abort" in reason, result
        assert aborted.prefill_state == FAILED
        assert result[good.room] == (SUCCESS, "")
        verify(pods.prefill, pods.decode, good)
        assert untouched(pods.decode, [good, aborted]) == 0


@pytest.mark.parametrize("role", ["decode", "prefill"])
def test_an_agent_restarted_under_a_running_engine(plugin, tmp_path, role):
    """The engine keeps its manager; its rooms in flight fail with a clear reason while the agent is
    gone, and once it is back the client re-registers sglang's pools by itself and rooms move again."""
    rng = np.random.default_rng(5)
    with Pods(tmp_path, "gpt-oss") as pods:
        first = plan_room(pods.prefill, pods.decode, 4000, 64, rng)
        fill_source(pods.prefill, first, rng)
        assert move(pods.prefill, pods.decode, [first]) == {first.room: (SUCCESS, "")}
        pods.pair.agents[role].signal(signal.SIGKILL)
        pods.pair.agents[role].stop()
        lost = plan_room(pods.prefill, pods.decode, 4001, 64, rng)
        result = move(pods.prefill, pods.decode, [lost], timeout=15)
        assert result[lost.room][0] == FAILED, result
        pods.start_agent(role)
        client = pods.ranks[role].manager.client
        wait_for(f"{role} engine re-registered", lambda: _reconnected(client), timeout=30)
        for agent in pods.pair.agents.values():
            agent.wait_ready(60)
        time.sleep(1.0)  # decode re-pairs with the new prefill instance (heartbeat)
        again = plan_room(pods.prefill, pods.decode, 4002, 64, rng)
        fill_source(pods.prefill, again, rng)
        assert move(pods.prefill, pods.decode, [again], timeout=30) == {again.room: (SUCCESS, "")}
        verify(pods.prefill, pods.decode, again)


def _reconnected(client) -> bool:
    try:
        client.ensure_connected()
    except ConnectionError:
        return False
    return client.connections >= 2


@pytest.mark.parametrize(("engine", "line"), [
    ({"server_overrides": {"pp_size": 2}},
     r"^pdpair: the pdpair transfer backend does not support --pp-size > 1 .*; run with --pp-size 1$"),
    ({"tp_size": 2, "dp_size": 2}, r"^pdpair: .* DP attention on prefill; run prefill without"),
    ({"tp_size": 4, "server_overrides": {"tp_size": 3}}, r"^pdpair: --tp-size 3 is not a power of two"),
])
def test_what_the_backend_cannot_carry_is_refused_at_start_up_in_one_line(plugin, engine, line):
    """sglang's scheduler builds the manager at start-up: the refusal stops it there."""
    from dataplane.sglang.layout import Unsupported

    with pytest.raises(Unsupported, match=line):
        Rank("prefill", FAMILIES["gpt-oss"], **engine)


def test_prefill_tp2_to_decode_tp1_every_slice_lands(plugin, tmp_path):
    """One prefill agent serves both prefill scheduler ranks (two local API connections on one socket);
    decode's one rank receives each rank's slice: KV heads per token, GDN conv rows per sub-block,
    temporal heads."""
    import msgspec

    from dataplane.config import RoleConfig

    pair = SidecarPair(agents_config(), tmp_path)
    for table in (pair.cfg, pair.agent_cfg):
        table["prefill"] = msgspec.structs.replace(table["prefill"], prefill=RoleConfig(tp_size=2))
        table["decode"] = msgspec.structs.replace(table["decode"], prefill=RoleConfig(tp_size=2))
    fam, rng = FAMILIES["qwen3-next"], np.random.default_rng(9)
    ranks: list[Rank] = []
    try:
        for role in ("prefill", "decode"):
            pair.start_agent(role)
            sock = Path(pair.cfg[role].localapi.engine.socket_path)
            wait_for(f"{role} socket", lambda s=sock: s.exists(), timeout=30)
        os.environ["PDPAIR_AGENT_SOCKET"] = pair.cfg["prefill"].localapi.engine.socket_path
        prefills = [Rank("prefill", fam, tp_size=2, tp_rank=r) for r in (0, 1)]
        ranks += prefills
        os.environ["PDPAIR_AGENT_SOCKET"] = pair.cfg["decode"].localapi.engine.socket_path
        decode = Rank("decode", fam, bootstrap_addr=bootstrap_addr(pair))
        ranks.append(decode)
        for agent in pair.agents.values():
            agent.wait_ready(60)
        rooms = [plan_room(prefills[0], decode, 6000 + i, tokens, rng) for i, tokens in enumerate((50, 130))]
        for r in rooms:
            for p in prefills:
                fill_source(p, r, rng)
            for a, b in zip(prefills[0].aux_buffers(), prefills[1].aux_buffers(), strict=True):
                b[r.src_aux] = a[r.src_aux]  # every rank holds the same first token
        assert move_tp(prefills, decode, rooms) == {r.room: SUCCESS for r in rooms}
        for r in rooms:
            assert set(verify_tp(prefills, decode, r)) == {"kv", "mamba", "aux"}
    finally:
        for rank in ranks:
            rank.close()
        for agent in pair.agents.values():
            agent.stop()


def test_a_dp_attention_decode_rank_above_its_attention_tp_size_receives(plugin, tmp_path):
    """Decode with DP attention (tp 2, dp 2: attention TP 1): each scheduler rank is its own attention
    group; sglang registers engine rank 1 with attention-TP size 1, and rooms reach both ranks."""
    import msgspec

    from dataplane.config import RoleConfig

    pair = SidecarPair(agents_config(), tmp_path)
    for table in (pair.cfg, pair.agent_cfg):
        for role in ("prefill", "decode"):
            table[role] = msgspec.structs.replace(table[role], decode=RoleConfig(tp_size=2, dp_size=2))
    fam, rng = FAMILIES["gpt-oss"], np.random.default_rng(13)
    ranks: list[Rank] = []
    try:
        for role in ("prefill", "decode"):
            pair.start_agent(role)
            sock = Path(pair.cfg[role].localapi.engine.socket_path)
            wait_for(f"{role} socket", lambda s=sock: s.exists(), timeout=30)
        os.environ["PDPAIR_AGENT_SOCKET"] = pair.cfg["prefill"].localapi.engine.socket_path
        prefill = Rank("prefill", fam)
        ranks.append(prefill)
        os.environ["PDPAIR_AGENT_SOCKET"] = pair.cfg["decode"].localapi.engine.socket_path
        decodes = [Rank("decode", fam, tp_size=2, dp_size=2, tp_rank=r, bootstrap_addr=bootstrap_addr(pair))
                   for r in (0, 1)]
        ranks += decodes
        for agent in pair.agents.values():
            agent.wait_ready(60)
        for i, decode in enumerate(decodes):
            room = plan_room(prefill, decode, 7000 + i, 90, rng)
            fill_source(prefill, room, rng)
            assert move(prefill, decode, [room]) == {room.room: (SUCCESS, "")}, f"decode rank {i}"
            assert set(verify(prefill, decode, room)) == {"kv", "swa", "aux"}
    finally:
        for rank in ranks:
            rank.close()
        for agent in pair.agents.values():
            agent.stop()
